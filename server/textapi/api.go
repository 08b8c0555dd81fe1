// Package textapi is the text APIs for text models: OpenAI's embeddings
// API (/v1/embeddings, /v1/models) and Hugging Face
// text-embeddings-inference's (/embed, /embed_all, /similarity, /rerank,
// /predict, /tokenize, /decode, /info, /health and SageMaker's /ping and
// /invocations; tei.go lists them). Texts become the model's text inputs
// and run on the same inference path, budget and metrics as OIP requests.
package textapi

import "github.com/stepserve/stepserve/server/core"

// API is the text APIs' door (OpenAI's and TEI's) over the core it is
// built on.
type API struct {
	c *core.Core
	textAPIState
}

// New builds the text APIs over c.
func New(c *core.Core) *API { return &API{c: c} }
