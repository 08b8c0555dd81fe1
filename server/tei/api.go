// Package tei is Hugging Face text-embeddings-inference's API as a door
// (tei.go lists its routes): it decodes TEI's bodies into the core's call
// (core.Call, through package text) and encodes its answers and errors
// in TEI's shapes. It imports no other door, and nothing past serving
// (no engine, batcher, generation loop or step runner).
package tei

import (
	"errors"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/text"
	"github.com/stepserve/stepserve/serving"
)

// API is TEI's door over the core it is built on.
type API struct {
	c   *core.Core
	gen Generative
}

// Generative answers TEI's shared routes for a language model: Hugging
// Face's text-generation-inference (server/tgi) shares POST / and GET
// /info with TEI, so the model the request names (or the only one)
// decides which API answers.
type Generative interface {
	Root(t *text.Request, body []byte) int
	Info(w http.ResponseWriter, m *serving.Model)
}

// New builds TEI's door over c; gen, when not nil, answers POST / and
// GET /info for language models.
func New(c *core.Core, gen Generative) *API { return &API{c: c, gen: gen} }

var teiAPI = text.Protocol{Label: core.ProtocolTEI, WriteError: writeTEIError}

// Routes adds TEI's routes: behind the inference tokens, refusing in
// TEI's error shape, but for the health checks, which are open as
// /v2/health is (probes carry no token).
func (s *API) Routes(r chi.Router) {
	r.Group(func(r chi.Router) {
		r.Use(core.BearerAs(s.c.InferenceTokens, func(w http.ResponseWriter, status int, msg string) {
			writeTEIError(w, status, errors.New(msg))
		}))
		r.Post("/embed", s.tei(s.teiEmbed))
		r.Post("/embed_all", s.tei(s.teiEmbedAll))
		r.Post("/similarity", s.tei(s.teiSimilarity))
		r.Post("/rerank", s.tei(s.teiRerank))
		r.Post("/predict", s.tei(s.teiPredict))
		r.Post("/tokenize", s.tei(s.teiTokenize))
		r.Post("/decode", s.tei(s.teiDecode))
		r.Get("/info", s.teiInfo)
		// Hugging Face's Inference Endpoints post to /, SageMaker to
		// /invocations.
		r.Post("/", s.tei(s.teiDispatch))
		r.Post("/invocations", s.tei(s.teiDispatch))
	})
	// /ping is SageMaker's health check; GET / the Inference API's.
	r.Get("/health", s.teiHealth)
	r.Get("/ping", s.teiHealth)
	r.Get("/", s.teiHealth)
}
