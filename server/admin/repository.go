package admin

import (
	"encoding/json"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/triton"
)

// repositoryIndex lists the repository's models. It only reads, so it
// answers with model control off too.
func (s *API) repositoryIndex(r *http.Request) (any, error) {
	// The optional body {"ready": true} asks for ready models only.
	var body struct {
		Ready bool `json:"ready"`
	}
	if r.ContentLength != 0 {
		if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 4096)).Decode(&body); err != nil {
			return nil, apierr.BadRequest(`repository index: the body must be empty or {"ready": true|false}`)
		}
	}
	return s.c.Index(r.Context(), body.Ready)
}

func (s *API) repositoryLoad(r *http.Request) (any, error) {
	if err := s.c.Control(); err != nil {
		return nil, err
	}
	name := chi.URLParam(r, "model")
	override, err := triton.LoadOverride(r, name)
	if err != nil {
		return nil, err
	}
	if err := s.c.Load(r.Context(), name, override); err != nil {
		return nil, err
	}
	return map[string]any{"name": name, "loaded": true}, nil
}

func (s *API) repositoryUnload(r *http.Request) (any, error) {
	if err := s.c.Control(); err != nil {
		return nil, err
	}
	name := chi.URLParam(r, "model")
	if err := s.c.Unload(r.Context(), name); err != nil {
		return nil, err
	}
	return map[string]any{"name": name, "unloaded": true}, nil
}
