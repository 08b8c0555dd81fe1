package openai

// OpenAI's embeddings API, for the models that serve embeddings:
//
//	POST /v1/embeddings
//	GET  /v1/models
//	GET  /v1/models/{model}
//
// Bodies, answers and errors are OpenAI's shapes, so that an OpenAI client
// works unchanged with base_url pointing here.

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"

	"github.com/go-chi/chi/v5"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/text"
	"github.com/stepserve/stepserve/serving"
)

// openaiEmbeddingsRequest is the body of POST /v1/embeddings.
type openaiEmbeddingsRequest struct {
	Input          text.StringOrList `json:"input"`
	Model          string            `json:"model"`
	EncodingFormat string            `json:"encoding_format"`
	Dimensions     *int              `json:"dimensions"`
	User           string            `json:"user"` // accepted, and ignored
}

func (s *API) openaiEmbeddings(w http.ResponseWriter, r *http.Request) {
	text.Serve(s.c, w, r, &openaiAPI, func(t *text.Request, body []byte) int {
		var req openaiEmbeddingsRequest
		if err := t.DecodeJSON(body, &req, "input"); err != nil {
			return t.Fail(text.WithParam("input", err))
		}
		if req.Model == "" {
			return t.Fail(text.WithParam("model", apierr.BadRequest("model is required: the name of a model served here (GET /v1/models lists them)")))
		}
		tm, err := t.Choose(req.Model, "/v1/embeddings", text.KindEmbedding)
		if err != nil {
			var ae *apierr.Error
			if errors.As(err, &ae) && ae.Status == http.StatusUnprocessableEntity {
				err = &apierr.Error{Status: http.StatusBadRequest, Msg: ae.Msg} // OpenAI answers a bad request 400
			}
			return t.Fail(text.WithParam("model", err))
		}
		if !req.Input.Set {
			return t.Fail(text.WithParam("input", apierr.BadRequest("input is required: a string or an array of strings")))
		}
		texts := req.Input.List
		if err := t.CheckTexts(len(texts), "input"); err != nil {
			return t.Fail(text.WithParam("input", err))
		}
		asBase64 := false
		switch req.EncodingFormat {
		case "", "float":
		case "base64":
			asBase64 = true
		default:
			return t.Fail(text.WithParam("encoding_format", apierr.BadRequest(fmt.Sprintf("encoding_format %q is not supported; want float or base64", apierr.ClipName(req.EncodingFormat)))))
		}
		m := t.Model().Model()
		dims := tm.Width
		if req.Dimensions != nil {
			if d := *req.Dimensions; d < 1 || d > tm.Width {
				return t.Fail(text.WithParam("dimensions", apierr.BadRequest(fmt.Sprintf("dimensions %d is out of range; model %s gives embeddings of %d, so want 1..%[3]d", d, m.Name, tm.Width))))
			}
			dims = *req.Dimensions
		}
		// The answer beyond OIP's JSON bound: each row's object, the model
		// name and usage; base64 is shorter than the floats OIP bounds.
		extra := int64(len(texts))*64 + 128 + 6*int64(len(m.Name))
		res, bound, err := t.InferTexts(tm, texts, nil, extra)
		if err != nil {
			return t.Fail(text.WithParam("input", err))
		}
		m = t.Model().Model()
		normalized := m.Config.Encoder != nil && m.Config.Encoder.Normalize
		out := res.Outputs[tm.Output]
		b := make([]byte, 0, bound)
		b = append(b, `{"object":"list","data":[`...)
		var raw []byte
		for i := range texts {
			v := text.RowFloats(out, i, tm.Width)
			if dims < tm.Width {
				v = v[:dims]
				if normalized {
					text.Normalize(v)
				}
			}
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"object":"embedding","index":`...)
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, `,"embedding":`...)
			if asBase64 {
				raw = raw[:0]
				for _, x := range v {
					raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(x))
				}
				b = append(b, '"')
				b = base64.StdEncoding.AppendEncode(b, raw)
				b = append(b, '"')
			} else if b, err = text.AppendFloats(b, v); err != nil {
				return t.Fail(fmt.Errorf("model %s: %w", m.Name, err))
			}
			b = append(b, '}')
		}
		n := res.Tokens()
		b = append(b, `],"model":`...)
		b = strconv.AppendQuote(b, m.Name)
		b = append(b, `,"usage":{"prompt_tokens":`...)
		b = strconv.AppendInt(b, int64(n), 10)
		b = append(b, `,"total_tokens":`...)
		b = strconv.AppendInt(b, int64(n), 10)
		b = append(b, "}}"...)
		return t.OK(b, res)
	})
}

// openaiModel is OpenAI's model object. A language model's says, besides,
// what vLLM's does (max_model_len) and what it serves (capabilities, as
// ollama lists them: completion, and chat where its chat template is
// served), with why its chat template was refused at load, if it was.
type openaiModel struct {
	ID                  string   `json:"id"`
	Object              string   `json:"object"`
	Created             int64    `json:"created"`
	OwnedBy             string   `json:"owned_by"`
	MaxModelLen         int      `json:"max_model_len,omitempty"`
	Capabilities        []string `json:"capabilities,omitempty"`
	ChatTemplateRefused string   `json:"chat_template_refused,omitempty"`
}

// newOpenAIModel is m as OpenAI lists a model; created is when it was
// loaded (Unix seconds).
func newOpenAIModel(m *serving.Model) openaiModel {
	om := openaiModel{ID: m.Model().Name, Object: "model", Created: m.LoadedAt().Unix(), OwnedBy: "stepserve"}
	if m.Generative() {
		om.MaxModelLen = m.GenerationOptions().MaxModelLen
		om.Capabilities = []string{"completion"}
		if m.ChatTemplate() {
			om.Capabilities = append(om.Capabilities, "chat")
		}
		om.ChatTemplateRefused = m.ChatTemplateRefused()
	}
	return om
}

// openaiModels lists the models that serve embeddings or generate text.
func (s *API) openaiModels(w http.ResponseWriter, r *http.Request) {
	list := []openaiModel{}
	for _, m := range s.c.Opts.Models.Models() {
		if text.SigOf(m.Model()).Kind == text.KindEmbedding || m.Generative() {
			list = append(list, newOpenAIModel(m))
		}
	}
	slices.SortFunc(list, func(a, b openaiModel) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	core.WriteJSON(w, http.StatusOK, map[string]any{"object": "list", "data": list})
}

// openaiModelInfo answers one model, when it serves embeddings.
func (s *API) openaiModelInfo(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "model")
	m, err := s.c.Lookup(name, "")
	if err == nil && text.SigOf(m.Model()).Kind != text.KindEmbedding && !m.Generative() {
		err = apierr.NotFound(fmt.Sprintf("model %s does not serve embeddings; it serves %s", m.Model().Name, text.SigOf(m.Model()).Kind))
	}
	if err != nil {
		writeOpenAIError(w, http.StatusNotFound, text.WithParam("model", err))
		return
	}
	core.WriteJSON(w, http.StatusOK, newOpenAIModel(m))
}

// writeOpenAIError writes err in OpenAI's error shape:
// {"error":{"message","type","param","code"}}.
func writeOpenAIError(w http.ResponseWriter, status int, err error) {
	if status == core.StatusClientClosed {
		return
	}
	typ, code := "invalid_request_error", ""
	switch {
	case status == http.StatusUnauthorized:
		code = "invalid_api_key"
	case status == http.StatusNotFound:
		code = "model_not_found"
	case status == http.StatusRequestEntityTooLarge:
		code = "request_too_large"
	case status == http.StatusServiceUnavailable && text.Overloaded(err):
		typ, code = "server_error", "overloaded"
	case status == http.StatusServiceUnavailable:
		typ, code = "server_error", "model_not_ready"
	case status == http.StatusGatewayTimeout:
		typ, code = "server_error", "timeout"
	case status >= 500:
		typ = "server_error"
	}
	var param *string
	var pe *text.ParamError
	if errors.As(err, &pe) && status < 500 && status != http.StatusUnauthorized {
		param = &pe.Param
	}
	var codePtr *string
	if code != "" {
		codePtr = &code
	}
	type detail struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	b, _ := json.Marshal(struct {
		Error detail `json:"error"`
	}{detail{err.Error(), typ, param, codePtr}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
