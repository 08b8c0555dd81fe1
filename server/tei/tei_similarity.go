package tei

import (
	"fmt"
	"math"

	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/text"
)

// teiSimilarityRequest is POST /similarity's body, TEI's: the texts under
// inputs, the options under parameters (what Hugging Face's
// sentence-similarity task sends).
type teiSimilarityRequest struct {
	Inputs *struct {
		SourceSentence *string  `json:"source_sentence"`
		Sentences      []string `json:"sentences"`
	} `json:"inputs"`
	Parameters *struct {
		teiTruncation
		PromptName *string `json:"prompt_name"`
	} `json:"parameters"`
	Model string `json:"model"`
}

// teiSimilarity answers /similarity: the cosine similarity of each of
// inputs.sentences to inputs.source_sentence, in their order, from the
// embedding model's embeddings of all of them, run as one request.
func (s *API) teiSimilarity(t *text.Request, body []byte) int {
	var req teiSimilarityRequest
	if err := t.DecodeJSON(body, &req, "inputs.sentences"); err != nil {
		return t.Fail(err)
	}
	tm, err := t.Choose(req.Model, "/similarity", text.KindEmbedding)
	if err != nil {
		return t.Fail(err)
	}
	var tr teiTruncation
	if p := req.Parameters; p != nil {
		if err := refusePromptName(p.PromptName); err != nil {
			return t.Fail(err)
		}
		tr = p.teiTruncation
	}
	in := req.Inputs
	switch {
	case in == nil:
		return t.Fail(apierr.BadRequest(`inputs is required: {"source_sentence": a text, "sentences": [the texts to compare with it]}`))
	case in.SourceSentence == nil:
		return t.Fail(apierr.BadRequest("inputs.source_sentence is required: the text the sentences are compared with"))
	case len(in.Sentences) == 0:
		return t.Fail(text.EmptyRequest("inputs.sentences is empty; send at least one sentence to compare with inputs.source_sentence"))
	}
	texts := make([]string, 0, 1+len(in.Sentences))
	texts = append(append(texts, *in.SourceSentence), in.Sentences...)
	if err := t.CheckTexts(len(texts), "inputs (source_sentence and sentences)"); err != nil {
		return t.Fail(err)
	}
	if texts, err = truncate(t, tm, tr, texts, false); err != nil {
		return t.Fail(err)
	}
	// One number a sentence, shorter than the embedding OIP bounds.
	res, bound, err := t.InferTexts(tm, texts, nil, 2)
	if err != nil {
		return t.Fail(err)
	}
	out := res.Outputs[tm.Output]
	source := text.RowFloats(out, 0, tm.Width)
	b := make([]byte, 0, bound)
	b = append(b, '[')
	for i := 1; i < len(texts); i++ {
		if i > 1 {
			b = append(b, ',')
		}
		if b, err = text.AppendFloat(b, cosine(source, text.RowFloats(out, i, tm.Width))); err != nil {
			return t.Fail(fmt.Errorf("model %s: %w", t.Model().Model().Name, err))
		}
	}
	return t.OK(append(b, ']'), res)
}

// cosine is the cosine similarity of a and b: their dot product over
// their norms, whether or not the model normalizes; 0 when either is the
// zero vector, which has no direction.
func cosine(a, b []float32) float32 {
	var ab, aa, bb float64
	for i := range a {
		x, y := float64(a[i]), float64(b[i])
		ab += x * y
		aa += x * x
		bb += y * y
	}
	if aa == 0 || bb == 0 {
		return 0
	}
	return float32(ab / math.Sqrt(aa*bb))
}
