// Package admin is Triton's extensions over HTTP: the model repository
// (index, load, unload), model configuration, statistics, logging and
// trace settings and files, system shared memory, and a 501 naming each
// extension stepserve does not implement (CUDA shared memory). The operations behind them are [core.Core]'s, shared with
// the gRPC door.
package admin

import (
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/stepserve/stepserve/server/core"
)

// API serves its endpoints over the core it is built on.
type API struct{ c *core.Core }

// New builds the API over c.
func New(c *core.Core) *API { return &API{c: c} }

// Routes mounts Triton's extensions on r.
func (s *API) Routes(r chi.Router) {
	// Triton's extensions stepserve does not implement answer 501 naming
	// the extension, rather than a 404 that reads like a typo.
	s.cudaSharedMemoryRoutes(r)
	// Statistics and configuration read what inference reads: the
	// inference token guards them.
	r.Group(func(r chi.Router) {
		r.Use(core.Bearer(s.c.InferenceTokens))
		const m = "/v2/models/{model}"
		for _, v := range []string{"", "/versions/{version}"} {
			r.Get(m+v+"/stats", core.API(s.stats))
			r.Get(m+v+"/config", core.API(s.modelConfiguration))
		}
		r.Get("/v2/models/stats", core.API(s.stats)) // every model's
	})
	// The index only reads: with the repository token where one is set,
	// else the inference token.
	index := core.IndexAuth(s.c.Opts.ModelControl, s.c.RepositoryTokens, s.c.InferenceTokens)(core.API(s.repositoryIndex))
	r.Method(http.MethodPost, "/v2/repository/index", index)
	r.Method(http.MethodGet, "/v2/repository/index", index)
	r.Group(func(r chi.Router) {
		r.Use(s.c.AdminAuth) // an administrator's, as the repository API
		r.Get("/v2/logging", core.API(s.loggingSettings))
		r.Post("/v2/logging", core.API(s.loggingSettings))
		if s.c.Opts.Tracer == nil {
			r.HandleFunc("/v2/trace/setting", notImplemented("trace", traceInstead))
			r.HandleFunc("/v2/models/{model}/trace/setting", notImplemented("trace", traceInstead))
			r.HandleFunc("/v2/models/{model}/versions/{version}/trace/setting", notImplemented("trace", traceInstead))
			return
		}
		// Trace settings and files: an administrator's too (trace.go).
		r.Get("/v2/trace/setting", core.API(s.traceSettings))
		r.Post("/v2/trace/setting", core.API(s.traceSettings))
		for _, v := range []string{"", "/versions/{version}"} {
			r.Get("/v2/models/{model}"+v+"/trace/setting", core.API(s.modelTraceSettings))
			r.Post("/v2/models/{model}"+v+"/trace/setting", core.API(s.modelTraceSettings))
		}
		r.Get("/v2/trace/files", core.API(s.traceFiles))
		r.Get("/v2/trace/files/{name}", s.traceFile)
	})
	// System shared memory: registering makes the server map a file, so
	// the repository token where one is set, else the inference token
	// (core.SharedMemoryTokens).
	r.Group(func(r chi.Router) {
		r.Use(s.c.SharedMemoryAuth)
		const shm = "/v2/systemsharedmemory"
		r.Get(shm+"/status", core.API(s.sharedMemoryStatus))
		r.Get(shm+"/region/{name}/status", core.API(s.sharedMemoryStatus))
		r.Post(shm+"/region/{name}/register", core.API(s.sharedMemoryRegister))
		r.Post(shm+"/unregister", core.API(s.sharedMemoryUnregister))
		r.Post(shm+"/region/{name}/unregister", core.API(s.sharedMemoryUnregister))
	})
	r.Route("/v2/repository", func(r chi.Router) {
		r.Use(core.Bearer(s.c.RepositoryTokens))
		r.Post("/models/{model}/load", core.API(s.repositoryLoad))
		r.Post("/models/{model}/unload", core.API(s.repositoryUnload))
	})
}
