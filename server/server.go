// Package server is stepserve's front door, every protocol it speaks: the
// Open Inference Protocol v2 over HTTP (JSON, and Triton's binary-tensor
// extension) and over gRPC (grpc.go, Triton's and KServe's
// GRPCInferenceService), Triton's extensions (model repository, model
// configuration, statistics, logging, trace), OpenAI's and Hugging Face
// TEI's text APIs, health and metadata endpoints, /metrics, and the one
// mapping from errors to status codes.
//
// It decodes and validates every request against the model's signature
// before anything reaches a model, so that a model only ever sees
// well-formed, finite, correctly shaped rows. What a request will cost (its
// tensors, the model's step buffers, its outputs and its response) is
// bounded from its declared shapes before any of it is built, and charged
// to an in-flight budget that all requests share until their responses
// are written.
//
// It owns the protocols, not the models: the live model set
// ([serving.Set]) finds and loads them, and [serving.Model.Infer] runs the
// decoded tensors (preparing the step, queueing it, retrying on a reloaded
// model's successor). It imports none of steps, batching, engine or
// bucketing: it knows nothing of engines, of how a model turns its inputs
// into a step, or of the shapes a step is compiled for.
//
// It also guards the listeners: bearer tokens per scope, replaceable while
// serving ([Server.SetTokens]), and a bound on each listener's connections
// ([ConnLimit]).
//
// # Endpoints
//
//	GET  /v2/health/live
//	GET  /v2/health/ready
//	GET  /v2
//	GET  /v2/models/{model}[/versions/{version}]
//	GET  /v2/models/{model}[/versions/{version}]/ready
//	POST /v2/models/{model}[/versions/{version}]/infer
//	GET  /v2/models/{model}[/versions/{version}]/explain
//	GET  /v2/models/{model}[/versions/{version}]/stats   (Triton's statistics)
//	GET  /v2/models/stats                                (every model's)
//	GET  /v2/models/{model}[/versions/{version}]/buckets (stepserve's per-bucket view)
//	GET  /v2/models/{model}[/versions/{version}]/config  (Triton's model configuration)
//	GET  /v2/logging, POST /v2/logging                  (the log level at run time)
//	GET  /v2[/models/{model}[/versions/{version}]]/trace/setting, POST too (Triton's trace extension)
//	GET  /v2/trace/files, /v2/trace/files/{name}        (the traces written)
//	POST /v2/repository/index
//	POST /v2/repository/models/{model}/load
//	POST /v2/repository/models/{model}/unload
//	GET  /metrics
//
// and, for text models, OpenAI's embeddings API (openai.go) and Hugging
// Face text-embeddings-inference's (tei.go):
//
//	POST /v1/embeddings, GET /v1/models[/{model}]
//	POST /embed, /rerank, /predict, /tokenize; GET /info
package server

import (
	"context"
	"errors"
	"fmt"
	"google.golang.org/grpc"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stepserve/stepserve/internal/memlimit"
	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/models"
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
}

// Core is what every front door shares.
type Core struct {
	opts    Options
	logger  *slog.Logger
	metrics *metrics
	budget  *budget
	// budgetWait is how long a request waits for in-flight memory others
	// hold: budgetWait, shorter in tests.
	budgetWait time.Duration
	// The bearer tokens in force, per scope.
	inferenceTokens, repositoryTokens *tokens
	logs                              logControl // the logging extension's (logging.go)
}

type oipAPI struct{ *Core }
type adminAPI struct{ *Core }
type grpcAPI struct {
	*Core
	grpcState
}
type textAPI struct {
	*Core
	textAPIState
}

// Server is the HTTP API. It is an [http.Handler].
type Server struct {
	*Core
	router chi.Router
	// inferDirect is the inference handler behind its middleware, for
	// requests ServeHTTP routes without the router.
	inferDirect http.Handler
	oip         *oipAPI
	admin       *adminAPI
	grpc        *grpcAPI
	text        *textAPI
}

// New builds the router for opts.
func New(opts Options) (*Server, error) {
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
	s := &Server{Core: &Core{opts: opts, logger: opts.Logger,
		inferenceTokens:  newTokens("auth.inference", opts.InferenceTokens),
		repositoryTokens: newTokens("auth.repository", opts.RepositoryTokens),
		budget:           newBudget(opts.MaxInflightBytes), budgetWait: budgetWait,
	}}
	s.oip, s.admin = &oipAPI{s.Core}, &adminAPI{s.Core}
	s.grpc, s.text = &grpcAPI{Core: s.Core}, &textAPI{Core: s.Core}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	if opts.ModelControl && len(opts.RepositoryTokens) == 0 {
		s.logger.Warn("the repository API has no token: anyone who can reach the server can load and unload models",
			"inference_token", len(opts.InferenceTokens) > 0)
	}
	var err error
	if s.metrics, err = newMetrics(opts.Registerer, s.budget); err != nil {
		return nil, err
	}
	for _, m := range opts.Models.Models() {
		s.metrics.addModel(m.Model().Name)
	}

	r := chi.NewRouter()
	r.Use(compressResponses)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s %s; see GET /v2 and /v2/models/{model}", r.Method, r.URL.Path))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed on %s", r.Method, r.URL.Path))
	})
	s.oip.routes(r)
	s.admin.routes(r)
	s.text.routes(r)
	if opts.Gatherer != nil && !opts.MetricsElsewhere {
		r.Handle("/metrics", s.metricsHandler())
	}
	s.router = r
	s.inferDirect = compressResponses(bearer(s.inferenceTokens)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, _ := inferPath(r)
		s.oip.inferNamed(w, r, name, "")
	})))
	return s, nil
}

func (s *Server) metricsHandler() http.Handler {
	return promhttp.HandlerFor(s.opts.Gatherer, promhttp.HandlerOpts{ErrorLog: slogPromLogger{s.logger}})
}

// MetricsHandler serves /metrics and the health endpoints, for a listener
// separate from the API's (server.metrics_addr).
func (s *Server) MetricsHandler() http.Handler {
	r := chi.NewRouter()
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s %s here; this listener serves /metrics and /v2/health/*", r.Method, r.URL.Path))
	})
	r.Get("/v2/health/live", api(s.live))
	r.Get("/v2/health/ready", api(s.ready))
	if s.opts.Gatherer != nil {
		r.Handle("/metrics", s.metricsHandler())
	}
	return r
}

// ServeHTTP implements [http.Handler].
// Inference requests in their plain form (POST /v2/models/{model}/infer)
// go straight to their handler, behind the same middleware; everything
// else, including every malformed or unusual path, through the router.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, ok := inferPath(r); ok {
		s.inferDirect.ServeHTTP(w, r)
		return
	}
	s.router.ServeHTTP(w, r)
}

// inferPath returns the model of a POST /v2/models/{model}/infer request
// whose path the router would route on as it stands (no escapes).
func inferPath(r *http.Request) (string, bool) {
	if r.Method != http.MethodPost || r.URL.RawPath != "" {
		return "", false
	}
	name, ok := strings.CutPrefix(r.URL.Path, "/v2/models/")
	if !ok {
		return "", false
	}
	name, ok = strings.CutSuffix(name, "/infer")
	if !ok || name == "" || strings.Contains(name, "/") {
		return "", false
	}
	return name, true
}

// lookup finds the model and version a route names.
func (s *Core) lookup(r *http.Request) (*serving.Model, error) {
	return s.lookupName(chi.URLParam(r, "model"), chi.URLParam(r, "version"))
}

// lookupName finds a model by name and, when v is not empty, version.
func (s *Core) lookupName(name, v string) (*serving.Model, error) {
	m, ok := s.opts.Models.Model(name)
	if !ok {
		return nil, modelNotFound(name)
	}
	if v != "" && v != m.Model().Version {
		return nil, notFound(fmt.Sprintf("model %s has no version %q; it serves version %q", name, clipName(v), m.Model().Version))
	}
	return m, nil
}

func notReady(name string) error {
	return &apiError{http.StatusServiceUnavailable, fmt.Sprintf("model %s is not ready", name)}
}

func (s *Core) live(r *http.Request) (any, error) {
	return map[string]bool{"live": true}, nil
}

// ready is 200 only when every model has loaded and warmed up.
func (s *Core) ready(r *http.Request) (any, error) {
	if ok, name := s.opts.Models.Ready(); !ok {
		return nil, notReady(name)
	}
	return map[string]bool{"ready": true}, nil
}

// extensions are the protocol extensions the server implements, as
// GET /v2 lists them: Triton's names, and only those whose endpoints and
// parameters really work. Add an extension here when it is implemented.
var extensions = []string{
	"binary_tensor_data",  // JSON header, binary tensors after it (request.go, infer.go)
	"classification",      // an output's top k classes (classification.go)
	"model_configuration", // /v2/models/{model}[/versions/{version}]/config (triton_config.go)
	"model_repository",    // /v2/repository/index, load, unload
	"schedule_policy",     // the priority and timeout request parameters
	"statistics",          // /v2/models[/{model}[/versions/{version}]]/stats (stats.go)
	"logging",             // /v2/logging (logging.go), where Options.LogLevel is set
	"trace",               // /v2[/models/{model}]/trace/setting (trace.go), where Options.Tracer is set
}

func (s *Core) serverMetadata(r *http.Request) (any, error) {
	ext := extensions
	if s.opts.LogLevel == nil {
		ext = slices.DeleteFunc(slices.Clone(ext), func(e string) bool { return e == "logging" })
	}
	if s.opts.Tracer == nil {
		ext = slices.DeleteFunc(slices.Clone(ext), func(e string) bool { return e == "trace" })
	}
	return map[string]any{
		"name":       "stepserve",
		"version":    s.opts.Version,
		"extensions": ext,
	}, nil
}

type metadataTensor struct {
	Name     string          `json:"name"`
	Datatype models.Datatype `json:"datatype"`
	Shape    []int           `json:"shape"`
}

func (s *oipAPI) modelMetadata(r *http.Request) (any, error) {
	m, err := s.lookup(r)
	if err != nil {
		return nil, err
	}
	mm := m.Model()
	tensors := func(specs []models.TensorSpec) []metadataTensor {
		out := make([]metadataTensor, len(specs))
		for i, sp := range specs {
			out[i] = metadataTensor{Name: sp.Name, Datatype: sp.Datatype, Shape: sp.Shape}
		}
		return out
	}
	md := map[string]any{
		"name":     mm.Name,
		"versions": []string{mm.Version},
		"platform": mm.Platform(),
		"inputs":   tensors(mm.Config.Inputs),
		"outputs":  tensors(mm.Config.Outputs),
	}
	if mm.Config.Description != "" {
		md["description"] = mm.Config.Description
	}
	return md, nil
}

func (s *oipAPI) modelReady(r *http.Request) (any, error) {
	m, err := s.lookup(r)
	if err != nil {
		return nil, err
	}
	if !m.Ready() {
		return nil, notReady(m.Model().Name)
	}
	return map[string]any{"name": m.Model().Name, "ready": true}, nil
}

// explain lists the model's last non-clean steps with their reasons.
func (s *oipAPI) explain(r *http.Request) (any, error) {
	m, err := s.lookup(r)
	if err != nil {
		return nil, err
	}
	recs := m.Explains()
	if recs == nil {
		recs = []serving.Record{}
	}
	return map[string]any{"name": m.Model().Name, "non_clean_steps": recs}, nil
}

type slogPromLogger struct{ l *slog.Logger }

func (l slogPromLogger) Println(v ...any) { l.l.Error("metrics", "err", fmt.Sprint(v...)) }

// routes mounts the OIP endpoints on r.
func (s *oipAPI) routes(r chi.Router) {
	r.Get("/v2/health/live", api(s.live))
	r.Get("/v2/health/ready", api(s.ready))
	r.Get("/v2", api(s.serverMetadata))
	r.Get("/v2/", api(s.serverMetadata))
	// A group, not a mounted sub-router: the same routes, one tree walk
	// per request instead of two.
	r.Group(func(r chi.Router) {
		r.Use(bearer(s.inferenceTokens))
		const m = "/v2/models/{model}"
		for _, v := range []string{"", "/versions/{version}"} {
			r.Get(m+v, api(s.modelMetadata))
			r.Get(m+v+"/ready", api(s.modelReady))
			r.Get(m+v+"/explain", api(s.explain))
			r.Get(m+v+"/buckets", api(s.buckets))
			r.Get(m+v+"/buckets/advice", api(s.bucketAdvice))
			r.Post(m+v+"/infer", s.infer)
		}
		r.Get(m+"/", api(s.modelMetadata))
	})
}

// routes mounts Triton's extensions on r.
func (s *adminAPI) routes(r chi.Router) {
	// Triton's extensions stepserve does not implement answer 501 naming
	// the extension, rather than a 404 that reads like a typo.
	for _, u := range unsupportedExtensions {
		r.HandleFunc(u.path, notImplemented(u.extension, u.instead))
	}
	// Statistics and configuration read what inference reads: the
	// inference token guards them.
	r.Group(func(r chi.Router) {
		r.Use(bearer(s.inferenceTokens))
		const m = "/v2/models/{model}"
		for _, v := range []string{"", "/versions/{version}"} {
			r.Get(m+v+"/stats", api(s.stats))
			r.Get(m+v+"/config", api(s.modelConfiguration))
		}
		r.Get("/v2/models/stats", api(s.stats)) // every model's
	})
	// The index only reads: with the repository token where one is set,
	// else the inference token.
	index := indexAuth(s.opts.ModelControl, s.repositoryTokens, s.inferenceTokens)(api(s.repositoryIndex))
	r.Method(http.MethodPost, "/v2/repository/index", index)
	r.Method(http.MethodGet, "/v2/repository/index", index)
	r.Group(func(r chi.Router) {
		r.Use(s.adminAuth) // an administrator's, as the repository API
		r.Get("/v2/logging", api(s.loggingSettings))
		r.Post("/v2/logging", api(s.loggingSettings))
		if s.opts.Tracer == nil {
			r.HandleFunc("/v2/trace/setting", notImplemented("trace", traceInstead))
			r.HandleFunc("/v2/models/{model}/trace/setting", notImplemented("trace", traceInstead))
			r.HandleFunc("/v2/models/{model}/versions/{version}/trace/setting", notImplemented("trace", traceInstead))
			return
		}
		// Trace settings and files: an administrator's too (trace.go).
		r.Get("/v2/trace/setting", api(s.traceSettings))
		r.Post("/v2/trace/setting", api(s.traceSettings))
		for _, v := range []string{"", "/versions/{version}"} {
			r.Get("/v2/models/{model}"+v+"/trace/setting", api(s.modelTraceSettings))
			r.Post("/v2/models/{model}"+v+"/trace/setting", api(s.modelTraceSettings))
		}
		r.Get("/v2/trace/files", api(s.traceFiles))
		r.Get("/v2/trace/files/{name}", s.traceFile)
	})
	r.Route("/v2/repository", func(r chi.Router) {
		r.Use(bearer(s.repositoryTokens))
		r.Post("/models/{model}/load", api(s.repositoryLoad))
		r.Post("/models/{model}/unload", api(s.repositoryUnload))
	})
}

// GRPCServer builds the gRPC server of s's API: the inference service and
// the health service, with s's limits, tokens and metrics. Requests over
// gRPC are counted with protocol="grpc" from now on. Serve it with
// [Server.ServeGRPC], or on a listener of the caller's own (tests).
func (s *Server) GRPCServer() *grpc.Server { return s.grpc.grpcServer() }

// ServeGRPC serves the gRPC API on ln until [Server.StopGRPC]; it returns
// as [grpc.Server.Serve] does.
func (s *Server) ServeGRPC(ln net.Listener) error { return s.grpc.serve(ln) }

// StopGRPC stops the gRPC API gracefully: the health service answers
// NOT_SERVING, new streams are refused, and requests in flight are
// answered. When ctx ends first, the connections are closed. It does
// nothing when the gRPC API is not served.
func (s *Server) StopGRPC(ctx context.Context) { s.grpc.stop(ctx) }
