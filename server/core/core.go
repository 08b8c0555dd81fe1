// Package core is what every front door of the server shares, so that a
// request is held to the same rules whichever protocol brought it:
//
//   - one request lifecycle ([Call], call.go): every door begins a call,
//     decodes into its steps and encodes what they give; admission,
//     the in-flight charge, lookup, readiness, the run, the error
//     taxonomy, the model's statistics, the trace, the request metrics
//     and log line run there once;
//   - model lookup by name and version ([Core.Lookup]), readiness, and the
//     server's metadata;
//   - the in-flight budget ([Budget], [Charge], [wire.Footprint]): what a request
//     will cost is bounded from its declared shapes and charged before any
//     of it is built, until its response is written;
//   - bearer tokens per scope ([Tokens], [Bearer], [Core.AdminAuth]);
//   - the mapping from errors to status, HTTP ([StatusOf]) and gRPC
//     ([GRPCError]) from one table;
//   - request metrics ([Metrics]) and request logs ([Core.LogRequest]);
//   - connection limits ([ConnLimit]) and response compression;
//   - the inference request every door decodes into ([wire.InferRequest]):
//     OIP's tensors, checked against the model's signature and the wire
//     limits, run by [Call.Infer] through [serving.Model.Infer];
//   - the operations behind Triton's extensions (repository, logging, the
//     system shared-memory regions ([shm.Regions]) tensors name) that HTTP
//     and gRPC both offer; Triton's model configuration and statistics
//     are server/triton's.
//
// The refusals it and the layers below return are apierr.Errors. It knows
// no wire format of its own, and imports no door,
// and nothing past serving (no engine, batcher, generation loop or step
// runner).
package core

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stepserve/stepserve/internal/memlimit"
	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/shm"
	"github.com/stepserve/stepserve/serving"
)

// Options configure a [Server].
type Options struct {
	// Models is the live model set the server serves.
	Models *serving.Set
	// ModelControl enables the repository API (load and unload); without
	// it the API answers 403.
	ModelControl bool
	// MaxBodyBytes bounds a request body; 0 means 64 MiB.
	MaxBodyBytes int64
	// Version is reported by GET /v2.
	Version string
	Logger  *slog.Logger // nil discards
	// Registerer receives the server's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Gatherer serves /metrics; nil serves no /metrics endpoint.
	Gatherer prometheus.Gatherer
	// MetricsElsewhere leaves /metrics off this handler, for a server that
	// serves [Server.MetricsHandler] on a listener of its own.
	MetricsElsewhere bool
	// MaxRequestElements bounds the tensor elements a request may declare;
	// 0 means 16Mi.
	MaxRequestElements int64
	// MaxResponseBytes bounds the response a request may ask for, as its
	// shapes bound it before it runs; 0 means 64 MiB.
	MaxResponseBytes int64
	// MaxInflightBytes bounds the memory all requests in flight hold
	// together (bodies, tensors, outputs, responses not yet written);
	// 0 means half of [MemoryLimit].
	MaxInflightBytes int64
	// InferenceTokens, when any, are the bearer tokens /v2/models/...
	// requires; RepositoryTokens likewise for /v2/repository/....
	// [Server.SetTokens] replaces them.
	InferenceTokens  []string
	RepositoryTokens []string
	// RepositoryAnonymous leaves the administrator's endpoints (the
	// repository API, logging, trace settings and files) open on purpose
	// while inference has tokens and they have none; without it they are
	// closed then (adminAuth).
	RepositoryAnonymous bool
	// LogLevel is the level of the log Logger writes to, which the
	// logging extension (POST /v2/logging) changes at run time; nil leaves
	// the extension off. LogFormat is that log's format (text or json),
	// as GET /v2/logging reports it.
	LogLevel  *slog.LevelVar
	LogFormat string
	// LogRequests logs every inference request at info, not debug.
	LogRequests bool
	// Tracer takes the traces Triton's trace extension asks for
	// (/v2/trace/setting, trace.go); nil leaves the extension off.
	Tracer *trace.Tracer
	// Conns, when set, is the connection limit the gRPC listener shares
	// with the HTTP one ([ConnLimit.Listen]): one budget of connections
	// for both doors. nil leaves gRPC's connections unbounded.
	Conns *ConnLimit
	// TLS, when set, serves gRPC over TLS with it (its certificate and
	// ALPN "h2"); nil serves h2c.
	TLS *tls.Config
	// IdleTimeout closes a gRPC connection that has had no call in
	// progress for this long, as server.idle_timeout closes HTTP's idle
	// keep-alive connections; 0 keeps them open.
	IdleTimeout time.Duration
	// ReadTimeout bounds how long a gRPC call's message may take to
	// arrive once the server is ready to read it, as server.read_timeout
	// bounds an HTTP request's; 0 means a minute.
	ReadTimeout time.Duration
	// MaxSharedMemoryRegions and MaxSharedMemoryBytes bound the system
	// shared-memory regions clients may have registered at once, and
	// the bytes they map together; 0 means
	// [shm.DefaultMaxRegions], [shm.DefaultMaxBytes].
	// Under RLIMIT_AS, New lowers the bytes to shared memory's share of
	// the address space where that is less ([shm.Bound]).
	MaxSharedMemoryRegions int
	MaxSharedMemoryBytes   int64
	// NoSharedMemory turns the system shared-memory extension off: no
	// region can be registered, and GET /v2 does not list it.
	NoSharedMemory bool
}

// Core is what every front door shares: the models, the limits, the
// in-flight budget, the tokens, the metrics and the log. The doors hold
// one and reach everything through it.
type Core struct {
	Opts    Options
	Logger  *slog.Logger
	Metrics *Metrics
	Budget  *Budget
	// BudgetWait is how long a request waits for in-flight memory others
	// hold: BudgetWait, shorter in tests.
	BudgetWait time.Duration
	// The bearer tokens in force, per scope.
	InferenceTokens, RepositoryTokens *Tokens
	// SharedMemory is the regions clients registered (Triton's
	// system_shared_memory extension), until [SharedMemory.Close].
	SharedMemory *shm.Regions
	logs         LogControl // the logging extension's (logging.go)
	// served creates a text protocol's series once (Begin).
	served [len(ProtocolLabels)]sync.Once
}

// LookupRoute finds the model and version a route names.
func (c *Core) LookupRoute(r *http.Request) (*serving.Model, error) {
	return c.Lookup(chi.URLParam(r, "model"), chi.URLParam(r, "version"))
}

// Lookup finds a model by name and, when v is not empty, version.
func (c *Core) Lookup(name, v string) (*serving.Model, error) {
	m, ok := c.Opts.Models.Model(name)
	if !ok {
		return nil, modelNotFound(name)
	}
	if v != "" && v != m.Model().Version {
		return nil, versionNotFound(m, v)
	}
	return m, nil
}

func NotReady(name string) error {
	return &apierr.Error{Status: http.StatusServiceUnavailable, Msg: fmt.Sprintf("model %s is not ready", name)}
}

func (c *Core) Live(r *http.Request) (any, error) {
	return map[string]bool{"live": true}, nil
}

// Ready is 200 only when every model has loaded and warmed up.
func (c *Core) Ready(r *http.Request) (any, error) {
	if ok, name := c.Opts.Models.Ready(); !ok {
		return nil, NotReady(name)
	}
	return map[string]bool{"ready": true}, nil
}

// extensions are the protocol extensions the server implements, as
// GET /v2 lists them: Triton's names, and only those whose endpoints and
// parameters really work. Add an extension here when it is implemented.
var extensions = []string{
	"binary_tensor_data",   // JSON header, binary tensors after it (request.go, infer.go)
	"classification",       // an output's top k classes (classification.go)
	"model_configuration",  // /v2/models/{model}[/versions/{version}]/config (triton_config.go)
	"model_repository",     // /v2/repository/index, load, unload
	"schedule_policy",      // the priority and timeout request parameters
	"statistics",           // /v2/models[/{model}[/versions/{version}]]/stats (stats.go)
	"system_shared_memory", // /v2/systemsharedmemory/... and tensors' shared_memory_* parameters (sharedmemory.go)
	"logging",              // /v2/logging (logging.go), where Options.LogLevel is set
	"trace",                // /v2[/models/{model}]/trace/setting (trace.go), where Options.Tracer is set
}

func (c *Core) ServerMetadata(r *http.Request) (any, error) {
	ext := extensions
	if c.Opts.LogLevel == nil {
		ext = slices.DeleteFunc(slices.Clone(ext), func(e string) bool { return e == "logging" })
	}
	if c.Opts.Tracer == nil {
		ext = slices.DeleteFunc(slices.Clone(ext), func(e string) bool { return e == "trace" })
	}
	if c.Opts.NoSharedMemory {
		ext = slices.DeleteFunc(slices.Clone(ext), func(e string) bool { return e == "system_shared_memory" })
	}
	return map[string]any{
		"name":       "stepserve",
		"version":    c.Opts.Version,
		"extensions": ext,
	}, nil
}

// New builds the core for opts, filling in the defaults of its zero
// fields.
func New(opts Options) (*Core, error) {
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = 64 << 20
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.MaxRequestElements == 0 {
		opts.MaxRequestElements = 1 << 24
	}
	if opts.MaxResponseBytes == 0 {
		opts.MaxResponseBytes = 64 << 20
	}
	if opts.MaxInflightBytes == 0 {
		opts.MaxInflightBytes = memlimit.Read().Bytes / 2
	}
	if opts.MaxInflightBytes <= 0 {
		return nil, errors.New("server: Options.MaxInflightBytes is unset and no memory limit could be read; set it")
	}
	if opts.Models == nil {
		return nil, errors.New("server: Options.Models is required")
	}
	c := &Core{Opts: opts, Logger: opts.Logger,
		InferenceTokens:  NewTokens("auth.inference", opts.InferenceTokens),
		RepositoryTokens: NewTokens("auth.repository", opts.RepositoryTokens),
		Budget:           NewBudget(opts.MaxInflightBytes), BudgetWait: DefaultBudgetWait,
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.SharedMemory = shm.New(opts.MaxSharedMemoryRegions, opts.MaxSharedMemoryBytes, c.Logger)
	if opts.NoSharedMemory {
		c.SharedMemory.Disable()
	}
	if !opts.NoSharedMemory {
		// Under RLIMIT_AS, the regions get a share of the address space
		// the heap's plan is taken from, not all of it.
		c.SharedMemory.CapAddressSpace(memlimit.Read())
	}
	if opts.ModelControl && len(opts.RepositoryTokens) == 0 {
		c.Logger.Warn("the repository API has no token: anyone who can reach the server can load and unload models",
			"inference_token", len(opts.InferenceTokens) > 0)
	}
	var err error
	if c.Metrics, err = NewMetrics(opts.Registerer, c.Budget); err != nil {
		return nil, err
	}
	for _, m := range opts.Models.Models() {
		c.Metrics.AddModel(m.Model().Name)
	}
	return c, nil
}

// StatsModels are the models a statistics request names: every model
// served, by name, when name is empty; otherwise the one named, at
// version when that is not empty.
func (c *Core) StatsModels(name, version string) ([]*serving.Model, error) {
	if name == "" {
		return c.Opts.Models.Models(), nil // in name order
	}
	m, err := c.Lookup(name, version)
	if err != nil {
		return nil, err
	}
	return []*serving.Model{m}, nil
}
