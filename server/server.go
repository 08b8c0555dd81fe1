// Package server is stepserve's HTTP front: the Open Inference Protocol v2
// REST API (JSON, and Triton's binary-tensor extension), health and metadata
// endpoints, /metrics, and the one mapping from errors to status codes.
//
// It decodes and validates every request against the model's signature
// before anything reaches a model, so that a model only ever sees
// well-formed, finite, correctly shaped rows. It knows nothing of buckets or
// engines: a [Model] is anything that can run a [steps.Request].
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
//	GET  /v2/models/{model}[/versions/{version}]/stats
//	POST /v2/repository/index
//	POST /v2/repository/models/{model}/load
//	POST /v2/repository/models/{model}/unload
//	GET  /metrics
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// Model is one servable model, as the server needs it.
type Model interface {
	// Model is the model's name, version and signature.
	Model() *models.Model
	// Ready reports whether the model can take requests now.
	Ready() bool
	// Infer runs r, filling its outputs, or fails. It honours ctx.
	Infer(ctx context.Context, r *steps.Request, p batching.Params) error
	// Explains lists the model's last non-clean steps, newest first.
	Explains() []steps.Record
	// Stats summarises the model's steps per bucket.
	Stats() []steps.BucketStats
}

// Repository finds the models being served.
type Repository interface {
	Model(name string) (Model, bool)
	Models() []Model
}

// ModelControl loads and unloads models: Triton's repository API.
type ModelControl interface {
	// Index lists every model in the repository, loaded or not.
	Index(ctx context.Context) ([]IndexEntry, error)
	// Load loads (or reloads) a model; it returns when the model is ready.
	Load(ctx context.Context, name string) error
	// Unload stops serving a model once its queue has drained.
	Unload(ctx context.Context, name string) error
}

// IndexEntry is one model of the repository index.
type IndexEntry struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
	State   string `json:"state"` // READY, LOADING or UNAVAILABLE
	Reason  string `json:"reason,omitempty"`
}

// Errors a ModelControl wraps so that the server answers 404 and 400.
var (
	ErrUnknownModel = errors.New("unknown model")
	ErrBadModel     = errors.New("model failed to load")
)

// Options configure a [Server].
type Options struct {
	Models Repository
	// Control enables the repository API; nil answers it with 403.
	Control ModelControl
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
	// InferenceTokens, when any, are the bearer tokens /v2/models/...
	// requires; RepositoryTokens likewise for /v2/repository/....
	InferenceTokens  []string
	RepositoryTokens []string
}

// Server is the HTTP API. It is an [http.Handler].
type Server struct {
	opts    Options
	router  chi.Router
	logger  *slog.Logger
	metrics *metrics
	// inferDirect is the inference handler behind its middleware, for
	// requests ServeHTTP routes without the router.
	inferDirect http.Handler
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
	if opts.Models == nil {
		return nil, errors.New("server: Options.Models is required")
	}
	s := &Server{opts: opts, logger: opts.Logger}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	var err error
	if s.metrics, err = newMetrics(opts.Registerer); err != nil {
		return nil, err
	}
	for _, m := range opts.Models.Models() {
		s.metrics.addModel(m.Model().Name)
	}

	r := chi.NewRouter()
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s %s; see GET /v2 and /v2/models/{model}", r.Method, r.URL.Path))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed on %s", r.Method, r.URL.Path))
	})
	r.Get("/v2/health/live", s.live)
	r.Get("/v2/health/ready", s.ready)
	r.Get("/v2", s.serverMetadata)
	// A group, not a mounted sub-router: the same routes, one tree walk
	// per request instead of two.
	r.Group(func(r chi.Router) {
		r.Use(bearer(opts.InferenceTokens))
		const m = "/v2/models/{model}"
		r.Get(m, s.modelMetadata)
		r.Get(m+"/", s.modelMetadata)
		r.Get(m+"/ready", s.modelReady)
		r.Post(m+"/infer", s.infer)
		r.Get(m+"/explain", s.explain)
		r.Get(m+"/stats", s.stats)
		r.Get(m+"/versions/{version}/stats", s.stats)
		r.Get(m+"/versions/{version}/explain", s.explain)
		r.Get(m+"/versions/{version}", s.modelMetadata)
		r.Get(m+"/versions/{version}/ready", s.modelReady)
		r.Post(m+"/versions/{version}/infer", s.infer)
	})
	r.Route("/v2/repository", func(r chi.Router) {
		r.Use(bearer(opts.RepositoryTokens))
		r.Post("/index", s.repositoryIndex)
		r.Post("/models/{model}/load", s.repositoryLoad)
		r.Post("/models/{model}/unload", s.repositoryUnload)
	})
	if opts.Gatherer != nil && !opts.MetricsElsewhere {
		r.Handle("/metrics", s.metricsHandler())
	}
	s.router = r
	s.inferDirect = bearer(opts.InferenceTokens)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, _ := inferPath(r)
		s.inferNamed(w, r, name, "")
	}))
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
	r.Get("/v2/health/live", s.live)
	r.Get("/v2/health/ready", s.ready)
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
func (s *Server) lookup(r *http.Request) (Model, error) {
	return s.lookupName(chi.URLParam(r, "model"), chi.URLParam(r, "version"))
}

// lookupName finds a model by name and, when v is not empty, version.
func (s *Server) lookupName(name, v string) (Model, error) {
	m, ok := s.opts.Models.Model(name)
	if !ok {
		return nil, modelNotFound(name)
	}
	if v != "" && v != m.Model().Version {
		return nil, notFound(fmt.Sprintf("model %s has no version %q; it serves version %q", name, clip(v), m.Model().Version))
	}
	return m, nil
}

func (s *Server) live(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]bool{"live": true})
}

// ready is 200 only when every model has loaded and warmed up.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	for _, m := range s.opts.Models.Models() {
		if !m.Ready() {
			writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("model %s is not ready", m.Model().Name))
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]bool{"ready": true})
}

func (s *Server) serverMetadata(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"name":       "stepserve",
		"version":    s.opts.Version,
		"extensions": []string{"binary_tensor_data"},
	})
}

type metadataTensor struct {
	Name     string          `json:"name"`
	Datatype models.Datatype `json:"datatype"`
	Shape    []int           `json:"shape"`
}

func (s *Server) modelMetadata(w http.ResponseWriter, r *http.Request) {
	m, err := s.lookup(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	mm := m.Model()
	tensors := func(specs []models.TensorSpec) []metadataTensor {
		out := make([]metadataTensor, len(specs))
		for i, sp := range specs {
			out[i] = metadataTensor(sp)
		}
		return out
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"name":     mm.Name,
		"versions": []string{mm.Version},
		"platform": "stepserve_" + mm.Config.Architecture,
		"inputs":   tensors(mm.Config.Inputs),
		"outputs":  tensors(mm.Config.Outputs),
	})
}

func (s *Server) modelReady(w http.ResponseWriter, r *http.Request) {
	m, err := s.lookup(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	if !m.Ready() {
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("model %s is not ready", m.Model().Name))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"name": m.Model().Name, "ready": true})
}

// explain lists the model's last non-clean steps with their reasons.
func (s *Server) explain(w http.ResponseWriter, r *http.Request) {
	m, err := s.lookup(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	recs := m.Explains()
	if recs == nil {
		recs = []steps.Record{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"name": m.Model().Name, "non_clean_steps": recs})
}

// stats summarises the model's steps per bucket.
func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	m, err := s.lookup(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"name": m.Model().Name, "version": m.Model().Version, "buckets": m.Stats()})
}

func writeErr(w http.ResponseWriter, err error) {
	writeError(w, statusOf(err), err.Error())
}

// clip keeps user-supplied strings in messages short.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

type slogPromLogger struct{ l *slog.Logger }

func (l slogPromLogger) Println(v ...any) { l.l.Error("metrics", "err", fmt.Sprint(v...)) }
