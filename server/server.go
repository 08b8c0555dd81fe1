// Package server is stepserve's front door: it builds the API's handler
// and mounts on it one package per protocol, each over one shared core.
//
//	server/core     what every door shares: model lookup, the request
//	                budget, tokens and scopes, errors to HTTP and gRPC
//	                status, metrics and request logs, connection limits,
//	                compression, and the inference request every door
//	                decodes into (OIP's tensors, checked and bounded)
//	server/oip      the Open Inference Protocol v2 over HTTP: health,
//	                metadata, inference (JSON, Triton's binary tensors,
//	                classification), explain and buckets, and Triton's
//	                generate extension
//	server/admin    Triton's extensions over HTTP: the model repository,
//	                model configuration, statistics, logging, trace,
//	                system shared memory
//	server/grpcapi  Triton's and KServe's GRPCInferenceService and the
//	                grpc.health.v1 service
//	server/openai   OpenAI's API: completions, chat, embeddings, models
//	server/tei      Hugging Face text-embeddings-inference's API
//	server/anthropic Anthropic's Messages API
//	server/tgi      Hugging Face text-generation-inference's API (its
//	                POST / and GET /info through TEI's, which share them)
//
// Every door runs a request's life through one type, core.Call
// (server/core/call.go): admission against the in-flight budget, model
// lookup and readiness, the run, the error taxonomy, the model's
// statistics, the trace, the request metrics and log line, and the
// budget given back. The text doors share server/text (a text model's
// signature, texts run as a request, the generation loop), which is not
// a door.
//
// No door imports another, nor this package. Every door runs a request
// through [serving.Model.Infer]: none imports steps, batching, engine or
// bucketing, or knows how a model turns its inputs into a step.
//
// Every request is decoded and validated against the model's signature
// before anything reaches a model, so that a model only ever sees
// well-formed, finite, correctly shaped rows. What a request will cost
// (its tensors, the model's step buffers, its outputs and its response) is
// bounded from its declared shapes before any of it is built, and charged
// to an in-flight budget that all requests share until their responses
// are written.
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
//	GET  /v2/systemsharedmemory[/region/{name}]/status  (Triton's system shared memory)
//	POST /v2/systemsharedmemory/region/{name}/register
//	POST /v2/systemsharedmemory[/region/{name}]/unregister
//	POST /v2/repository/index
//	POST /v2/repository/models/{model}/load
//	POST /v2/repository/models/{model}/unload
//	GET  /metrics
//
// and, for text models, OpenAI's embeddings API and Hugging Face
// text-embeddings-inference's:
//
//	POST /v1/embeddings, GET /v1/models[/{model}]
//	POST /embed, /rerank, /predict, /tokenize; GET /info
package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/stepserve/stepserve/server/admin"
	"github.com/stepserve/stepserve/server/anthropic"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/grpcapi"
	"github.com/stepserve/stepserve/server/oip"
	"github.com/stepserve/stepserve/server/openai"
	"github.com/stepserve/stepserve/server/tei"
	"github.com/stepserve/stepserve/server/tgi"
)

// Options configure a [Server].
type Options = core.Options

// Connection limits, for the listeners the caller builds.
type (
	ConnLimit        = core.ConnLimit
	ConnLimitOptions = core.ConnLimitOptions
)

// NewConnLimit, ConnectionCap and MetricsConns are core's.
var (
	NewConnLimit  = core.NewConnLimit
	ConnectionCap = core.ConnectionCap
)

// MetricsConns is the connection bound of the metrics listener.
const MetricsConns = core.MetricsConns

// Server is the API. It is an [http.Handler].
type Server struct {
	c       *core.Core
	handler http.Handler // the router, behind oip's direct inference route
	router  http.Handler
	grpc    *grpcapi.API
}

// New builds the API for opts.
func New(opts Options) (*Server, error) {
	c, err := core.New(opts)
	if err != nil {
		return nil, err
	}
	s := &Server{c: c, grpc: grpcapi.New(c)}
	r := chi.NewRouter()
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		core.WriteError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s %s; see GET /v2 and /v2/models/{model}", r.Method, r.URL.Path))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		core.WriteError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed on %s", r.Method, r.URL.Path))
	})
	inference := oip.New(c)
	inference.Routes(r)
	admin.New(c).Routes(r)
	// The text APIs' answers are compressed as inference's are: OpenAI's
	// and TEI's clients (httpx, requests) decompress what they are sent.
	r.Group(func(r chi.Router) {
		r.Use(core.CompressResponses)
		openai.New(c).Routes(r)
		anthropic.New(c).Routes(r)
		generation := tgi.New(c)
		generation.Routes(r)
		tei.New(c, generation).Routes(r)
	})
	if opts.Gatherer != nil && !opts.MetricsElsewhere {
		r.Handle("/metrics", s.metricsHandler())
	}
	s.router, s.handler = r, inference.Front(r)
	return s, nil
}

// ServeHTTP implements [http.Handler].
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.handler.ServeHTTP(w, r)
}

func (s *Server) metricsHandler() http.Handler {
	return promhttp.HandlerFor(s.c.Opts.Gatherer, promhttp.HandlerOpts{ErrorLog: slogPromLogger{s.c.Logger}})
}

// MetricsHandler serves /metrics and the health endpoints, for a listener
// separate from the API's (server.metrics_addr).
func (s *Server) MetricsHandler() http.Handler {
	r := chi.NewRouter()
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		core.WriteError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s %s here; this listener serves /metrics and /v2/health/*", r.Method, r.URL.Path))
	})
	r.Get("/v2/health/live", core.API(s.c.Live))
	r.Get("/v2/health/ready", core.API(s.c.Ready))
	if s.c.Opts.Gatherer != nil {
		r.Handle("/metrics", s.metricsHandler())
	}
	return r
}

// GRPCServer builds the gRPC server of s's API: the inference service and
// the health service, with s's limits, tokens and metrics. Requests over
// gRPC are counted with protocol="grpc" from now on. Serve it with
// [Server.ServeGRPC], or on a listener of the caller's own (tests).
func (s *Server) GRPCServer() *grpc.Server { return s.grpc.Server() }

// ServeGRPC serves the gRPC API on ln until [Server.StopGRPC]; it returns
// as [grpc.Server.Serve] does.
func (s *Server) ServeGRPC(ln net.Listener) error { return s.grpc.Serve(ln) }

// DrainGRPC begins the gRPC API's shutdown: its health service answers
// NOT_SERVING from now on, to probes on open connections and new ones
// alike, while the listener stays open for the work in flight to finish;
// [Server.StopGRPC] then closes it.
func (s *Server) DrainGRPC() { s.grpc.Drain() }

// StopGRPC stops the gRPC API gracefully: the health service answers
// NOT_SERVING, new streams are refused, and requests in flight are
// answered. When ctx ends first, the connections are closed. It does
// nothing when the gRPC API is not served.
func (s *Server) StopGRPC(ctx context.Context) { s.grpc.Stop(ctx) }

// SetTokens puts new bearer tokens in force, for a rotation without a
// restart (SIGHUP): requests that arrive from now on are checked against
// them. It is safe to call while serving.
func (s *Server) SetTokens(inference, repository []string) { s.c.SetTokens(inference, repository) }

// CloseTracer writes the traces being taken, at shutdown.
func (s *Server) CloseTracer() { s.c.Opts.Tracer.Close() }

// CloseSharedMemory unregisters the shared-memory regions clients
// registered, at shutdown: each is unmapped at once, or as soon as the
// last request using it is answered, and none can be registered after.
func (s *Server) CloseSharedMemory() { s.c.SharedMemory.Close() }

type slogPromLogger struct{ l *slog.Logger }

func (l slogPromLogger) Println(v ...any) { l.l.Error("metrics", "err", fmt.Sprint(v...)) }
