package tei

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/stepserve/stepserve/server/text"
)

// teiDispatch answers POST / (Hugging Face's Inference Endpoints) and
// POST /invocations (SageMaker's) as TEI does: by the kind of the model,
// which the request names as the other endpoints name it, or else the
// only model any TEI endpoint serves. A reranker's body goes to /rerank,
// a classifier's to /predict, an embedding model's to /embed, or to
// /similarity when its inputs is an object ({"source_sentence",
// "sentences"}, Hugging Face's sentence-similarity task): TEI chooses
// between those two by its TASK variable, stepserve by the body.
func (s *API) teiDispatch(t *text.Request, body []byte) int {
	// Read for the model's name and the inputs' shape, charged as the
	// body again (the name is at most that); the endpoint it goes to
	// decodes the body, and answers one that does not decode.
	var peek struct {
		Model      string                     `json:"model"`
		Inputs     objectProbe                `json:"inputs"`
		Parameters map[string]json.RawMessage `json:"parameters"`
		Stream     json.RawMessage            `json:"stream"`
	}
	if err := t.Take(int64(len(body)), "decoding the request"); err != nil {
		return t.Fail(err)
	}
	_ = json.Unmarshal(body, &peek)
	kinds := []text.Kind{text.KindEmbedding, text.KindClassifier, text.KindReranker}
	switch {
	case peek.Inputs.object:
		// Sentence similarity: only an embedding model answers it, so
		// without a name it goes to the only one (a client such as
		// @huggingface/inference's sentenceSimilarity names none).
		kinds = kinds[:1]
	case s.gen != nil && (generationParameters(peek.Parameters) || peek.Stream != nil):
		// TGI's body (inputs with generation parameters, or stream): a
		// language model's, the only one unless it names one.
		kinds = []text.Kind{text.KindGenerative}
	default:
		kinds = s.withGenerative(peek.Model, t.R, kinds)
	}
	tm, err := t.Choose(peek.Model, "POST "+t.R.URL.Path, kinds...)
	if err != nil {
		return t.Fail(err)
	}
	switch tm.Kind {
	case text.KindGenerative:
		return s.gen.Root(t, body)
	case text.KindReranker:
		return s.teiRerank(t, body)
	case text.KindClassifier:
		return s.teiPredict(t, body)
	}
	if peek.Inputs.object {
		return s.teiSimilarity(t, body)
	}
	return s.teiEmbed(t, body)
}

// tgiOnly are the parameters of TGI's generate that no TEI task (nor
// Hugging Face's classification and feature-extraction bodies) takes.
var tgiOnly = []string{"max_new_tokens", "do_sample", "temperature", "top_p", "typical_p", "repetition_penalty", "frequency_penalty",
	"stop", "seed", "details", "decoder_input_details", "return_full_text", "best_of", "watermark", "top_n_tokens", "grammar", "adapter_id"}

// generationParameters reports whether params holds one of TGI's own.
func generationParameters(params map[string]json.RawMessage) bool {
	for _, k := range tgiOnly {
		if _, ok := params[k]; ok {
			return true
		}
	}
	return false
}

// withGenerative is kinds, with language models where TGI's door is
// mounted and the request names its model (named, or ?model=) or no
// model of kinds is served: without a name, TEI's models answer first.
func (s *API) withGenerative(named string, r *http.Request, kinds []text.Kind) []text.Kind {
	if s.gen == nil {
		return kinds
	}
	if named != "" || r.URL.Query().Get("model") != "" {
		return append(kinds, text.KindGenerative)
	}
	for _, m := range s.c.Opts.Models.Models() {
		if text.SigOf(m.Model()).Kind.Serves(kinds) {
			return kinds
		}
	}
	return []text.Kind{text.KindGenerative}
}

// objectProbe records whether a JSON value is an object, decoding
// nothing.
type objectProbe struct{ object bool }

func (p *objectProbe) UnmarshalJSON(b []byte) error {
	b = bytes.TrimLeft(b, " \t\r\n")
	p.object = len(b) > 0 && b[0] == '{'
	return nil
}
