// Package oip is the Open Inference Protocol v2 over HTTP: health, server
// and model metadata, model readiness, inference (JSON, Triton's
// binary-tensor extension, classification), and stepserve's explain,
// buckets and bucket advice. It reads its wire format, runs the request
// through [core.Core], and writes its wire format.
package oip

import (
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/serving"
)

// API serves its endpoints over the core it is built on.
type API struct{ c *core.Core }

// New builds the API over c.
func New(c *core.Core) *API { return &API{c: c} }

type metadataTensor struct {
	Name     string          `json:"name"`
	Datatype models.Datatype `json:"datatype"`
	Shape    []int           `json:"shape"`
}

func (s *API) modelMetadata(r *http.Request) (any, error) {
	m, err := s.c.LookupRoute(r)
	if err != nil {
		return nil, err
	}
	mm := m.Model()
	tensors := func(specs []models.TensorSpec) []metadataTensor {
		out := make([]metadataTensor, len(specs))
		for i, sp := range specs {
			out[i] = metadataTensor{Name: sp.Name, Datatype: sp.Datatype, Shape: sp.Shape}
		}
		return out
	}
	md := map[string]any{
		"name":     mm.Name,
		"versions": []string{mm.Version},
		"platform": mm.Platform(),
		"inputs":   tensors(mm.Config.Inputs),
		"outputs":  tensors(mm.Config.Outputs),
	}
	if mm.Config.Description != "" {
		md["description"] = mm.Config.Description
	}
	return md, nil
}

func (s *API) modelReady(r *http.Request) (any, error) {
	m, err := s.c.LookupRoute(r)
	if err != nil {
		return nil, err
	}
	if !m.Ready() {
		return nil, core.NotReady(m.Model().Name)
	}
	return map[string]any{"name": m.Model().Name, "ready": true}, nil
}

// explain lists the model's last non-clean steps with their reasons.
func (s *API) explain(r *http.Request) (any, error) {
	m, err := s.c.LookupRoute(r)
	if err != nil {
		return nil, err
	}
	recs := m.Backend().Explains()
	if recs == nil {
		recs = []serving.Record{}
	}
	progs := m.Backend().Programs(r.Context())
	if progs == nil {
		progs = []serving.ProgramReport{}
	}
	return map[string]any{"name": m.Model().Name, "non_clean_steps": recs, "programs": progs}, nil
}

// Routes mounts the OIP endpoints on r.
func (s *API) Routes(r chi.Router) {
	r.Get("/v2/health/live", core.API(s.c.Live))
	r.Get("/v2/health/ready", core.API(s.c.Ready))
	r.Get("/v2", core.API(s.c.ServerMetadata))
	r.Get("/v2/", core.API(s.c.ServerMetadata))
	// A group, not a mounted sub-router: the same routes, one tree walk
	// per request instead of two.
	r.Group(func(r chi.Router) {
		r.Use(core.Bearer(s.c.InferenceTokens))
		const m = "/v2/models/{model}"
		for _, v := range []string{"", "/versions/{version}"} {
			r.Get(m+v, core.API(s.modelMetadata))
			r.Get(m+v+"/ready", core.API(s.modelReady))
			r.Get(m+v+"/explain", core.API(s.explain))
			r.Get(m+v+"/buckets", core.API(s.buckets))
			r.Get(m+v+"/buckets/advice", core.API(s.bucketAdvice))
			// Only inference answers are compressed, as Triton's are
			// (core.CompressResponses).
			r.With(core.CompressResponses).Post(m+v+"/infer", s.infer)
			// Triton's generate extension (generate.go), compressed
			// as Triton compresses its answers.
			r.With(core.CompressResponses).Post(m+v+"/generate", s.tritonGenerate(false))
			r.With(core.CompressResponses).Post(m+v+"/generate_stream", s.tritonGenerate(true))
		}
		r.Get(m+"/", core.API(s.modelMetadata))
	})
}

// Front is h with the inference requests in their plain form (POST
// /v2/models/{model}/infer) taken straight to their handler, behind the
// same middleware as the router's: everything else, including every
// malformed or unusual path, goes to h.
func (s *API) Front(h http.Handler) http.Handler {
	direct := core.CompressResponses(core.Bearer(s.c.InferenceTokens)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, _ := inferPath(r)
		s.inferNamed(w, r, name, "")
	})))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := inferPath(r); ok {
			direct.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
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
