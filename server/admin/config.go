package admin

import (
	"net/http"

	"github.com/stepserve/stepserve/server/triton"
)

// modelConfiguration answers the model configuration extension.
func (s *API) modelConfiguration(r *http.Request) (any, error) {
	m, err := s.c.LookupRoute(r)
	if err != nil {
		return nil, err
	}
	return triton.TritonConfig(m), nil
}
