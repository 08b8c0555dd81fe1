package tei

import (
	"fmt"
	"net/http"

	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/text"
)

// teiHealth answers GET /health, /ping (SageMaker's) and / as TEI does:
// 200 with no body when the model is ready, 503 Unhealthy when not. TEI
// serves one model; here ?model= names one, and without it every model a
// TEI endpoint serves must be ready, and there must be one. The probes
// need no token, but they tell nothing of a model to a caller without
// the inference token where one is set: ?model= then takes the token
// (401 as the model's own routes), and a 503 names no model.
func (s *API) teiHealth(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("model")
	authorized := s.c.InferenceTokens.None()
	if v := r.Header.Get("Authorization"); !authorized && v != "" {
		tok, ok := core.BearerToken(v)
		authorized = ok && s.c.InferenceTokens.Match(tok)
	}
	if name != "" && !authorized {
		writeTEIError(w, http.StatusUnauthorized, &apierr.Error{Status: http.StatusUnauthorized,
			Msg: "asking after one model (?model=) needs the inference token: send Authorization: Bearer <token>, or ask GET /health without it"})
		return
	}
	if err := s.teiReady(name); err != nil {
		if !authorized {
			err = &apierr.Error{Status: core.StatusOf(err), Msg: "not every model the TEI endpoints serve is ready"}
		}
		writeTEIError(w, core.StatusOf(err), err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// teiReady is nil when the model named (or, for "", every model the TEI
// endpoints serve) is ready, else why not.
func (s *API) teiReady(name string) error {
	if name != "" {
		m, err := s.c.Lookup(name, "")
		if err != nil {
			return err
		}
		if kind := text.SigOf(m.Model()).Kind; kind == text.KindNone {
			return &apierr.Error{Status: http.StatusUnprocessableEntity, Msg: fmt.Sprintf("model %s serves %s, not the TEI endpoints", name, kind)}
		}
		if !m.Ready() {
			return core.NotReady(name)
		}
		return nil
	}
	served := false
	for _, m := range s.c.Opts.Models.Models() {
		if text.SigOf(m.Model()).Kind == text.KindNone {
			continue
		}
		if !m.Ready() {
			return core.NotReady(m.Model().Name)
		}
		served = true
	}
	if !served {
		return &apierr.Error{Status: http.StatusServiceUnavailable, Msg: "no model served here answers the TEI endpoints"}
	}
	return nil
}
