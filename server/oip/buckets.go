package oip

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/serving"
)

// buckets summarises the model's steps per bucket: stepserve's own view.
func (s *API) buckets(r *http.Request) (any, error) {
	m, err := s.c.LookupRoute(r)
	if err != nil {
		return nil, err
	}
	b := m.Backend().Stats()
	if b == nil {
		b = []serving.BucketStats{}
	}
	return map[string]any{"name": m.Model().Name, "version": m.Model().Version, "buckets": b}, nil
}

// bucketAdvice is GET .../buckets/advice?max_buckets=K: the bucket lists
// of at most K programs (default: as many as the model has now) that would
// have padded the steps it served least, with the padding of the current
// lists and of the advised ones on the same steps, and the model.yaml
// block to paste.
func (s *API) bucketAdvice(r *http.Request) (any, error) {
	m, err := s.c.LookupRoute(r)
	if err != nil {
		return nil, err
	}
	k := len(m.Backend().Stats())
	if q := r.URL.Query().Get("max_buckets"); q != "" {
		if k, err = strconv.Atoi(q); err != nil || k < 1 || k > 4096 {
			return nil, apierr.BadRequest(fmt.Sprintf("max_buckets: %q; want an integer in 1..4096, the most buckets (compiled programs) the advice may use", q))
		}
	}
	a, err := m.Advise(k)
	if err != nil {
		if errors.Is(err, serving.ErrNoTraffic) {
			return nil, &apierr.Error{Status: http.StatusConflict, Msg: fmt.Sprintf("model %s: %v", m.Model().Name, err)}
		}
		return nil, apierr.BadRequest(err.Error())
	}
	if k == 0 {
		k = a.CurrentPrograms // a language model's: as many decode programs as now
	}
	return map[string]any{"name": m.Model().Name, "version": m.Model().Version, "max_buckets": k, "advice": a}, nil
}
