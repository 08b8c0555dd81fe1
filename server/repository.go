package server

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/go-chi/chi/v5"
)

// The repository API (Triton's model repository extension). It is off
// unless the server was given a ModelControl, since loading and unloading
// change what every client sees.

func (s *Server) control(w http.ResponseWriter) bool {
	if s.opts.Control == nil {
		writeError(w, http.StatusForbidden, "model control is disabled; start the server with --server.enable_model_control to load and unload models")
		return false
	}
	return true
}

func (s *Server) repositoryIndex(w http.ResponseWriter, r *http.Request) {
	if !s.control(w) {
		return
	}
	// The optional body {"ready": true} asks for ready models only.
	var body struct {
		Ready bool `json:"ready"`
	}
	if r.ContentLength != 0 {
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&body); err != nil {
			writeError(w, http.StatusBadRequest, `repository index: the body must be empty or {"ready": true|false}`)
			return
		}
	}
	index, err := s.opts.Control.Index(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	out := make([]IndexEntry, 0, len(index))
	for _, e := range index {
		if !body.Ready || e.State == "READY" {
			out = append(out, e)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) repositoryLoad(w http.ResponseWriter, r *http.Request) {
	if !s.control(w) {
		return
	}
	name := chi.URLParam(r, "model")
	if err := s.opts.Control.Load(r.Context(), name); err != nil {
		writeErr(w, fmt.Errorf("load %s: %w", clip(name), err))
		return
	}
	s.metrics.addModel(name)
	s.logger.Info("model loaded through the repository API", "model", name)
	writeJSON(w, http.StatusOK, map[string]any{"name": name, "loaded": true})
}

func (s *Server) repositoryUnload(w http.ResponseWriter, r *http.Request) {
	if !s.control(w) {
		return
	}
	name := chi.URLParam(r, "model")
	if err := s.opts.Control.Unload(r.Context(), name); err != nil {
		writeErr(w, fmt.Errorf("unload %s: %w", clip(name), err))
		return
	}
	s.metrics.forget(name)
	s.logger.Info("model unloaded through the repository API", "model", name)
	writeJSON(w, http.StatusOK, map[string]any{"name": name, "unloaded": true})
}
