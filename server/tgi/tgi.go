// Package tgi is Hugging Face text-generation-inference's API as a door,
// for language models:
//
//	POST /generate          one answer: {"generated_text", "details"}
//	POST /generate_stream   server-sent events, one a token
//	POST /                  either, by the body's "stream" (an array of one answer)
//	GET  /info              the model and its bounds
//
// It decodes TGI's bodies (inputs, and parameters: max_new_tokens,
// do_sample, temperature, top_k, top_p, stop, seed, details,
// top_n_tokens, return_full_text, truncate, grammar) into the core's call
// through package text, and encodes answers, stream events and errors
// in TGI's shapes, as its OpenAPI document describes them. POST / and
// GET /info are TEI's routes too: TEI's door dispatches a language
// model's requests here ([API.Root], [API.Info]). It imports no other
// door, and nothing past serving.
package tgi

import (
	"errors"
	"net/http"
	"runtime"

	"github.com/go-chi/chi/v5"

	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/text"
	"github.com/stepserve/stepserve/serving"
)

// API is TGI's door over the core it is built on.
type API struct{ c *core.Core }

// New builds TGI's door over c.
func New(c *core.Core) *API { return &API{c: c} }

var tgiAPI = text.Protocol{Label: core.ProtocolTGI, WriteError: writeError}

// Routes adds TGI's own routes, behind the inference tokens, refusing in
// TGI's error shape. (POST / and GET /info come through TEI's door.)
func (s *API) Routes(r chi.Router) {
	r.Group(func(r chi.Router) {
		r.Use(core.BearerAs(s.c.InferenceTokens, func(w http.ResponseWriter, status int, msg string) {
			writeError(w, status, errors.New(msg))
		}))
		r.Post("/generate", func(w http.ResponseWriter, r *http.Request) {
			text.Serve(s.c, w, r, &tgiAPI, func(t *text.Request, body []byte) int { return s.generate(t, body, routeGenerate) })
		})
		r.Post("/generate_stream", func(w http.ResponseWriter, r *http.Request) {
			text.Serve(s.c, w, r, &tgiAPI, func(t *text.Request, body []byte) int { return s.generate(t, body, routeStream) })
		})
	})
}

// Root answers POST / for a language model (TEI's door chose it): TGI's
// compat route, a stream where the body says "stream": true, else an
// array of one answer. The call is counted as TGI's from here.
func (s *API) Root(t *text.Request, body []byte) int {
	t.Relabel(core.ProtocolTGI, writeError)
	return s.generate(t, body, routeCompat)
}

// Info answers GET /info for the language model m (TEI's door chose it).
func (s *API) Info(w http.ResponseWriter, m *serving.Model) {
	cfg := m.Model()
	g := m.GenerationOptions()
	core.WriteJSON(w, http.StatusOK, map[string]any{
		"model_id":                cfg.Name,
		"model_sha":               nil,
		"model_pipeline_tag":      "text-generation",
		"max_concurrent_requests": g.MaxNumSeqs + g.MaxQueueSize,
		"max_best_of":             1,
		"max_stop_sequences":      maxStops,
		"max_input_tokens":        g.MaxModelLen - 1,
		"max_total_tokens":        g.MaxModelLen,
		"validation_workers":      runtime.GOMAXPROCS(0), // every request is validated on its own goroutine
		"max_client_batch_size":   1,
		"router":                  "stepserve",
		"version":                 s.c.Opts.Version,
		"sha":                     nil,
		"docker_label":            nil,
	})
}

// errorType is TGI's error type and status for a refusal of status.
func errorType(status int, err error) (string, int) {
	switch {
	case status == http.StatusBadRequest, status == http.StatusUnprocessableEntity:
		return "validation", http.StatusUnprocessableEntity
	case status == http.StatusServiceUnavailable && text.Overloaded(err), status == http.StatusTooManyRequests:
		return "overloaded", http.StatusTooManyRequests
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
		return "authentication", status
	case status == http.StatusNotFound, status == http.StatusRequestEntityTooLarge:
		return "validation", status
	case status == http.StatusServiceUnavailable:
		return "unhealthy", status
	case status == http.StatusGatewayTimeout:
		return "incomplete_generation", status
	}
	return "generation", http.StatusFailedDependency
}

// errorBody is TGI's error shape.
func errorBody(typ string, err error) []byte {
	b := append([]byte(`{"error":`), text.AppendJSONText(nil, err.Error())...)
	b = append(b, `,"error_type":"`...)
	b = append(b, typ...)
	return append(b, `"}`...)
}

// writeError writes err in TGI's shape, {"error", "error_type"}, with
// TGI's status for its type: 422 for what the request got wrong, 429
// when the server is busy, 424 for a failed generation.
func writeError(w http.ResponseWriter, status int, err error) {
	if status == core.StatusClientClosed {
		return
	}
	typ, status := errorType(status, err)
	h := w.Header()
	h["Content-Type"] = core.ContentTypeJSON
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	w.Write(append(errorBody(typ, err), '\n'))
}
