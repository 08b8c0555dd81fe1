// --help, and the errors for an unknown environment variable or flag.

package config

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"

	"github.com/stepserve/stepserve/internal/suggest"
)

// writeUsage is --help: what stepserve is, where settings come from, every
// key with its type, default and environment variable, and examples.
func writeUsage(w io.Writer) {
	fmt.Fprint(w, `stepserve: an inference server for RBLN NPUs and the CPU, speaking the Open
Inference Protocol v2 (Triton's and KServe's REST and gRPC APIs, with binary
tensors). It serves every model directory of --model_repository.

Usage: stepserve [--key=value ...]    stepserve --version
       stepserve advise --model NAME [--url URL] [--max-buckets K]
                         (a running server's bucket advice for a model, with
                         the model.yaml block to paste; advise --help)

Settings come from defaults, then a YAML file (--config), then environment
variables, then flags; each overrides the one before. Every key below is a
flag (--server.addr), an environment variable (STEPSERVE_SERVER_ADDR: upper
case, dots as underscores) and a YAML key (server: {addr: ...}).

Flags:
  --config path
        YAML configuration file (env STEPSERVE_CONFIG)
  --version
        print the version and exit (also: stepserve version)
`)
	for _, k := range keys {
		fmt.Fprintf(w, "  --%s %s\n", k.name, k.kind.word)
		wrap(w, k.help, "        ", 80)
		fmt.Fprintf(w, "        default %s, env %s\n", quoteDefault(k.def), envName(k.name))
	}
	fmt.Fprint(w, `
Examples:
  stepserve --model_repository ./model_repository
  stepserve --model_repository /models --server.addr :8000 --engine.default rbln
  STEPSERVE_LOG_LEVEL=debug stepserve --config stepserve.yaml
`)
}

// wrap writes text in lines of at most width columns, each starting with
// indent.
func wrap(w io.Writer, text, indent string, width int) {
	line := indent
	for _, word := range strings.Fields(text) {
		if len(line) > len(indent) && len(line)+1+len(word) > width {
			fmt.Fprintln(w, line)
			line = indent
		}
		if len(line) > len(indent) {
			line += " "
		}
		line += word
	}
	fmt.Fprintln(w, line)
}

// checkEnv refuses a STEPSERVE_ variable that names no key, with the
// nearest key's variable: a misspelt variable would otherwise be ignored.
// The worker's and the tests' own variables (STEPSERVE_WORKER_...,
// STEPSERVE_FAKE_..., STEPSERVE_SOAK) pass, and STEPSERVE_CPU_KERNELS (the
// CPU engine's kernel set, forced for measuring).
func checkEnv(environ []string) error {
	known := map[string]bool{"STEPSERVE_CONFIG": true}
	var names []string
	for _, k := range keys {
		env := envName(k.name)
		known[env] = true
		names = append(names, env)
	}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "STEPSERVE_") || known[name] || strings.HasPrefix(name, "STEPSERVE_WORKER_") ||
			strings.HasPrefix(name, "STEPSERVE_FAKE_") || name == "STEPSERVE_SOAK" || name == "STEPSERVE_CPU_KERNELS" {
			continue
		}
		if best := suggest.Nearest(name, names); best != "" {
			return fmt.Errorf("config: environment variable %s names no setting; did you mean %s?", name, best)
		}
		return fmt.Errorf("config: environment variable %s names no setting (stepserve --help lists them)", name)
	}
	return nil
}

// flagError is a flag parse error with a suggestion: the known flag
// nearest an unknown one, and where the flags are listed.
func flagError(err error, fs *pflag.FlagSet) error {
	msg := err.Error()
	name, ok := strings.CutPrefix(msg, "unknown flag: --")
	if !ok {
		return fmt.Errorf("config: %s (stepserve --help lists the flags)", msg)
	}
	name, _, _ = strings.Cut(name, "=")
	var flags []string
	fs.VisitAll(func(f *pflag.Flag) { flags = append(flags, f.Name) })
	if best := suggest.Nearest(name, flags); best != "" {
		return fmt.Errorf("config: unknown flag --%s; did you mean --%s? (stepserve --help lists the flags)", name, best)
	}
	return fmt.Errorf("config: unknown flag --%s (stepserve --help lists the flags)", name)
}
