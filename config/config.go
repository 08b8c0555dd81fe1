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
	"cmp"
	"errors"
	"fmt"
	"io"
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
	"github.com/stepserve/stepserve/internal/npugroup"
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
	// GRPCAddr, when set, serves the inference protocol over gRPC
	// (inference.GRPCInferenceService, and grpc.health.v1).
	GRPCAddr string
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

// tokenSource is one scope's token key and token file.
type tokenSource struct{ scope, token, file string }

// Reload re-reads the token files, for a rotation without a restart. The
// token keys keep the values they were started with. On error the tokens
// in force should stay: the error names the file, never a token.
func (a Auth) Reload() (Auth, error) {
	var err error
	if a.InferenceTokens, err = a.inference.read(); err != nil {
		return a, err
	}
	if a.RepositoryTokens, err = a.repository.read(); err != nil {
		return a, err
	}
	return a, nil
}

func (s tokenSource) read() ([]string, error) {
	t, err := tokens(s.token, s.file)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, s.scope, err)
	}
	return t, nil
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

// key describes one configuration key: its default, the help text its flag
// shows, and how its value is read into a [Config]. Adding a key is adding
// a row.
type key struct {
	name, def, help string
	// read is nil for a key another key's read takes in (a token is read
	// with its token_file).
	read reader
	// kind is the value's type, for --help and the chart's schema.
	kind kind
}

// A reader parses one key's value, as v holds it, into c. Its error names
// the key, the value and what is accepted, and wraps [ErrInvalid].
type reader func(c *Config, v *viper.Viper, key string) error

// defaultPolicy gives the batching.* keys their defaults: batching owns
// them.
var defaultPolicy = batching.Policy{}.WithDefaults()

var keys = []key{
	{"server.addr", ":8000", "listen address, host:port",
		value(func(c *Config) *string { return &c.Server.Addr }, asString, isHostPort, "host:port, e.g. :8000 or 127.0.0.1:8000"), addrKind(false)},
	{"server.max_body_bytes", "64MiB", "largest request body accepted (bytes, or with a unit: 512KiB, 64MiB, 1GiB)",
		value(func(c *Config) *int64 { return &c.Server.MaxBodyBytes }, ParseBytes, atLeast[int64](1024), "a size of at least 1KiB: bytes, or with a unit (512KiB, 64MiB, 1GiB)"), sizeKind(1024, false)},
	{"server.shutdown_grace", "30s", "how long a shutdown waits for in-flight requests",
		value(func(c *Config) *time.Duration { return &c.Server.ShutdownGrace }, time.ParseDuration, atLeast[time.Duration](0), "a duration of 0 or more, e.g. 30s"), durationKind(true)},
	{"server.read_header_timeout", "10s", "how long a client may take to send request headers",
		value(func(c *Config) *time.Duration { return &c.Server.ReadHeaderTimeout }, time.ParseDuration, positive, "a positive duration, e.g. 10s"), durationKind(false)},
	{"server.read_timeout", "60s", "how long a client may take to send a whole request, body included (slow bodies get 408; a gRPC message, DEADLINE_EXCEEDED)",
		value(func(c *Config) *time.Duration { return &c.Server.ReadTimeout }, time.ParseDuration, positive, "a positive duration, e.g. 60s"), durationKind(false)},
	{"server.write_timeout", "120s", "how long writing a response may take, from the end of the request headers",
		value(func(c *Config) *time.Duration { return &c.Server.WriteTimeout }, time.ParseDuration, positive, "a positive duration, e.g. 60s"), durationKind(false)},
	{"server.idle_timeout", "120s", "how long an idle keep-alive connection (or a gRPC connection with no call in progress, or a ModelStreamInfer stream with no request in progress) stays open",
		value(func(c *Config) *time.Duration { return &c.Server.IdleTimeout }, time.ParseDuration, positive, "a positive duration, e.g. 60s"), durationKind(false)},
	{"server.max_header_bytes", "1MiB", "largest request header block (431 above it)",
		value(func(c *Config) *int64 { return &c.Server.MaxHeaderBytes }, ParseBytes, between[int64](4096, 1<<30), "a size from 4KiB to 1GiB"), sizeKind(4096, false)},
	{"server.max_request_elements", "16777216", "most tensor elements one request may declare across its inputs",
		value(func(c *Config) *int64 { return &c.Server.MaxRequestElements }, parseInt64, atLeast[int64](1), "a positive integer"), intKind(1, 0)},
	{"server.max_connections", "0", "most open connections on server.addr and server.grpc_addr together: the longest-idle one is closed to make room, and with none idle a new one gets 503 (gRPC: is closed) (0: the descriptor limit less a reserve)",
		value(func(c *Config) *int { return &c.Server.MaxConnections }, strconv.Atoi, between(0, 1<<24), "an integer in 0..16777216 (0: from the descriptor limit)"), intKind(0, 1<<24)},
	{"server.max_response_bytes", "64MiB", "largest response one request may ask for, bounded from its shapes before it runs (413 above it)",
		value(func(c *Config) *int64 { return &c.Server.MaxResponseBytes }, ParseBytes, atLeast[int64](1024), "a size of at least 1KiB: bytes, or with a unit (512KiB, 64MiB, 1GiB)"), sizeKind(1024, false)},
	{"server.shared_memory.enabled", "true", "serve Triton's system shared-memory extension (a same-host client registers a /dev/shm object and tensors are read from and written to it); false: registration answers 501 (gRPC UNIMPLEMENTED) and GET /v2 does not list the extension",
		value(func(c *Config) *bool { return &c.Server.SharedMemory }, strconv.ParseBool, anything, "true or false"), boolKind},
	{"server.shared_memory.max_regions", "64", "most system shared-memory regions registered at once (Triton's shared-memory extension); a registration past it is refused with 400",
		value(func(c *Config) *int { return &c.Server.MaxSharedMemoryRegions }, strconv.Atoi, between(1, 4096), "an integer in 1..4096"), intKind(1, 4096)},
	{"server.shared_memory.max_bytes", "16GiB", "most bytes of registered system shared-memory regions mapped at once; under RLIMIT_AS, at most a quarter of the address space the limit leaves (the heap's plan is half of it); a registration past it is refused with 400",
		value(func(c *Config) *int64 { return &c.Server.MaxSharedMemoryBytes }, ParseBytes, atLeast[int64](1<<20), "a size of at least 1MiB: bytes, or with a unit (1GiB, 16GiB)"), sizeKind(1<<20, false)},
	{"server.max_inflight_bytes", "0", "memory all requests in flight may hold together: bodies, tensors, outputs and responses not yet written (503 when spent); 0: half the memory limit (cgroup, RLIMIT_AS or RAM)",
		value(func(c *Config) *int64 { return &c.Server.MaxInflightBytes }, ParseBytes, func(n int64) bool { return n == 0 || n >= 1<<20 }, "0 (half the memory limit) or a size of at least 1MiB: bytes, or with a unit (512MiB, 4GiB)"), sizeKind(1<<20, true)},
	{"server.metrics_addr", "", "a separate listen address for /metrics and the health endpoints (empty: the main one)",
		value(func(c *Config) *string { return &c.Server.MetricsAddr }, asString, func(s string) bool { return s == "" || isHostPort(s) }, "host:port, or empty to serve /metrics on server.addr"), addrKind(true)},
	{"server.grpc_addr", ":8001", "listen address of the gRPC API (Triton's and KServe's inference.GRPCInferenceService, and grpc.health.v1); empty: no gRPC",
		value(func(c *Config) *string { return &c.Server.GRPCAddr }, asString, func(s string) bool { return s == "" || isHostPort(s) }, "host:port, e.g. :8001, or empty to serve no gRPC"), addrKind(true)},
	{"auth.inference.token", "", "bearer token required by /v2/models/... (empty: no authentication)", nil, stringKind("token", 0)},
	{"auth.inference.token_file", "", "file of bearer tokens (one per line) for /v2/models/...; re-read on SIGHUP",
		tokensOf("auth.inference", func(c *Config) (*[]string, *tokenSource) { return &c.Auth.InferenceTokens, &c.Auth.inference }), stringKind("path", 0)},
	{"auth.repository.token", "", "bearer token required by the repository API", nil, stringKind("token", 0)},
	{"auth.repository.token_file", "", "file of bearer tokens (one per line) for the repository API; re-read on SIGHUP",
		tokensOf("auth.repository", func(c *Config) (*[]string, *tokenSource) { return &c.Auth.RepositoryTokens, &c.Auth.repository }), stringKind("path", 0)},
	{"auth.repository.allow_anonymous", "false", "with an inference token, leave the repository API (with model control on) and the administrator's endpoints (logging, trace) without a token on purpose",
		value(func(c *Config) *bool { return &c.Auth.RepositoryAnonymous }, strconv.ParseBool, anything, "true or false"), boolKind},
	{"server.enable_model_control", "false", "enable the repository API: load and unload models at run time",
		value(func(c *Config) *bool { return &c.Server.EnableModelControl }, strconv.ParseBool, anything, "true or false"), boolKind},
	{"server.strict_readiness", "true", "/v2/health/ready (and gRPC ServerReady) answer ready only when every model is ready, one that failed at start included (Triton's --strict-readiness); false: ready once the server is up, whatever its models",
		value(func(c *Config) *bool { return &c.Server.StrictReadiness }, strconv.ParseBool, anything, "true or false"), boolKind},
	{"batching.max_queue_delay", defaultPolicy.MaxQueueDelay.String(), "default for models: how long the oldest queued request waits for a fuller batch", policyKey, durationKind(true)},
	{"batching.max_batch_elements", strconv.Itoa(defaultPolicy.MaxBatchElements), "default for models: a batch takes no more requests once it holds this many input elements (0: only the largest bucket bounds it)", policyKey, intKind(0, 0)},
	{"batching.max_queue_size", strconv.Itoa(defaultPolicy.MaxQueueSize), "default for models: queued requests before new ones get 503", policyKey, intKind(1, 0)},
	{"batching.default_timeout", defaultPolicy.DefaultTimeout.String(), "default for models: how long a request may wait in the queue (0: no limit)", policyKey, durationKind(true)},
	{"batching.priority_levels", strconv.Itoa(defaultPolicy.PriorityLevels), "default for models: number of priority levels (1 is the highest)", policyKey, intKind(1, batching.MaxPriorityLevels)},
	{"engine.default", "cpu", "engine for models whose model.yaml names none: cpu (Go, in process), torch (the Python worker on the host CPU) or rbln (the Python worker on an RBLN NPU)",
		oneOf(func(c *Config) *string { return &c.Engine.Default }, "cpu", "torch", "rbln"), enumKind("cpu", "torch", "rbln")},
	{"engine.failover", "none", "when a worker is down: none (the model is not ready), cpufallback (serve on the CPU engine) or torch (serve on the torch engine)",
		oneOf(func(c *Config) *string { return &c.Engine.Failover }, "none", "cpufallback", "torch"), enumKind("none", "cpufallback", "torch")},
	{"engine.cpu_threads", "0", "CPUs one CPU-engine step may use, by running groups of a batch's sequences side by side; 0: every CPU",
		value(func(c *Config) *int { return &c.Engine.CPUThreads }, strconv.Atoi, between(0, 1024), "an integer in 0..1024 (0: every CPU)"), intKind(0, 1024)},
	{"rbln.python", "/usr/bin/python3", "Python interpreter with torch (and torch_rbln) for the device workers",
		value(func(c *Config) *string { return &c.RBLN.Python }, asString, nonEmpty, "the path of a Python interpreter"), stringKind("path", 1)},
	{"rbln.devices", "", "the rbln engine's logical devices, one worker each: NPUs (0,1 is two devices) or RSD groups of NPUs that form one logical device ([0,1],[2,3] is two devices of two NPUs; a list of lists in YAML); empty: the server's RBLN_VISIBLE_DEVICES (or RBLN_DEVICES), grouped by rbln.npus_per_device, else 0",
		deviceList(func(c *Config) *[]string { return &c.RBLN.Devices }, "one or more devices or groups, e.g. 0, 0,1 or [0,1],[2,3] (lists, or lists of lists, in YAML), or empty for the server's RBLN_VISIBLE_DEVICES"), deviceKind},
	{"rbln.npus_per_device", "1", "with rbln.devices empty, NPUs per logical device (an RSD group) over the pod's visible NPUs, in order: 2 makes [0,1],[2,3] of four; NPUs left over are not used",
		value(func(c *Config) *int { return &c.RBLN.NPUsPerDevice }, strconv.Atoi, func(n int) bool { return n >= 1 && n <= 32 && n&(n-1) == 0 }, "1, 2, 4, 8, 16 or 32"), powerOfTwoKind(32)},
	{"rbln.torch_workers", "1", "the torch engine's workers (Python processes on the host CPU): 1 is device cpu; more are devices cpu0, cpu1, ..., which a model's instances may name (devices: all loads it on each)",
		value(func(c *Config) *int { return &c.RBLN.TorchWorkers }, strconv.Atoi, between(1, 64), "an integer in 1..64"), intKind(1, 64)},
	{"rbln.env", "", "extra worker environment, KEY=VALUE pairs comma-separated (a map in the YAML file)",
		mapOf(func(c *Config) *map[string]string { return &c.RBLN.Env }, "KEY=VALUE pairs, comma-separated (a map in YAML)"), mapKind},
	{"rbln.compile_cache_dir", "", "torch.compile cache_dir for compiled step graphs",
		value(func(c *Config) *string { return &c.RBLN.CompileCacheDir }, asString, anything, ""), stringKind("path", 0)},
	{"rbln.torch_compile", "auto", "how the torch engine builds each bucket's step: auto (torch.compile with inductor where the worker's torch has it, 2.x, and inductor compiles on the host; else eager, the log saying why), inductor (refuse to load without it) or off (eager); the rbln engine always compiles with backend rbln",
		oneOf(func(c *Config) *string { return &c.RBLN.TorchCompile }, "auto", "inductor", "off"), enumKind("auto", "inductor", "off")},
	{"rbln.strict_warmup", "true", "refuse readiness unless every bucket's second warm-up run is clean, and refuse a bucket whose step graph breaks or fails to compile (naming the line or the error) or, on the rbln engine, that the step audit finds against the step structure (false: log it and serve, eagerly where it did not compile)",
		value(func(c *Config) *bool { return &c.RBLN.StrictWarmup }, strconv.ParseBool, anything, "true or false"), boolKind},
	{"rbln.stall_timeout", "10s", "a worker that answers no ping for this long, while it builds no graph, is killed and restarted",
		value(func(c *Config) *time.Duration { return &c.RBLN.StallTimeout }, time.ParseDuration, positive, "a positive duration, e.g. 10s"), durationKind(false)},
	{"rbln.compile_timeout", "30m", "one graph build (a load, a compile, a bucket's first step) running longer kills the worker; while it builds, pings go unanswered and the process is watched instead",
		value(func(c *Config) *time.Duration { return &c.RBLN.CompileTimeout }, time.ParseDuration, positive, "a positive duration, e.g. 30m"), durationKind(false)},
	{"rbln.profiler", "false", "start the workers with RBLN_PROFILER=1 and RBLN_PROFILER_DIR under trace.dir, so that PROFILE traces show device activity where torch_rbln's profiler bridge records it (Rebel100)",
		value(func(c *Config) *bool { return &c.RBLN.Profiler }, strconv.ParseBool, anything, "true or false"), boolKind},
	{"model_repository", "./model_repository", "directory of models (<name>/model.yaml + weights.safetensors)", modelRepository, stringKind("path", 1)},
	{"models.max_model_bytes", "auto", "host memory all served models may hold together, each estimated from its files (weights, staging, the CPU engine's buffers for every bucket) before it loads; auto: half the memory limit (cgroup memory.max, RLIMIT_AS or physical memory)",
		value(func(c *Config) *int64 { return &c.Models.MaxModelBytes }, parseAutoBytes, func(n int64) bool { return n == 0 || n >= 1<<20 }, "auto, or a size of at least 1MiB (64MiB, 4GiB)"), autoSizeKind(1 << 20)},
	{"models.load_timeout", "10m", "how long one model's load (reading, loading, warm-up) may take before it fails",
		value(func(c *Config) *time.Duration { return &c.Models.LoadTimeout }, time.ParseDuration, positive, "a positive duration, e.g. 10m"), durationKind(false)},
	{"models.exit_on_error", "true", "at start, stop when any model fails to load or warm up, naming every one that failed (Triton's --exit-on-error); false: serve the models that loaded, the repository index listing the others UNAVAILABLE with their reasons",
		value(func(c *Config) *bool { return &c.Models.ExitOnError }, strconv.ParseBool, anything, "true or false"), boolKind},
	{"log.level", "info", "log level: debug, info, warn or error",
		value(func(c *Config) *slog.Level { return &c.Log.Level }, parseLevel, anything, "debug, info, warn or error"), levelKind},
	{"log.format", "text", "log format: text or json",
		oneOf(func(c *Config) *string { return &c.Log.Format }, "text", "json"), enumKind("text", "json")},
	{"log.requests", "false", "log every inference request at info (method, path, model, status, rows, bytes, time, request id); otherwise at debug",
		value(func(c *Config) *bool { return &c.Log.Requests }, strconv.ParseBool, anything, "true or false"), boolKind},
	{"trace.dir", "", "directory of the trace files the trace extension writes (/v2/trace/setting; listed at /v2/trace/files); empty: stepserve-traces-<pid> under the OS temp directory, this process's own",
		value(func(c *Config) *string { return &c.Trace.Dir }, asString, anything, ""), stringKind("path", 0)},
	{"trace.max_files", "32", "most trace files kept in trace.dir; the oldest is deleted first",
		value(func(c *Config) *int { return &c.Trace.MaxFiles }, strconv.Atoi, between(1, 10000), "an integer in 1..10000"), intKind(1, 10000)},
	{"trace.max_bytes", "16MiB", "largest trace file; events past it are dropped and counted in the file's otherData",
		value(func(c *Config) *int64 { return &c.Trace.MaxBytes }, ParseBytes, between[int64](64<<10, 1<<30), "a size from 64KiB to 1GiB"), sizeKind(64<<10, false)},
}

// Keys lists every configuration key, in documentation order.
func Keys() []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.name
	}
	return out
}

// ErrVersion is returned by Load for --version: the caller prints the
// version and exits.
var ErrVersion = errors.New("config: --version")

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
	return c, nil
}

// check refuses a repository API left without a token by oversight: with
// model control on, a token on inference says the server is not meant to be
// open, and load and unload are the more dangerous of the two.
func (a Auth) check(modelControl bool) error {
	switch {
	case len(a.RepositoryTokens) > 0 && a.RepositoryAnonymous:
		return fmt.Errorf("%w: auth.repository.allow_anonymous is true but auth.repository.token or auth.repository.token_file sets a token; choose one", ErrInvalid)
	case modelControl && len(a.InferenceTokens) > 0 && len(a.RepositoryTokens) == 0 && !a.RepositoryAnonymous:
		return fmt.Errorf("%w: server.enable_model_control is on and auth.inference.token (or token_file) guards inference, "+
			"but the repository API, which loads and unloads models, has no token: set auth.repository.token or auth.repository.token_file, "+
			"or auth.repository.allow_anonymous: true to leave it open on purpose", ErrInvalid)
	}
	return nil
}

// text is a key's value as a string, trimmed.
func text(v *viper.Viper, key string) string { return strings.TrimSpace(v.GetString(key)) }

// value reads a key with parse and keeps the result if ok accepts it; want
// says what is accepted.
func value[T any](field func(*Config) *T, parse func(string) (T, error), ok func(T) bool, want string) reader {
	return func(c *Config, v *viper.Viper, key string) error {
		if !scalar(v.Get(key)) {
			return invalid(key, fmt.Sprint(v.Get(key)), want)
		}
		s := text(v, key)
		x, err := parse(s)
		if err != nil || !ok(x) {
			return invalid(key, s, want)
		}
		*field(c) = x
		return nil
	}
}

// scalar reports whether x is one value (text, a number, a boolean), not a
// list or a map, which would otherwise read as "".
func scalar(x any) bool {
	switch x.(type) {
	case []any, []string, map[string]any:
		return false
	}
	return true
}

// oneOf reads a key that takes one of a few words.
func oneOf(field func(*Config) *string, allowed ...string) reader {
	return value(field, asString, func(s string) bool { return slices.Contains(allowed, s) }, strings.Join(allowed, " or "))
}

// policyKey reads a batching.* key; its range is checked with the whole
// policy, in parse.
func policyKey(c *Config, v *viper.Viper, key string) error {
	if err := c.Batching.Set(key, text(v, key)); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// tokensOf reads a scope's bearer tokens: its token key and its token_file,
// the key read.
func tokensOf(scope string, field func(*Config) (*[]string, *tokenSource)) reader {
	return func(c *Config, v *viper.Viper, key string) error {
		list, src := field(c)
		*src = tokenSource{scope: scope, token: text(v, scope+".token"), file: text(v, key)}
		t, err := src.read()
		*list = t
		return err
	}
}

// deviceList reads rbln.devices: NPUs and RSD groups (npugroup).
func deviceList(field func(*Config) *[]string, want string) reader {
	return func(c *Config, v *viper.Viper, key string) error {
		var l []string
		var err error
		switch x := v.Get(key).(type) {
		case string:
			if l, err = npugroup.Parse(x); err == nil && len(l) == 0 && strings.TrimSpace(x) != "" {
				err = fmt.Errorf("no device named")
			}
		case []any:
			for _, e := range x {
				var d string
				if d, err = npugroup.Entry(e); err != nil || d == "" {
					break
				}
				l = append(l, d)
			}
		case []string:
			for _, e := range x {
				var d string
				if d, err = npugroup.Entry(e); err != nil || d == "" {
					break
				}
				l = append(l, d)
			}
		case int:
			var d string
			if d, err = npugroup.Entry(x); err == nil {
				l = []string{d}
			}
		default:
			err = fmt.Errorf("not a list")
		}
		if err == nil {
			err = npugroup.Distinct(l)
		}
		if err != nil {
			return invalid(key, fmt.Sprint(v.Get(key)), want+" ("+err.Error()+")")
		}
		*field(c) = l
		return nil
	}
}

// mapOf reads a map key.
func mapOf(field func(*Config) *map[string]string, want string) reader {
	return func(c *Config, v *viper.Viper, key string) error {
		m, err := stringMap(v.Get(key))
		if err != nil {
			return invalid(key, fmt.Sprint(v.Get(key)), want)
		}
		*field(c) = m
		return nil
	}
}

func modelRepository(c *Config, v *viper.Viper, key string) error {
	dir := text(v, key)
	if dir == "" {
		return invalid(key, "", "a directory of models")
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return invalid(key, dir, "an existing directory of models (<name>/model.yaml, or a Hugging Face folder <name>/config.json)")
	}
	c.ModelRepository = dir
	return nil
}

func asString(s string) (string, error) { return s, nil }

func parseInt64(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }

// parseAutoBytes reads a size, or auto (0).
func parseAutoBytes(s string) (int64, error) {
	if s == "auto" {
		return 0, nil
	}
	return ParseBytes(s)
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

// isHostPort accepts a listen address: an optional host, and a port
// number (0 to 65535) or a service name.
func isHostPort(s string) bool {
	_, port, err := net.SplitHostPort(s)
	if err != nil || port == "" {
		return false
	}
	if n, err := strconv.Atoi(port); err == nil {
		return n >= 0 && n <= 65535
	}
	_, err = net.LookupPort("tcp", port)
	return err == nil
}

func anything[T any](T) bool { return true }

func nonEmpty(s string) bool { return s != "" }

func positive[T cmp.Ordered](x T) bool {
	var zero T
	return x > zero
}

func atLeast[T cmp.Ordered](lo T) func(T) bool { return func(x T) bool { return x >= lo } }

func between[T cmp.Ordered](lo, hi T) func(T) bool {
	return func(x T) bool { return x >= lo && x <= hi }
}

func invalid(key, value, want string) error {
	return fmt.Errorf("%w: %s: %q; want %s", ErrInvalid, key, value, want)
}

// tokens reads the bearer tokens of one scope: the token key, and every
// non-empty, non-comment line of the token file. An error says where a bad
// token is, never what it is.
func tokens(token, file string) ([]string, error) {
	var out []string
	if token != "" {
		if !goodToken(token) {
			return nil, fmt.Errorf("token: %s", weakToken)
		}
		out = append(out, token)
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("token_file: %w", err)
		}
		n := len(out)
		for i, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if !goodToken(line) {
				return nil, fmt.Errorf("token_file %s, line %d: %s", file, i+1, weakToken)
			}
			out = append(out, line)
		}
		if len(out) == n {
			return nil, fmt.Errorf("token_file %s holds no token", file)
		}
	}
	return out, nil
}

// weakToken is what a token must be: long enough (16 characters) that it is
// not guessed.
const weakToken = "a token must be at least 16 characters without spaces"

func goodToken(t string) bool { return len(t) >= 16 && !strings.ContainsAny(t, " \t") }

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
