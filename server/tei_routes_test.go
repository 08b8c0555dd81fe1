package server

import (
	"context"
	"encoding/json"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/serving"
)

// metricLine is the line of the /metrics text that begins with series.
func metricLine(t *testing.T, metrics, series string) string {
	t.Helper()
	for line := range strings.Lines(metrics) {
		if strings.HasPrefix(line, series+" ") {
			return strings.TrimSuffix(line, "\n")
		}
	}
	return ""
}

// cosine64 is the cosine similarity of a and b.
func cosine64(a, b []float32) float64 {
	var ab, aa, bb float64
	for i := range a {
		ab += float64(a[i]) * float64(b[i])
		aa += float64(a[i]) * float64(a[i])
		bb += float64(b[i]) * float64(b[i])
	}
	return ab / math.Sqrt(aa*bb)
}

// teiCase is a request to a TEI endpoint and the error it must get.
type teiCase struct {
	path, body string
	status     int
	typ, msg   string
}

func (fx *textFixture) assertTEIErrors(t *testing.T, cases []teiCase) {
	t.Helper()
	for _, tc := range cases {
		st, b := fx.post(t, tc.path, tc.body)
		assert.Equal(t, tc.status, st, "%s %.80s: %s", tc.path, tc.body, b)
		var e teiError
		decodeStrict(t, b, &e)
		assert.Equal(t, tc.typ, e.ErrorType, "%s %.80s", tc.path, tc.body)
		assert.Contains(t, e.Error, tc.msg, "%s %.80s", tc.path, tc.body)
	}
}

// texts is n copies of "a", as a JSON list.
func texts(t *testing.T, n int) string {
	b, err := json.Marshal(slices.Repeat([]string{"a"}, n))
	require.NoError(t, err)
	return string(b)
}

// /similarity: the cosine of each sentence's embedding to the source
// sentence's, in order; TEI's parameters (truncation) honoured.
func TestTEISimilarity(t *testing.T) {
	fx := newTextFixture(t, textOptions{})
	source := "what is a bucket?"
	sentences := []string{"a compiled shape", "what is a bucket?", "버킷은 모양입니다"}
	emb := fx.oipEmbeddings(t, "tiny-encoder", append([]string{source}, sentences...))
	st, b := fx.post(t, "/similarity", map[string]any{"inputs": map[string]any{"source_sentence": source, "sentences": sentences}})
	require.Equal(t, 200, st, string(b))
	var got []float64
	decodeStrict(t, b, &got)
	require.Len(t, got, len(sentences))
	for i := range sentences {
		assert.InDelta(t, cosine64(emb[0], emb[i+1]), got[i], 1e-5, "sentence %d", i)
	}
	assert.InDelta(t, 1, got[1], 1e-5, "the same sentence")
	assert.Less(t, got[0], 0.999, "a different sentence")

	// truncation_direction Left keeps the end of a long source: exactly
	// the tail that fits, so its similarity to that tail is 1; Right (the
	// model's own cut) keeps its start.
	m := fx.model(t, "tiny-encoder")
	long := strings.Repeat("alpha beta ", 100) + strings.Repeat("omega end ", 100)
	toks, err := m.Tokenizer.Tokenize(long)
	require.NoError(t, err)
	words := toks[1 : len(toks)-1]
	tail := long[words[len(words)-126].Start:]
	for dir, want := range map[string]bool{"Left": true, "Right": false} {
		st, b = fx.post(t, "/similarity?model=tiny-encoder", map[string]any{
			"inputs":     map[string]any{"source_sentence": long, "sentences": []string{tail}},
			"parameters": map[string]any{"truncate": true, "truncation_direction": dir}})
		require.Equal(t, 200, st, "%s: %s", dir, b)
		decodeStrict(t, b, &got)
		if want {
			assert.InDelta(t, 1, got[0], 1e-5, dir)
		} else {
			assert.Less(t, got[0], 0.99, dir)
		}
	}

	fx.assertTEIErrors(t, []teiCase{
		{"/similarity", `{"inputs":{"source_sentence":"a","sentences":[]}}`, 400, "Empty", "inputs.sentences is empty"},
		{"/similarity", `{"inputs":{"sentences":["a"]}}`, 422, "Validation", "inputs.source_sentence is required"},
		{"/similarity", `{}`, 422, "Validation", "inputs is required"},
		{"/similarity", `{"inputs":"a"}`, 422, "Validation", "inputs"},
		{"/similarity", `{"inputs":{"source_sentence":"a","sentences":` + texts(t, 2048) + `}}`, 413, "Validation", "2049 texts, more than the 2048"},
		{"/similarity", `{"inputs":{"source_sentence":"a","sentences":["b"]},"model":"classifier"}`, 422, "Validation", "model classifier serves classification (/predict), not /similarity"},
		{"/similarity", `{"inputs":{"source_sentence":"a","sentences":["b"]},"parameters":{"prompt_name":"query"}}`, 422, "Validation", "prompt_name is not supported"},
		{"/similarity", `{"inputs":{"source_sentence":"a","sentences":["b"]},"parameters":{"truncation_direction":"Middle"}}`, 422, "Validation", `truncation_direction "Middle"`},
	})
}

// /embed_all: every engine pools inside its step, so an embedding model
// cannot give its tokens' states; the request is checked as /embed's,
// then refused as TEI refuses a model that cannot (424, Backend).
func TestTEIEmbedAll(t *testing.T) {
	fx := newTextFixture(t, textOptions{})
	fx.assertTEIErrors(t, []teiCase{
		{"/embed_all", `{"inputs":"hello"}`, 424, "Backend", "embed_all is not available for model tiny-encoder: its engine pools the tokens' states inside the step (encoder.pooling: mean)"},
		{"/embed_all", `{"inputs":["a","b"],"truncate":true,"model":"tiny-encoder"}`, 424, "Backend", "POST /embed answers the pooled embeddings"},
		{"/embed_all", `{"inputs":[]}`, 400, "Empty", "inputs is empty"},
		{"/embed_all", `{"inputs":` + texts(t, 2049) + `}`, 413, "Validation", "2049 texts, more than the 2048"},
		{"/embed_all", `{"inputs":"a","model":"classifier"}`, 422, "Validation", "model classifier serves classification (/predict), not /embed_all"},
		{"/embed_all", `{"inputs":5}`, 422, "Validation", "inputs: want a string or an array of strings"},
	})
	// The two 424s, the 400 and the 413: each had chosen tiny-encoder.
	assert.Equal(t, `stepserve_requests_total{model="tiny-encoder",outcome="invalid",protocol="tei"} 4`,
		metricLine(t, fx.metrics(t), `stepserve_requests_total{model="tiny-encoder",outcome="invalid",protocol="tei"}`))
}

// /decode: the text of token ids by the model's tokenizer.json, special
// tokens skipped unless asked for; one text a list.
func TestTEIDecode(t *testing.T) {
	for _, tc := range []struct {
		tokenizer, text, want, withSpecial string
	}{
		{"wordpiece", "Hello, world!", "hello, world!", "[CLS] hello, world! [SEP]"},
		{"bpe", "a 😀 日本語のテキスト", "a 😀 日本語のテキスト", "<s>a 😀 日本語のテキスト</s>"},
		{"unigram", "Hello world", "Hello world", "<s> Hello world</s>"},
	} {
		t.Run(tc.tokenizer, func(t *testing.T) {
			fx := newTextFixture(t, textOptions{onlyTiny: true, tokenizer: tc.tokenizer})
			m := fx.model(t, "tiny-encoder")
			ids, err := m.Tokenizer.AppendEncode(nil, tc.text, 128, false)
			require.NoError(t, err)
			st, b := fx.post(t, "/decode", map[string]any{"ids": ids})
			require.Equal(t, 200, st, string(b))
			var got []string
			decodeStrict(t, b, &got)
			assert.Equal(t, []string{tc.want}, got)

			words := ids[1 : len(ids)-1]
			st, b = fx.post(t, "/decode", map[string]any{"ids": [][]int64{ids, words, {}}, "skip_special_tokens": false, "model": "tiny-encoder"})
			require.Equal(t, 200, st, string(b))
			decodeStrict(t, b, &got)
			assert.Equal(t, []string{tc.withSpecial, tc.want, ""}, got)
		})
	}

	fx := newTextFixture(t, textOptions{onlyTiny: true, tokenizer: "wordpiece"})
	st, b := fx.post(t, "/decode", `{"ids":[]}`)
	require.Equal(t, 200, st, string(b))
	assert.JSONEq(t, `[""]`, string(b), "[] is one empty list, as in TEI")
	lists, err := json.Marshal(slices.Repeat([][]int64{{5}}, 2049))
	require.NoError(t, err)
	fx.assertTEIErrors(t, []teiCase{
		{"/decode", `{"ids":[2,99999,3]}`, 422, "Validation", "ids: list 0 holds 99999, which is not a token id of model tiny-encoder; its ids are 0..444"},
		{"/decode", `{"ids":[[2],[-1]]}`, 422, "Validation", "ids: list 1 holds -1"},
		{"/decode", `{"ids":"hello"}`, 422, "Validation", "ids: want a list of token ids, or a list of such lists"},
		{"/decode", `{"ids":[[1],2]}`, 422, "Validation", "ids: want a list of token ids"},
		{"/decode", `{"ids":[1.5]}`, 422, "Validation", "ids: want a list of token ids"},
		{"/decode", `{"ids":[5,null]}`, 422, "Validation", "ids: want a list of token ids"},
		{"/decode", `{"ids":[[5],null]}`, 422, "Validation", "ids: want a list of token ids"},
		{"/decode", `{"skip_special_tokens":true}`, 422, "Validation", "ids is required"},
		{"/decode", `{"ids":` + string(lists) + `}`, 413, "Validation", "ids holds 2049 lists, more than the 2048"},
		{"/decode", `{"ids":[1],"model":"nope"}`, 404, "Validation", "nope"},
	})

	// tiny-encoder's own vocab.txt decodes as transformers' BertTokenizer
	// does: pieces joined, "##" glued on, spaces before punctuation gone.
	vocab := newTextFixture(t, textOptions{onlyTiny: true})
	m := vocab.model(t, "tiny-encoder")
	_, isVocab := m.Tokenizer.(*models.Tokenizer)
	require.True(t, isVocab, "tiny-encoder ships a vocab.txt")
	ids, err := m.Tokenizer.AppendEncode(nil, "Hello, world!", 128, false)
	require.NoError(t, err)
	st, b = vocab.post(t, "/decode", map[string]any{"ids": [][]int64{ids, {}}})
	require.Equal(t, 200, st, string(b))
	var got []string
	decodeStrict(t, b, &got)
	assert.Equal(t, []string{"hello, world!", ""}, got)
	st, b = vocab.post(t, "/decode", map[string]any{"ids": ids, "skip_special_tokens": false})
	require.Equal(t, 200, st, string(b))
	decodeStrict(t, b, &got)
	assert.Equal(t, []string{"[CLS] hello, world! [SEP]"}, got)
}

// POST / and POST /invocations answer as the endpoint the model's kind
// calls for: the same bodies, the same answers.
func TestTEIDispatch(t *testing.T) {
	fx := newTextFixture(t, textOptions{})
	same := func(direct, path string, body any) {
		t.Helper()
		st, want := fx.post(t, direct, body)
		require.Equal(t, 200, st, string(want))
		for _, root := range []string{"/", "/invocations"} {
			p := root + strings.TrimPrefix(path, "/")
			st, got := fx.post(t, p, body)
			require.Equal(t, 200, st, "%s: %s", p, got)
			assert.JSONEq(t, string(want), string(got), p)
		}
	}
	same("/embed?model=tiny-encoder", "?model=tiny-encoder", map[string]any{"inputs": []string{"hello", "world"}})
	same("/embed", "", map[string]any{"inputs": "hello", "model": "tiny-encoder"})
	sim := map[string]any{"inputs": map[string]any{"source_sentence": "hello", "sentences": []string{"world", "hello"}}, "model": "tiny-encoder"}
	same("/similarity", "", sim)
	// Sentence similarity naming no model: only an embedding model
	// answers it, and tiny-encoder is the only one here.
	st, b := fx.post(t, "/", map[string]any{"inputs": sim["inputs"]})
	require.Equal(t, 200, st, string(b))
	_, want := fx.post(t, "/similarity", sim)
	assert.Equal(t, string(want), string(b))
	same("/predict?model=classifier", "?model=classifier", map[string]any{"inputs": "I love this"})
	same("/predict", "", map[string]any{"inputs": [][]string{{"I love this"}, {"meh"}}, "model": "scorer"})
	same("/rerank", "", map[string]any{"query": "what?", "texts": []string{"first", "second"}, "model": "reranker"})

	fx.assertTEIErrors(t, []teiCase{
		{"/", `{"inputs":"a"}`, 422, "Validation", `4 models answer POST /; name one with "model" in the body or ?model=: classifier, reranker, scorer, tiny-encoder`},
		{"/invocations", `{"inputs":"a"}`, 422, "Validation", "4 models answer POST /invocations"},
		{"/?model=nope", `{"inputs":"a"}`, 404, "Validation", "nope"},
		{"/?model=classifier", `{"inputs":5}`, 422, "Validation", "inputs: want a string, a pair"},
		{"/?model=reranker", `{"texts":["a"]}`, 422, "Validation", "query is required"},
	})

	// One model: no name needed; a body that does not decode is answered
	// by the endpoint it went to.
	tiny := newTextFixture(t, textOptions{onlyTiny: true})
	st, b = tiny.post(t, "/", `{"inputs":"hello"}`)
	require.Equal(t, 200, st, string(b))
	var emb [][]float32
	decodeStrict(t, b, &emb)
	assertVectors(t, tiny.oipEmbeddings(t, "tiny-encoder", []string{"hello"}), emb)
	tiny.assertTEIErrors(t, []teiCase{
		{"/", `{"inputs":"a"`, 422, "Validation", "malformed JSON"},
		{"/invocations", `{"inputs":{"source_sentence":"a","sentences":[]}}`, 400, "Empty", "inputs.sentences is empty"},
	})
	assert.Equal(t, `stepserve_requests_total{model="tiny-encoder",outcome="success",protocol="tei"} 1`,
		metricLine(t, tiny.metrics(t), `stepserve_requests_total{model="tiny-encoder",outcome="success",protocol="tei"}`))
}

// The health checks: 200 with no body when the TEI models are ready, 503
// Unhealthy when one is not or none is served; open without the token
// the other endpoints want, but asking after one model (?model=) takes
// it, so that a caller without it learns nothing of the models.
func TestTEIHealth(t *testing.T) {
	fx := newTextFixture(t, textOptions{tokens: []string{"tok"}})
	for _, p := range []string{"/health", "/ping", "/"} {
		st, b := fx.get(t, p)
		assert.Equal(t, 200, st, "%s: %s", p, b)
		assert.Empty(t, b, p)
	}
	for _, p := range []string{"/health?model=classifier", "/health?model=nope"} {
		st, b := fx.get(t, p)
		assert.Equal(t, 401, st, "%s: %s", p, b)
		assert.NotContains(t, string(b), "classifier", p)
	}
	st, b := fx.get(t, "/health?model=classifier", "Authorization", "Bearer tok")
	assert.Equal(t, 200, st, string(b))
	st, b = fx.get(t, "/health?model=nope", "Authorization", "Bearer tok")
	assert.Equal(t, 404, st)
	var e teiError
	decodeStrict(t, b, &e)
	assert.Equal(t, "Validation", e.ErrorType)
	assert.Contains(t, e.Error, "nope")
	st, _ = fx.post(t, "/", `{"inputs":"a","model":"tiny-encoder"}`)
	assert.Equal(t, 401, st, "POST / wants the token")
	st, _ = fx.post(t, "/", `{"inputs":"a","model":"tiny-encoder"}`, "Authorization", "Bearer tok")
	assert.Equal(t, 200, st)

	// A classifier whose device is down: not ready.
	repo := t.TempDir()
	writeFakeEncoder(t, filepath.Join(repo, "classifier"), fakeLogitsYAML(3, true, false, ""), 3, []string{"negative", "neutral", "positive"})
	eng := &enginetest.Engine{Label: "torch", Func: fakeLogits}
	set, err := serving.New(serving.Options{Repository: repo, Engines: map[string]serving.Engine{"torch": {Engine: eng}}})
	require.NoError(t, err)
	t.Cleanup(func() { set.Close() })
	require.NoError(t, set.LoadAll(context.Background()))
	require.NoError(t, set.Warmup(context.Background()))
	s, _ := newTestServer(t, &fixture{repo: repo, set: set, eng: eng})
	assert.Equal(t, 200, do(t, s, "GET", "/ping", nil).Code)
	eng.Last().SetHealthy(false)
	for _, p := range []string{"/health", "/ping", "/health?model=classifier"} {
		w := do(t, s, "GET", p, nil)
		assert.Equal(t, 503, w.Code, p)
		assert.Equal(t, "1", w.Header().Get("Retry-After"), p)
		assert.JSONEq(t, `{"error":"model classifier is not ready","error_type":"Unhealthy"}`, w.Body.String(), p)
	}

	// No model a TEI endpoint serves.
	f := newSumMax(t)
	sm, _ := newTestServer(t, f)
	w := do(t, sm, "GET", "/health", nil)
	assert.Equal(t, 503, w.Code)
	assert.JSONEq(t, `{"error":"no model served here answers the TEI endpoints","error_type":"Unhealthy"}`, w.Body.String())
	w = do(t, sm, "GET", "/ping?model=summax", nil)
	assert.Equal(t, 422, w.Code)
	assert.Contains(t, w.Body.String(), "model summax serves no text API (it takes no text input), not the TEI endpoints")
}
