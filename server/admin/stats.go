package admin

import (
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/stepserve/stepserve/server/triton"
)

// stats answers the statistics extension for the model the route names,
// or for every model (GET /v2/models/stats).
func (s *API) stats(r *http.Request) (any, error) {
	ms, err := s.c.StatsModels(chi.URLParam(r, "model"), chi.URLParam(r, "version"))
	if err != nil {
		return nil, err
	}
	return triton.TritonStats(ms...), nil
}
