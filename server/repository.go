package server

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/stepserve/stepserve/serving"
)

// The repository API (Triton's model repository extension). It is off
// unless Options.ModelControl is set, since loading and unloading change
// what every client sees.

func (s *Server) control() error {
	if !s.opts.ModelControl {
		return &apiError{http.StatusForbidden, "model control is disabled; start the server with --server.enable_model_control to load and unload models"}
	}
	return nil
}

// repositoryIndex lists the repository's models. It only reads, so it
// answers with model control off too.
func (s *Server) repositoryIndex(r *http.Request) (any, error) {
	// The optional body {"ready": true} asks for ready models only.
	var body struct {
		Ready bool `json:"ready"`
	}
	if r.ContentLength != 0 {
		if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 4096)).Decode(&body); err != nil {
			return nil, badRequest(`repository index: the body must be empty or {"ready": true|false}`)
		}
	}
	index, err := s.opts.Models.Index(r.Context())
	if err != nil {
		return nil, err
	}
	out := make([]serving.IndexEntry, 0, len(index))
	for _, e := range index {
		if !body.Ready || e.State == "READY" {
			out = append(out, e)
		}
	}
	return out, nil
}

func (s *Server) repositoryLoad(r *http.Request) (any, error) {
	if err := s.control(); err != nil {
		return nil, err
	}
	name := chi.URLParam(r, "model")
	if len(*s.repositoryTokens.digests.Load()) == 0 && s.opts.Models.RunsCode(name) {
		// A module is code the worker runs: whoever may load one may run
		// code on the server.
		return nil, &apiError{http.StatusForbidden, fmt.Sprintf("model %s is architecture torch, Python code the server would run: "+
			"loading it through the repository API requires auth.repository.token (or token_file); "+
			"without one, put it in the repository before the server starts", clipName(name))}
	}
	override, err := loadOverride(r, name)
	if err != nil {
		return nil, err
	}
	if err := s.opts.Models.LoadWith(r.Context(), name, override); err != nil {
		return nil, fmt.Errorf("load %s: %w", clipName(name), err)
	}
	s.metrics.addModel(name)
	s.logger.Info("model loaded through the repository API", "model", name)
	return map[string]any{"name": name, "loaded": true}, nil
}

func (s *Server) repositoryUnload(r *http.Request) (any, error) {
	if err := s.control(); err != nil {
		return nil, err
	}
	name := chi.URLParam(r, "model")
	if err := s.opts.Models.Unload(r.Context(), name); err != nil {
		return nil, fmt.Errorf("unload %s: %w", clipName(name), err)
	}
	s.metrics.forget(name)
	s.logger.Info("model unloaded through the repository API", "model", name)
	return map[string]any{"name": name, "unloaded": true}, nil
}
