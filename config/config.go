// Package config reads stepserve's configuration into one typed, validated
// [Config]: defaults, then a YAML file (--config), then STEPSERVE_*
// environment variables, then command-line flags, each overriding the one
// before.
//
// A key's environment variable is STEPSERVE_ plus the key upper-cased with
// dots as underscores: server.addr is STEPSERVE_SERVER_ADDR. Its flag is the
// key itself: --server.addr.
//
// Only cmd/serve reads configuration; every other package is handed the
// values it needs.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/stepserve/stepserve/batching"
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
	Log             Log
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
	// MetricsAddr, when set, serves /metrics (and the health endpoints)
	// on a listener of its own, and /metrics no longer on Addr.
	MetricsAddr string
	// EnableModelControl turns on the repository API (load, unload).
	EnableModelControl bool
}

// Auth holds the bearer tokens; no token means no authentication.
type Auth struct {
	// InferenceTokens guard /v2/models/... (inference, metadata, stats).
	InferenceTokens []string
	// RepositoryTokens guard /v2/repository/...
	RepositoryTokens []string
}

// Engine chooses engines.
type Engine struct {
	Default  string // cpu | rbln
	Failover string // none | cpufallback
	// CPUThreads bounds the CPUs one CPU-engine step uses; 0 means every
	// CPU.
	CPUThreads int
}

// RBLN configures the NPU engine's device workers.
type RBLN struct {
	Python          string
	Devices         []string
	Env             map[string]string
	CompileCacheDir string
	StrictWarmup    bool
	StallTimeout    time.Duration
}

// Log configures the server log.
type Log struct {
	Level  slog.Level
	Format string // text | json
}

// ErrInvalid is wrapped by every validation error.
var ErrInvalid = errors.New("config: invalid value")

// key describes one configuration key: its default and the help text its
// flag shows.
type key struct {
	name, def, help string
}

var keys = []key{
	{"server.addr", ":8000", "listen address, host:port"},
	{"server.max_body_bytes", "64MiB", "largest request body accepted (bytes, or with a unit: 512KiB, 64MiB, 1GiB)"},
	{"server.shutdown_grace", "30s", "how long a shutdown waits for in-flight requests"},
	{"server.read_header_timeout", "10s", "how long a client may take to send request headers"},
	{"server.read_timeout", "60s", "how long a client may take to send a whole request, body included (slow bodies get 408)"},
	{"server.write_timeout", "120s", "how long writing a response may take, from the end of the request headers"},
	{"server.idle_timeout", "120s", "how long an idle keep-alive connection stays open"},
	{"server.max_header_bytes", "1MiB", "largest request header block (431 above it)"},
	{"server.max_request_elements", "16777216", "most tensor elements one request may declare across its inputs"},
	{"server.metrics_addr", "", "a separate listen address for /metrics and the health endpoints (empty: the main one)"},
	{"auth.inference.token", "", "bearer token required by /v2/models/... (empty: no authentication)"},
	{"auth.inference.token_file", "", "file of bearer tokens (one per line) for /v2/models/..."},
	{"auth.repository.token", "", "bearer token required by the repository API"},
	{"auth.repository.token_file", "", "file of bearer tokens (one per line) for the repository API"},
	{"server.enable_model_control", "false", "enable the repository API: load and unload models at run time"},
	{"batching.max_queue_delay", "0s", "default for models: how long the oldest queued request waits for a fuller batch"},
	{"batching.max_batch_elements", "0", "default for models: a batch takes no more requests once it holds this many input elements (0: only the largest bucket bounds it)"},
	{"batching.max_queue_size", "1024", "default for models: queued requests before new ones get 503"},
	{"batching.default_timeout", "0s", "default for models: how long a request may wait in the queue (0: no limit)"},
	{"batching.priority_levels", "1", "default for models: number of priority levels (1 is the highest)"},
	{"engine.default", "cpu", "engine for models whose model.yaml names none: cpu or rbln"},
	{"engine.failover", "none", "when an rbln worker is down: none (the model is not ready) or cpufallback (serve on the CPU engine)"},
	{"engine.cpu_threads", "0", "CPUs one CPU-engine step may use, by running groups of a batch's sequences side by side; 0: every CPU"},
	{"rbln.python", "/usr/bin/python3", "Python interpreter with torch (and torch_rbln) for the device workers"},
	{"rbln.devices", "0", "logical devices, one worker each, comma-separated RBLN_VISIBLE_DEVICES values"},
	{"rbln.env", "", "extra worker environment, KEY=VALUE pairs comma-separated (a map in the YAML file)"},
	{"rbln.compile_cache_dir", "", "torch.compile cache_dir for compiled step graphs"},
	{"rbln.strict_warmup", "false", "refuse readiness unless every bucket's second warm-up run is clean"},
	{"rbln.stall_timeout", "10s", "a worker that answers no ping for this long is killed and restarted"},
	{"model_repository", "./models", "directory of models (<name>/model.yaml + weights.safetensors)"},
	{"log.level", "info", "log level: debug, info, warn or error"},
	{"log.format", "text", "log format: text or json"},
}

// Keys lists every configuration key, in documentation order.
func Keys() []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.name
	}
	return out
}

// Load reads the configuration for a process started with args (without the
// program name). It returns [pflag.ErrHelp] when -h or --help was given,
// after printing the usage to the flag set's output.
func Load(args []string) (*Config, error) {
	fs := pflag.NewFlagSet("stepserve", pflag.ContinueOnError)
	file := fs.String("config", "", "YAML configuration file")
	v := viper.New()
	for _, k := range keys {
		if k.def == "true" || k.def == "false" {
			fs.Bool(k.name, k.def == "true", k.help) // --key alone means true
		} else {
			fs.String(k.name, k.def, k.help)
		}
		v.SetDefault(k.name, k.def)
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("config: unexpected argument %q; every setting is a --key=value flag", fs.Arg(0))
	}
	if err := v.BindPFlags(fs); err != nil {
		return nil, err
	}
	v.SetEnvPrefix("STEPSERVE")
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()

	if *file != "" {
		v.SetConfigFile(*file)
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("config: %s: %w", *file, err)
		}
		known := append(Keys(), "config")
		for _, k := range v.AllKeys() {
			if !slices.Contains(known, k) && !strings.HasPrefix(k, "rbln.env.") {
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

func parse(v *viper.Viper) (*Config, error) {
	c := &Config{}
	var err error
	get := func(name string) string { return strings.TrimSpace(v.GetString(name)) }

	c.Server.Addr = get("server.addr")
	if _, port, perr := net.SplitHostPort(c.Server.Addr); perr != nil || port == "" {
		return nil, invalid("server.addr", c.Server.Addr, "host:port, e.g. :8000 or 127.0.0.1:8000")
	}
	if c.Server.MaxBodyBytes, err = ParseBytes(get("server.max_body_bytes")); err != nil || c.Server.MaxBodyBytes < 1024 {
		return nil, invalid("server.max_body_bytes", get("server.max_body_bytes"), "a size of at least 1KiB: bytes, or with a unit (512KiB, 64MiB, 1GiB)")
	}
	if c.Server.ShutdownGrace, err = time.ParseDuration(get("server.shutdown_grace")); err != nil || c.Server.ShutdownGrace < 0 {
		return nil, invalid("server.shutdown_grace", get("server.shutdown_grace"), "a duration of 0 or more, e.g. 30s")
	}
	if c.Server.ReadHeaderTimeout, err = time.ParseDuration(get("server.read_header_timeout")); err != nil || c.Server.ReadHeaderTimeout <= 0 {
		return nil, invalid("server.read_header_timeout", get("server.read_header_timeout"), "a positive duration, e.g. 10s")
	}
	for _, d := range []struct {
		key string
		dst *time.Duration
	}{{"server.read_timeout", &c.Server.ReadTimeout}, {"server.write_timeout", &c.Server.WriteTimeout}, {"server.idle_timeout", &c.Server.IdleTimeout}} {
		if *d.dst, err = time.ParseDuration(get(d.key)); err != nil || *d.dst <= 0 {
			return nil, invalid(d.key, get(d.key), "a positive duration, e.g. 60s")
		}
	}
	if c.Server.MaxHeaderBytes, err = ParseBytes(get("server.max_header_bytes")); err != nil || c.Server.MaxHeaderBytes < 4096 || c.Server.MaxHeaderBytes > 1<<30 {
		return nil, invalid("server.max_header_bytes", get("server.max_header_bytes"), "a size from 4KiB to 1GiB")
	}
	if c.Server.MaxRequestElements, err = strconv.ParseInt(get("server.max_request_elements"), 10, 64); err != nil || c.Server.MaxRequestElements < 1 {
		return nil, invalid("server.max_request_elements", get("server.max_request_elements"), "a positive integer")
	}
	c.Server.MetricsAddr = get("server.metrics_addr")
	if c.Server.MetricsAddr != "" {
		if _, port, perr := net.SplitHostPort(c.Server.MetricsAddr); perr != nil || port == "" {
			return nil, invalid("server.metrics_addr", c.Server.MetricsAddr, "host:port, or empty to serve /metrics on server.addr")
		}
	}
	if c.Auth.InferenceTokens, err = tokens(get("auth.inference.token"), get("auth.inference.token_file")); err != nil {
		return nil, fmt.Errorf("%w: auth.inference: %v", ErrInvalid, err)
	}
	if c.Auth.RepositoryTokens, err = tokens(get("auth.repository.token"), get("auth.repository.token_file")); err != nil {
		return nil, fmt.Errorf("%w: auth.repository: %v", ErrInvalid, err)
	}
	if c.Server.EnableModelControl, err = strconv.ParseBool(get("server.enable_model_control")); err != nil {
		return nil, invalid("server.enable_model_control", get("server.enable_model_control"), "true or false")
	}
	for _, k := range []string{"batching.max_queue_delay", "batching.max_batch_elements", "batching.max_queue_size", "batching.default_timeout", "batching.priority_levels"} {
		if err := c.Batching.Set(k, get(k)); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	if err := c.Batching.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	c.Engine.Default = get("engine.default")
	if c.Engine.Default != "cpu" && c.Engine.Default != "rbln" {
		return nil, invalid("engine.default", c.Engine.Default, "cpu or rbln")
	}
	c.Engine.Failover = get("engine.failover")
	if c.Engine.Failover != "none" && c.Engine.Failover != "cpufallback" {
		return nil, invalid("engine.failover", c.Engine.Failover, "none or cpufallback")
	}
	if c.Engine.CPUThreads, err = strconv.Atoi(get("engine.cpu_threads")); err != nil || c.Engine.CPUThreads < 0 || c.Engine.CPUThreads > 1024 {
		return nil, invalid("engine.cpu_threads", get("engine.cpu_threads"), "an integer in 0..1024 (0: every CPU)")
	}
	c.RBLN.Python = get("rbln.python")
	if c.RBLN.Python == "" {
		return nil, invalid("rbln.python", "", "the path of a Python interpreter")
	}
	if c.RBLN.Devices, err = stringList(v.Get("rbln.devices")); err != nil || len(c.RBLN.Devices) == 0 {
		return nil, invalid("rbln.devices", fmt.Sprint(v.Get("rbln.devices")), "one or more devices, e.g. 0 or 0,1 (a list in YAML)")
	}
	if c.RBLN.Env, err = stringMap(v.Get("rbln.env")); err != nil {
		return nil, invalid("rbln.env", fmt.Sprint(v.Get("rbln.env")), "KEY=VALUE pairs, comma-separated (a map in YAML)")
	}
	c.RBLN.CompileCacheDir = get("rbln.compile_cache_dir")
	if c.RBLN.StrictWarmup, err = strconv.ParseBool(get("rbln.strict_warmup")); err != nil {
		return nil, invalid("rbln.strict_warmup", get("rbln.strict_warmup"), "true or false")
	}
	if c.RBLN.StallTimeout, err = time.ParseDuration(get("rbln.stall_timeout")); err != nil || c.RBLN.StallTimeout <= 0 {
		return nil, invalid("rbln.stall_timeout", get("rbln.stall_timeout"), "a positive duration, e.g. 10s")
	}
	c.ModelRepository = get("model_repository")
	if c.ModelRepository == "" {
		return nil, invalid("model_repository", "", "a directory of models")
	}
	if st, serr := os.Stat(c.ModelRepository); serr != nil || !st.IsDir() {
		return nil, invalid("model_repository", c.ModelRepository, "an existing directory of models (<name>/model.yaml)")
	}
	if err := c.Log.Level.UnmarshalText([]byte(get("log.level"))); err != nil {
		return nil, invalid("log.level", get("log.level"), "debug, info, warn or error")
	}
	c.Log.Format = get("log.format")
	if c.Log.Format != "text" && c.Log.Format != "json" {
		return nil, invalid("log.format", c.Log.Format, "text or json")
	}
	return c, nil
}

func invalid(key, value, want string) error {
	return fmt.Errorf("%w: %s: %q; want %s", ErrInvalid, key, value, want)
}

// minTokenLength keeps trivially guessable tokens out.
const minTokenLength = 16

// tokens reads the bearer tokens of one scope: the token key, and every
// non-empty, non-comment line of the token file.
func tokens(token, file string) ([]string, error) {
	var out []string
	if token != "" {
		out = append(out, token)
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("token_file: %w", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				out = append(out, line)
			}
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("token_file %s holds no token", file)
		}
	}
	for _, t := range out {
		if len(t) < minTokenLength || strings.ContainsAny(t, " \t") {
			return nil, fmt.Errorf("a token must be at least %d characters without spaces", minTokenLength)
		}
	}
	return out, nil
}

// stringList reads a list key: a YAML list, or a comma-separated string
// from the environment or a flag.
func stringList(v any) ([]string, error) {
	var out []string
	switch t := v.(type) {
	case []any:
		for _, x := range t {
			out = append(out, strings.TrimSpace(fmt.Sprint(x)))
		}
	case []string:
		out = t
	case string:
		for _, s := range strings.Split(t, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	case int:
		out = []string{strconv.Itoa(t)}
	default:
		return nil, fmt.Errorf("config: not a list: %v", v)
	}
	for _, s := range out {
		if s == "" {
			return nil, errors.New("config: empty list entry")
		}
	}
	return out, nil
}

// stringMap reads a map key: a YAML map, or KEY=VALUE pairs separated by
// commas from the environment or a flag.
func stringMap(v any) (map[string]string, error) {
	out := map[string]string{}
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			out[strings.ToUpper(k)] = fmt.Sprint(x)
		}
	case string:
		for _, kv := range strings.Split(t, ",") {
			if kv = strings.TrimSpace(kv); kv == "" {
				continue
			}
			k, val, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("config: %q is not KEY=VALUE", kv)
			}
			out[k] = val
		}
	case nil:
	default:
		return nil, fmt.Errorf("config: not a map: %v", v)
	}
	return out, nil
}

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30},
	{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000},
	{"B", 1},
}

// ParseBytes reads a size: a plain number of bytes, or a number with one of
// the units B, KB, MB, GB (powers of 1000) or KiB, MiB, GiB (powers of 1024).
func ParseBytes(s string) (int64, error) {
	num, mult := s, int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("config: %q is not a size", s)
	}
	return n * mult, nil
}
