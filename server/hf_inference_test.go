package server

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Hugging Face's JS inference client (npm @huggingface/inference, pinned
// in testdata/hf-inference; make deps installs it) works unchanged against
// the TEI endpoints, with the inference token: featureExtraction,
// sentenceSimilarity and textClassification through TEI's own endpoints
// and through POST / and /invocations, and its error type.
func TestHFInferenceJSClient(t *testing.T) {
	fx := newTextFixture(t, textOptions{tokens: []string{"tok"}})
	b := nodeScript(t, "hf-inference", "@huggingface/inference", "client.mjs", fx.url, "STEPSERVE_TOKEN=tok")
	type prediction struct {
		Label string  `json:"label"`
		Score float64 `json:"score"`
	}
	var out struct {
		Features           [][]float32  `json:"features"`
		FeaturesRoot       [][]float32  `json:"featuresRoot"`
		Similarity         []float64    `json:"similarity"`
		SimilarityRoot     []float64    `json:"similarityRoot"`
		Classification     []prediction `json:"classification"`
		ClassificationRoot []prediction `json:"classificationRoot"`
		Error              struct {
			Name    string `json:"name"`
			Status  int    `json:"status"`
			Message string `json:"message"`
			Body    struct {
				Error     string `json:"error"`
				ErrorType string `json:"error_type"`
			} `json:"body"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(b, &out), string(b))

	// What the endpoints answer over plain HTTP (TestTEIEmbed holds
	// /embed to OIP).
	embed := func(texts ...string) [][]float32 {
		st, b := fx.post(t, "/embed", map[string]any{"inputs": texts}, "Authorization", "Bearer tok")
		require.Equal(t, 200, st, string(b))
		var v [][]float32
		require.NoError(t, json.Unmarshal(b, &v))
		return v
	}
	emb := embed("hello world", "a second text")
	assertVectors(t, emb, out.Features)
	assertVectors(t, emb[:1], out.FeaturesRoot)

	sim := embed("what is a bucket?", "a compiled shape", "what is a bucket?")
	require.Len(t, out.Similarity, 2)
	assert.InDelta(t, cosine64(sim[0], sim[1]), out.Similarity[0], 1e-5)
	assert.InDelta(t, 1, out.Similarity[1], 1e-5, "the same sentence")
	assert.InDelta(t, out.Similarity[0], out.SimilarityRoot[0], 1e-6)
	assert.InDelta(t, out.Similarity[1], out.SimilarityRoot[1], 1e-6)

	st, want := fx.post(t, "/predict?model=classifier", `{"inputs":"I love this"}`, "Authorization", "Bearer tok")
	require.Equal(t, 200, st, string(want))
	var direct []prediction
	require.NoError(t, json.Unmarshal(want, &direct))
	require.Len(t, direct, 3)
	assert.Equal(t, direct, out.Classification)
	assert.Equal(t, direct, out.ClassificationRoot)
	labels := map[string]bool{}
	for _, p := range out.Classification {
		labels[p.Label] = true
	}
	assert.Equal(t, map[string]bool{"negative": true, "neutral": true, "positive": true}, labels)

	assert.Equal(t, "ProviderApiError", out.Error.Name)
	assert.Equal(t, 400, out.Error.Status)
	assert.Equal(t, "Empty", out.Error.Body.ErrorType)
	assert.Contains(t, out.Error.Message, "inputs is empty")
}

// The same client's text generation at a stepserve endpoint serving a
// language model: textGeneration and textGenerationStream, as a TGI
// endpoint's user calls them (this client posts them to /v1/completions
// with the endpoint's URL as the model and TGI's parameters beside the
// prompt: the URL names the only language model, and TGI's keys are
// read), the greedy text the completions API writes, and a refusal.
func TestHFInferenceJSTextGeneration(t *testing.T) {
	f := newGenFixture(t, "")
	b := nodeScript(t, "hf-inference", "@huggingface/inference", "generate.mjs", f.srv.URL)
	var out struct {
		Text struct {
			GeneratedText string `json:"generated_text"`
		} `json:"text"`
		Chunks []struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		} `json:"chunks"`
		Error struct {
			Name    string `json:"name"`
			Status  int    `json:"status"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(b, &out), string(b))
	st, body := f.post(t, "/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "the cat sat on", "max_tokens": 12, "temperature": 0})
	require.Equal(t, 200, st, string(body))
	var c completion
	require.NoError(t, json.Unmarshal(body, &c))
	assert.Equal(t, c.Choices[0].Text, out.Text.GeneratedText)
	var streamed strings.Builder
	for _, ch := range out.Chunks {
		for _, choice := range ch.Choices {
			streamed.WriteString(choice.Text)
		}
	}
	assert.Equal(t, c.Choices[0].Text, streamed.String())
	assert.Equal(t, "ProviderApiError", out.Error.Name)
	assert.Equal(t, 400, out.Error.Status)
	assert.Contains(t, out.Error.Message, "max_tokens")
}
