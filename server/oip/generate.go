package oip

// Triton's generate extension, for language models:
//
//	POST /v2/models/{model}[/versions/{v}]/generate         one answer
//	POST /v2/models/{model}[/versions/{v}]/generate_stream  server-sent events
//
// The body's text_input and parameters become one
// serving.GenerateRequest (wire.GenerateParams reads them, as gRPC's
// ModelStreamInfer does); package text runs it through the core's call
// and writes the answer.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/text"
	"github.com/stepserve/stepserve/server/wire"
	"github.com/stepserve/stepserve/serving"
)

var tritonGenerateAPI = text.Protocol{Label: core.ProtocolHTTP, WriteError: writeError}

// tritonGenerate serves Triton's generate extension: generate, or
// generate_stream with stream.
func (s *API) tritonGenerate(stream bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		find := func(t *text.Request) error {
			err := t.FindGenerative(chi.URLParam(r, "model"), chi.URLParam(r, "version"))
			if pe := (*text.ParamError)(nil); errors.As(err, &pe) {
				err = pe.Err // the model is the route's, not a field's
			}
			return err
		}
		text.ServeOn(s.c, w, r, &tritonGenerateAPI, find, func(t *text.Request, body []byte) int {
			var raw map[string]json.RawMessage
			if err := t.DecodeJSON(body, &raw, "text_input"); err != nil {
				return t.Fail(err)
			}
			params := map[string]json.RawMessage{}
			var prompt *string
			var id string
			for k, v := range raw {
				switch k {
				case "id":
					if err := json.Unmarshal(v, &id); err != nil || len(id) > wire.MaxRequestIDBytes {
						return t.Fail(apierr.BadRequest(fmt.Sprintf("id: want a string of at most %d bytes", wire.MaxRequestIDBytes)))
					}
				case "text_input":
					var s string
					if string(bytes.TrimSpace(v)) == "null" || json.Unmarshal(v, &s) != nil {
						return t.Fail(apierr.BadRequest("text_input: want a string"))
					}
					prompt = &s
				case "parameters":
					if err := json.Unmarshal(v, &params); err != nil {
						return t.Fail(apierr.BadRequest("parameters: want an object"))
					}
				default:
					params[k] = v
				}
			}
			if p, ok := raw["parameters"]; ok {
				// A key both beside text_input and in parameters: refused,
				// not one chosen at random.
				var inner map[string]json.RawMessage
				if json.Unmarshal(p, &inner) == nil {
					for k := range inner {
						if _, twice := raw[k]; twice {
							return t.Fail(apierr.BadRequest(fmt.Sprintf("parameter %s is given both in parameters and beside text_input; give it once", apierr.ClipName(k))))
						}
					}
				}
			}
			if prompt == nil {
				return t.Fail(apierr.BadRequest("text_input is required: the prompt, a string"))
			}
			gr, streamParam, err := wire.GenerateParams(params)
			if err != nil {
				return t.Fail(err)
			}
			if streamParam != nil && *streamParam != stream {
				if stream {
					return t.Fail(apierr.BadRequest("stream: false, on generate_stream; use generate for one response"))
				}
				return t.Fail(apierr.BadRequest("stream: true, on generate; use generate_stream for a stream of responses"))
			}
			gr.Prompt = *prompt
			m := t.Model().Model()
			return t.GenerateTo(gr, &tritonWriter{model: m.Name, version: m.Version, id: id, stream: stream})
		})
	}
}

// tritonWriter is Triton's generate extension's answer.
type tritonWriter struct {
	model, version, id string
	stream             bool
}

type tritonGenerateResponse struct {
	ID           string `json:"id,omitempty"`
	ModelName    string `json:"model_name"`
	ModelVersion string `json:"model_version"`
	TextOutput   string `json:"text_output"`
	FinishReason string `json:"finish_reason,omitempty"`
	// Usage, beside what Triton's backends answer.
	PromptTokens     int `json:"prompt_tokens,omitempty"`
	CompletionTokens int `json:"completion_tokens,omitempty"`
}

func (tw *tritonWriter) Streaming() bool { return tw.stream }

func (tw *tritonWriter) Whole(out string, _ []serving.TokenInfo, finish string, prompt, completion int) []byte {
	return text.Marshal(tritonGenerateResponse{tw.id, tw.model, tw.version, out, finish, prompt, completion})
}

func (tw *tritonWriter) First(int) []byte { return nil }

func (tw *tritonWriter) Chunk(ev serving.TextEvent) []byte {
	return text.SSE(text.Marshal(tritonGenerateResponse{ID: tw.id, ModelName: tw.model, ModelVersion: tw.version, TextOutput: ev.Text, FinishReason: ev.Finish}))
}

func (tw *tritonWriter) End(int, int) []byte { return nil }

func (tw *tritonWriter) StreamError(err error) []byte {
	return text.SSE(text.Marshal(map[string]string{"error": err.Error()}))
}
