// Package anthropic is Anthropic's Messages API as a door:
//
//	POST /v1/messages               a message, whole or streamed (Anthropic's events)
//	POST /v1/messages/count_tokens  the tokens a request's prompt is
//
// what coding agents and Anthropic's SDKs send to a local model. It
// decodes Anthropic's bodies (system, messages of text, tool_use and
// tool_result blocks, tools and tool_choice, stop_sequences, sampling)
// into the core's call through package text, and encodes answers,
// stream events and errors in Anthropic's shapes. The inference tokens
// are taken as x-api-key too. It imports no other door, and nothing past
// serving.
package anthropic

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/text"
)

// API is Anthropic's door over the core it is built on.
type API struct{ c *core.Core }

// New builds Anthropic's door over c.
func New(c *core.Core) *API { return &API{c: c} }

var anthropicAPI = text.Protocol{Label: core.ProtocolAnthropic, WriteError: writeError}

// Routes adds the Messages API's routes, behind the inference tokens
// (as a bearer token or x-api-key), refusing in Anthropic's error shape.
func (s *API) Routes(r chi.Router) {
	r.Group(func(r chi.Router) {
		r.Use(apiKeyAsBearer, core.BearerAs(s.c.InferenceTokens, func(w http.ResponseWriter, status int, msg string) {
			writeError(w, status, errors.New(msg))
		}))
		r.Post("/v1/messages", s.messages)
		r.Post("/v1/messages/count_tokens", s.countTokens)
	})
}

// apiKeyAsBearer reads Anthropic's x-api-key header as the bearer token
// a request without an Authorization header carries.
func apiKeyAsBearer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" {
			if k := r.Header.Get("X-Api-Key"); k != "" {
				r.Header.Set("Authorization", "Bearer "+k)
			}
		}
		next.ServeHTTP(w, r)
	})
}

// errorType is Anthropic's error type for a status.
func errorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	return "api_error"
}

// errorBody is Anthropic's error shape.
func errorBody(status int, err error) []byte {
	return text.Marshal(map[string]any{"type": "error", "error": map[string]any{"type": errorType(status), "message": err.Error()}})
}

// writeError writes err in Anthropic's shape, with Retry-After where the
// client should come back.
func writeError(w http.ResponseWriter, status int, err error) {
	if status == core.StatusClientClosed {
		return
	}
	h := w.Header()
	h["Content-Type"] = core.ContentTypeJSON
	if status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	w.Write(errorBody(status, err))
}

// isNull reports whether raw is absent or null.
func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}
