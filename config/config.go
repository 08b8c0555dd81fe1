// Package config reads stepserve's configuration into one typed, validated
// [Config]: defaults, then a YAML file (--config), then STEPSERVE_*
// environment variables, then command-line flags, each overriding the one
// before.
//
// A key's environment variable is STEPSERVE_ plus the key upper-cased with
// dots as underscores: server.addr is STEPSERVE_SERVER_ADDR. Its flag is the
// key itself: --server.addr.
//
// Each key is one row of a table: its name, default, help text and how its
// value is read. config owns the keys and the syntax of their values; it
// does not own the rules of what it reads into other packages' types: the
// batching.* keys are a [batching.Policy], checked by its Validate.
//
// Only cmd/serve reads configuration; every other package is handed the
// values it needs.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/internal/suggest"
)

// Config is the server-wide configuration.
type Config struct {
	Server Server
	Auth   Auth
	// Batching is every model's batching policy, which a model's
	// model.yaml overrides key by key.
	Batching        batching.Policy
	Engine          Engine
	RBLN            RBLN
	ModelRepository string
	Models          Models
	Log             Log
	Trace           Trace
	// File is the configuration file read, or "" when none was.
	File string
}

// Server configures the HTTP listener.
type Server struct {
	Addr              string
	MaxBodyBytes      int64
	ShutdownGrace     time.Duration
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	MaxHeaderBytes    int64
	// MaxRequestElements bounds the tensor elements of one request.
	MaxRequestElements int64
	// MaxResponseBytes bounds the response one request may ask for.
	MaxResponseBytes int64
	// MaxSharedMemoryRegions and MaxSharedMemoryBytes bound Triton's
	// system shared memory: regions registered, and bytes mapped, at once.
	MaxSharedMemoryRegions int
	MaxSharedMemoryBytes   int64
	// SharedMemory turns Triton's system shared-memory extension on.
	SharedMemory bool
	// MaxInflightBytes bounds the memory all requests in flight may hold
	// together; 0 means half the memory limit the server finds.
	MaxInflightBytes int64
	// MetricsAddr, when set, serves /metrics (and the health endpoints)
	// on a listener of its own, and /metrics no longer on Addr.
	MetricsAddr string
	// VLLMMetrics exports the language models' series under vLLM's names
	// too (vllm:num_requests_waiting, ...), as Kubernetes' inference
	// gateway and vLLM's dashboards read them.
	VLLMMetrics bool
	// GRPCAddr, when set, serves the inference protocol over gRPC
	// (inference.GRPCInferenceService, and grpc.health.v1).
	GRPCAddr string
	// TLSCertFile and TLSKeyFile, when set (both), serve Addr and
	// GRPCAddr over TLS; the files are read again when they change.
	TLSCertFile, TLSKeyFile string
	// EnableModelControl turns on the repository API (load, unload).
	EnableModelControl bool
	// StrictReadiness: /v2/health/ready is 200 only when every model is
	// ready, a model that failed at start included; false: once the
	// server is up.
	StrictReadiness bool
	// MaxConnections bounds the open connections on Addr; 0 leaves the
	// bound to the descriptor limit (see server.ConnectionCap).
	MaxConnections int
}

// Auth holds the bearer tokens; no token means no authentication.
type Auth struct {
	// InferenceTokens guard /v2/models/... (inference, metadata, stats).
	InferenceTokens []string
	// RepositoryTokens guard /v2/repository/...
	RepositoryTokens []string
	// RepositoryAnonymous leaves the repository API open on purpose while
	// inference requires a token.
	RepositoryAnonymous bool

	// Where the tokens came from, for [Auth.Reload].
	inference, repository tokenSource
}

// Engine chooses engines.
type Engine struct {
	Default  string // cpu | torch | rbln
	Failover string // none | cpufallback | torch
	// CPUThreads bounds the CPUs one CPU-engine step uses; 0 means every
	// CPU.
	CPUThreads int
}

// RBLN configures the Python worker engines: rbln's device workers, and
// torch's worker on the host CPU.
type RBLN struct {
	Python string
	// Devices are the rbln engine's devices, one worker each; empty leaves
	// the choice to the engine (the server's RBLN_VISIBLE_DEVICES, else 0).
	Devices []string
	// TorchWorkers is the torch engine's worker count: devices cpu, or
	// cpu0.. with more than one, which model.yaml's instances may name.
	TorchWorkers int
	// NPUsPerDevice groups the pod's NPUs into RSD groups of this size
	// when Devices is empty.
	NPUsPerDevice   int
	Env             map[string]string
	CompileCacheDir string
	// TorchCompile is the torch engine's compiler: auto, inductor or off.
	TorchCompile   string
	StrictWarmup   bool
	StallTimeout   time.Duration
	CompileTimeout time.Duration
	// Profiler starts the workers with RBLN_PROFILER=1 (and
	// RBLN_PROFILER_DIR under the trace directory), so that torch.profiler
	// sees device activity on NPUs whose bridge records it.
	Profiler bool
}

// Trace configures where the trace extension writes its traces.
type Trace struct {
	// Dir holds the trace files; empty means stepserve-traces-<pid> under the
	// OS temp directory.
	Dir string
	// MaxFiles bounds the files kept, the oldest deleted first.
	MaxFiles int
	// MaxBytes bounds one file: events past it are dropped and counted.
	MaxBytes int64
}

// Models bounds what loading one model may take.
type Models struct {
	// MaxModelBytes refuses a model whose estimated memory is above it; 0
	// (auto) leaves the choice to the model set: half the memory limit.
	MaxModelBytes int64
	// LoadTimeout bounds one model's load.
	LoadTimeout time.Duration
	// ExitOnError stops the server at start when any model fails to load
	// or warm up, naming every one that failed; false serves the others.
	ExitOnError bool
}

// Log configures the server log.
type Log struct {
	Level  slog.Level
	Format string // text | json
	// Requests logs every inference request at info; otherwise they are
	// logged at debug.
	Requests bool
}

// ErrInvalid is wrapped by every validation error.
var ErrInvalid = errors.New("config: invalid value")

// ErrVersion is returned by Load for --version: the caller prints the
// version and exits.
var ErrVersion = errors.New("config: --version")

// Load reads the configuration for a process started with args (without the
// program name). It returns [pflag.ErrHelp] when -h or --help was given,
// after printing the usage to the flag set's output, and [ErrVersion] for
// --version (or a first argument "version").
func Load(args []string) (*Config, error) {
	fs := pflag.NewFlagSet("stepserve", pflag.ContinueOnError)
	file := fs.String("config", "", "YAML configuration file")
	showVersion := fs.Bool("version", false, "print the version and exit")
	v := viper.New()
	for _, k := range keys {
		fs.String(k.name, k.def, k.help)
		if k.def == "true" || k.def == "false" {
			// --key alone means true; --key=maybe reaches the key's own
			// check, which says what it wants.
			fs.Lookup(k.name).NoOptDefVal = "true"
		}
		v.SetDefault(k.name, k.def)
	}
	if len(args) > 0 && args[0] == "version" {
		return nil, ErrVersion
	}
	var usage strings.Builder
	fs.SetOutput(&usage)
	fs.Usage = func() { writeUsage(&usage) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprint(os.Stdout, usage.String())
			return nil, err
		}
		return nil, flagError(err, fs)
	}
	if *showVersion {
		return nil, ErrVersion
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("config: unexpected argument %q; every setting is a --key=value flag", fs.Arg(0))
	}
	if err := v.BindPFlags(fs); err != nil {
		return nil, err
	}
	if err := checkEnv(os.Environ()); err != nil {
		return nil, err
	}
	v.SetEnvPrefix("STEPSERVE")
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()

	if *file == "" {
		*file = os.Getenv("STEPSERVE_CONFIG")
	}
	if *file != "" {
		v.SetConfigFile(*file)
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("config: %s: %w", *file, err)
		}
		known := append(Keys(), "config", "version")
		for _, k := range v.AllKeys() {
			if !slices.Contains(known, k) && !strings.HasPrefix(k, "rbln.env.") {
				if near := suggest.Nearest(k, Keys()); near != "" {
					return nil, fmt.Errorf("%w: %s: unknown key %q; did you mean %q?", ErrInvalid, *file, k, near)
				}
				return nil, fmt.Errorf("%w: %s: unknown key %q; known keys: %s", ErrInvalid, *file, k, strings.Join(Keys(), ", "))
			}
		}
	}
	c, err := parse(v)
	if err != nil {
		return nil, err
	}
	c.File = *file
	return c, nil
}

// parse reads every key with its row's reader, then checks the rules that
// span keys.
func parse(v *viper.Viper) (*Config, error) {
	c := &Config{}
	for _, k := range keys {
		if k.read == nil {
			continue
		}
		if err := k.read(c, v, k.name); err != nil {
			return nil, err
		}
	}
	if err := c.Batching.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := c.Auth.check(c.Server.EnableModelControl); err != nil {
		return nil, err
	}
	if (c.Server.TLSCertFile == "") != (c.Server.TLSKeyFile == "") {
		return nil, fmt.Errorf("%w: server.tls_cert_file and server.tls_key_file go together: set both (TLS) or neither (plain HTTP)", ErrInvalid)
	}
	return c, nil
}
