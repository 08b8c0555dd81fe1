package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/stepserve/stepserve/serving"
)

// The repository API (Triton's model repository extension). It is off
// unless Options.ModelControl is set, since loading and unloading change
// what every client sees.

func (s *Core) control() error {
	if !s.opts.ModelControl {
		return &apiError{http.StatusForbidden, "model control is disabled; start the server with --server.enable_model_control to load and unload models"}
	}
	return nil
}

// repositoryIndex lists the repository's models. It only reads, so it
// answers with model control off too.
func (s *adminAPI) repositoryIndex(r *http.Request) (any, error) {
	// The optional body {"ready": true} asks for ready models only.
	var body struct {
		Ready bool `json:"ready"`
	}
	if r.ContentLength != 0 {
		if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 4096)).Decode(&body); err != nil {
			return nil, badRequest(`repository index: the body must be empty or {"ready": true|false}`)
		}
	}
	return s.index(r.Context(), body.Ready)
}

// index lists the repository's models, or its ready ones only, for either
// protocol.
func (s *Core) index(ctx context.Context, readyOnly bool) ([]serving.IndexEntry, error) {
	index, err := s.opts.Models.Index(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]serving.IndexEntry, 0, len(index))
	for _, e := range index {
		if !readyOnly || e.State == "READY" {
			out = append(out, e)
		}
	}
	return out, nil
}

func (s *adminAPI) repositoryLoad(r *http.Request) (any, error) {
	if err := s.control(); err != nil {
		return nil, err
	}
	name := chi.URLParam(r, "model")
	override, err := loadOverride(r, name)
	if err != nil {
		return nil, err
	}
	if err := s.load(r.Context(), name, override); err != nil {
		return nil, err
	}
	return map[string]any{"name": name, "loaded": true}, nil
}

// load loads or reloads a model, its configuration changed by override
// (nil: none), for either protocol.
func (s *Core) load(ctx context.Context, name string, override serving.Override) error {
	if len(*s.repositoryTokens.digests.Load()) == 0 && s.opts.Models.RunsCode(name) {
		// A module is code the worker runs: whoever may load one may run
		// code on the server.
		return &apiError{http.StatusForbidden, fmt.Sprintf("model %s is architecture torch, Python code the server would run: "+
			"loading it through the repository API requires auth.repository.token (or token_file); "+
			"without one, put it in the repository before the server starts", clipName(name))}
	}
	if err := s.opts.Models.LoadWith(ctx, name, override); err != nil {
		return fmt.Errorf("load %s: %w", clipName(name), err)
	}
	s.metrics.addModel(name)
	s.logger.Info("model loaded through the repository API", "model", name)
	return nil
}

func (s *adminAPI) repositoryUnload(r *http.Request) (any, error) {
	if err := s.control(); err != nil {
		return nil, err
	}
	name := chi.URLParam(r, "model")
	if err := s.unload(r.Context(), name); err != nil {
		return nil, err
	}
	return map[string]any{"name": name, "unloaded": true}, nil
}

// unload stops serving a model, for either protocol.
func (s *Core) unload(ctx context.Context, name string) error {
	if err := s.opts.Models.Unload(ctx, name); err != nil {
		return fmt.Errorf("unload %s: %w", clipName(name), err)
	}
	s.metrics.forget(name)
	s.opts.Tracer.Forget(name) // its trace override, as Triton drops it with the model
	s.logger.Info("model unloaded through the repository API", "model", name)
	return nil
}
