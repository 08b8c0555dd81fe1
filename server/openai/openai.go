// Package openai is OpenAI's API as a door: completions and chat
// completions for language models, embeddings for embedding models, and
// the model list (/v1/models). It decodes OpenAI's bodies into the
// core's call (core.Call, through package text) and encodes its answers
// and errors in OpenAI's shapes, so that an OpenAI client works
// unchanged with base_url pointing here. It imports no other door, and
// nothing past serving (no engine, batcher, generation loop or step
// runner).
package openai

import (
	"errors"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/text"
)

// API is OpenAI's door over the core it is built on.
type API struct {
	c      *core.Core
	stored responseStore // the Responses API's stored responses
}

// New builds OpenAI's door over c.
func New(c *core.Core) *API { return &API{c: c} }

var openaiAPI = text.Protocol{Label: core.ProtocolOpenAI, WriteError: writeOpenAIError}

// Routes adds OpenAI's routes, behind the inference tokens, refusing in
// OpenAI's error shape.
func (s *API) Routes(r chi.Router) {
	r.Group(func(r chi.Router) {
		r.Use(core.BearerAs(s.c.InferenceTokens, func(w http.ResponseWriter, status int, msg string) {
			writeOpenAIError(w, status, errors.New(msg))
		}))
		r.Post("/v1/embeddings", s.openaiEmbeddings)
		r.Post("/v1/completions", s.openaiCompletions)
		r.Post("/v1/chat/completions", s.openaiChat)
		r.Get("/v1/models", s.openaiModels)
		r.Get("/v1/models/{model}", s.openaiModelInfo)
		r.Post("/v1/responses", s.responses)
		r.Get("/v1/responses/{id}", s.storedResponse)
		r.Delete("/v1/responses/{id}", s.deleteResponse)
	})
}
