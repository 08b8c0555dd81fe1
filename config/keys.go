// The key table: every configuration key, its default, help text and reader.

package config

import (
	"log/slog"
	"strconv"
	"time"

	"github.com/spf13/viper"

	"github.com/stepserve/stepserve/batching"
)

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
	{"server.tls_cert_file", "", "PEM certificate (chain) served on server.addr and server.grpc_addr: HTTPS and gRPC over TLS; re-read when the file changes (with server.tls_key_file; empty: plain HTTP and h2c)",
		value(func(c *Config) *string { return &c.Server.TLSCertFile }, asString, anything, ""), stringKind("path", 0)},
	{"server.tls_key_file", "", "PEM private key of server.tls_cert_file",
		value(func(c *Config) *string { return &c.Server.TLSKeyFile }, asString, anything, ""), stringKind("path", 0)},
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
	{"server.vllm_metrics", "true", "also export a language model's series under vLLM's names with a model_name label (vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc, ...), as Kubernetes' inference gateway (GAIE), llm-d and vLLM's dashboards read them; false: stepserve's names only",
		value(func(c *Config) *bool { return &c.Server.VLLMMetrics }, strconv.ParseBool, anything, "true or false"), boolKind},
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
