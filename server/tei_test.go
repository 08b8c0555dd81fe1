package server

import (
	"encoding/json"
	"math"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/models"
)

type teiError struct {
	Error     string `json:"error"`
	ErrorType string `json:"error_type"`
}

// expectedLogits is what the fake engine gives model for text (and pair):
// computed from the tokenizer's ids, as the engine does from the step's.
func expectedLogits(t *testing.T, m *models.Model, text string, width int) []float32 {
	ids, err := m.Tokenizer.AppendEncode(nil, text, m.Config.MaxSeq(), true)
	require.NoError(t, err)
	out := make([]float32, width)
	for k := range out {
		out[k] = fakeLogit(ids, make([]int64, len(ids)), k)
	}
	return out
}

func sigmoid64(x float32) float64 { return 1 / (1 + math.Exp(-float64(x))) }

func TestTEIEmbed(t *testing.T) {
	fx := newTextFixture(t, textOptions{})
	texts := []string{"hello world", "a longer sentence about nothing"}
	want := fx.oipEmbeddings(t, "tiny-encoder", texts)
	// The only embedding model: no name needed.
	st, b := fx.post(t, "/embed", map[string]any{"inputs": texts})
	require.Equal(t, 200, st, string(b))
	var got [][]float32
	decodeStrict(t, b, &got)
	assertVectors(t, want, got)

	st, b = fx.post(t, "/embed?model=tiny-encoder", `{"inputs":"hello world","normalize":true,"truncate":true,"truncation_direction":"Right"}`)
	require.Equal(t, 200, st, string(b))
	decodeStrict(t, b, &got)
	assertVectors(t, want[:1], got)

	st, b = fx.post(t, "/embed", `{"inputs":"hello world","dimensions":8,"model":"tiny-encoder"}`)
	require.Equal(t, 200, st, string(b))
	decodeStrict(t, b, &got)
	require.Len(t, got[0], 8)
	assert.InDelta(t, 1, norm(got[0]), 1e-6)
}

// Truncation: Left keeps the end of a text; truncate: false refuses what
// the model would cut.
func TestTEIEmbedTruncation(t *testing.T) {
	fx := newTextFixture(t, textOptions{onlyTiny: true})
	m := fx.model(t, "tiny-encoder")
	long := strings.Repeat("alpha beta ", 100) + "omega end"
	all, err := m.Tokenizer.Tokenize(long)
	require.NoError(t, err)
	require.Greater(t, len(all), 128, "longer than the largest bucket")

	// Right: what the model does on its own (encoder.truncate).
	st, b := fx.post(t, "/embed", map[string]any{"inputs": long, "truncate": true})
	require.Equal(t, 200, st, string(b))
	var right [][]float32
	decodeStrict(t, b, &right)
	assertVectors(t, fx.oipEmbeddings(t, "tiny-encoder", []string{long}), right)

	// Left: the last 126 tokens, and their embedding is that text's.
	st, b = fx.post(t, "/embed", map[string]any{"inputs": long, "truncate": true, "truncation_direction": "Left"})
	require.Equal(t, 200, st, string(b))
	var leftGot [][]float32
	decodeStrict(t, b, &leftGot)
	toks, err := m.Tokenizer.Tokenize(long)
	require.NoError(t, err)
	words := toks[1 : len(toks)-1]
	tail := long[words[len(words)-126].Start:]
	assert.True(t, strings.HasSuffix(tail, "omega end"))
	assertVectors(t, fx.oipEmbeddings(t, "tiny-encoder", []string{tail}), leftGot)
	assert.NotEqual(t, right, leftGot)

	st, b = fx.post(t, "/embed", map[string]any{"inputs": long, "truncate": false})
	assert.Equal(t, 413, st)
	var e teiError
	decodeStrict(t, b, &e)
	assert.Equal(t, "Validation", e.ErrorType)
	assert.Contains(t, e.Error, "longer than the largest sequence bucket")

	st, b = fx.post(t, "/embed", map[string]any{"inputs": "a", "truncation_direction": "Middle"})
	assert.Equal(t, 422, st)
	decodeStrict(t, b, &e)
	assert.Contains(t, e.Error, `truncation_direction "Middle"; want Right or Left`)
}

// Errors in TEI's shape and statuses.
func TestTEIErrors(t *testing.T) {
	fx := newTextFixture(t, textOptions{})
	many := make([]string, 2048 /* max_client_batch_size */ +1)
	for i := range many {
		many[i] = "a"
	}
	manyBody, err := json.Marshal(map[string]any{"inputs": many})
	require.NoError(t, err)
	for _, tc := range []struct {
		path, body string
		status     int
		typ, msg   string
	}{
		{"/embed", `{"inputs":[]}`, 400, "Empty", "inputs is empty"},
		{"/embed", string(manyBody), 413, "Validation", "2049 texts, more than the 2048"},
		{"/embed", `{"inputs":"a","prompt_name":"query"}`, 422, "Validation", "prompt_name is not supported"},
		{"/embed", `{"inputs":"a","normalize":false}`, 422, "Validation", "normalize: false cannot be honoured"},
		{"/embed", `{"inputs":"a","model":"classifier"}`, 422, "Validation", "model classifier serves classification (/predict), not /embed"},
		{"/embed", `{"inputs":"a","model":"nope"}`, 404, "Validation", `Request for unknown model: 'nope' is not found`},
		{"/embed", `{"inputs":5}`, 422, "Validation", "inputs: want a string or an array of strings"},
		{"/embed", `{"inputs":"a"`, 422, "Validation", "malformed JSON"},
		{"/predict", `{"inputs":"a"}`, 422, "Validation", "3 models answer /predict; name one with \"model\" in the body or ?model=: classifier, reranker, scorer"},
		{"/predict", `{"inputs":"a","model":"tiny-encoder"}`, 422, "Validation", "model tiny-encoder serves embeddings (/v1/embeddings, /embed), not /predict"},
		{"/predict", `{"inputs":["a","b","c"],"model":"classifier"}`, 422, "Validation", "want a string, a pair"},
		{"/predict", `{"inputs":["a","b"],"model":"classifier"}`, 422, "Validation", `model classifier scores single texts; it takes no "text_pair" input`},
		{"/tokenize", `{"inputs":"a","prompt_name":"x","model":"tiny-encoder"}`, 422, "Validation", "prompt_name is not supported"},
	} {
		st, b := fx.post(t, tc.path, tc.body)
		assert.Equal(t, tc.status, st, "%s %s: %s", tc.path, tc.body, b)
		var e teiError
		decodeStrict(t, b, &e)
		assert.Equal(t, tc.typ, e.ErrorType, tc.body)
		assert.Contains(t, e.Error, tc.msg, tc.body)
	}
}

// /predict: softmax over the labels file's names, sorted; sigmoid for a
// single logit; raw scores on request; a list for a list.
func TestTEIPredict(t *testing.T) {
	fx := newTextFixture(t, textOptions{})
	m := fx.model(t, "classifier")
	type pred struct {
		Score float64 `json:"score"`
		Label string  `json:"label"`
	}
	want := func(text string, raw bool) []pred {
		logits := expectedLogits(t, m, text, 3)
		var sum float64
		for _, l := range logits {
			sum += math.Exp(float64(l))
		}
		labels := []string{"negative", "neutral", "positive"}
		out := make([]pred, 3)
		for k, l := range logits {
			s := float64(l)
			if !raw {
				s = math.Exp(float64(l)) / sum
			}
			out[k] = pred{s, labels[k]}
		}
		sort.SliceStable(out, func(i, j int) bool { return out[i].Score > out[j].Score })
		return out
	}
	check := func(want, got []pred) {
		t.Helper()
		require.Len(t, got, len(want))
		for i := range want {
			assert.Equal(t, want[i].Label, got[i].Label)
			assert.InDelta(t, want[i].Score, got[i].Score, 1e-6)
		}
	}
	st, b := fx.post(t, "/predict", `{"inputs":"I love this","model":"classifier"}`)
	require.Equal(t, 200, st, string(b))
	var one []pred
	decodeStrict(t, b, &one)
	check(want("I love this", false), one)
	var total float64
	for _, p := range one {
		total += p.Score
	}
	assert.InDelta(t, 1, total, 1e-6, "softmax")

	st, b = fx.post(t, "/predict?model=classifier", `{"inputs":[["I love this"],["meh"]],"raw_scores":true}`)
	require.Equal(t, 200, st, string(b))
	var batch [][]pred
	decodeStrict(t, b, &batch)
	require.Len(t, batch, 2)
	check(want("I love this", true), batch[0])
	check(want("meh", true), batch[1])

	// One logit: sigmoid, labelled LABEL_0.
	st, b = fx.post(t, "/predict", `{"inputs":"some text","model":"scorer"}`)
	require.Equal(t, 200, st, string(b))
	decodeStrict(t, b, &one)
	require.Len(t, one, 1)
	assert.Equal(t, "LABEL_0", one[0].Label)
	assert.InDelta(t, sigmoid64(expectedLogits(t, fx.model(t, "scorer"), "some text", 1)[0]), one[0].Score, 1e-6)
}

// /rerank on a reranker of the fake engine (cmd/serve's
// TestHubFolderDemosThroughTheirAPIs runs the shipped cross-encoder).
func TestTEIRerank(t *testing.T) {
	fx := newTextFixture(t, textOptions{})
	texts := []string{"first passage", "a second, longer passage", "third"}
	st, b := fx.post(t, "/rerank", map[string]any{"query": "what?", "texts": texts, "return_text": true})
	require.Equal(t, 200, st, string(b))
	var ranks []struct {
		Index int     `json:"index"`
		Text  string  `json:"text"`
		Score float64 `json:"score"`
	}
	decodeStrict(t, b, &ranks)
	require.Len(t, ranks, 3)
	for i, r := range ranks {
		assert.Equal(t, texts[r.Index], r.Text)
		assert.True(t, r.Score >= 0 && r.Score <= 1, "sigmoid")
		if i > 0 {
			assert.GreaterOrEqual(t, ranks[i-1].Score, r.Score, "sorted by score, descending")
		}
	}
	st, b = fx.post(t, "/rerank", map[string]any{"query": "what?", "texts": texts, "raw_scores": true})
	require.Equal(t, 200, st, string(b))
	assert.NotContains(t, string(b), `"text"`)

	st, b = fx.post(t, "/rerank", `{"query":"q","texts":[]}`)
	assert.Equal(t, 400, st)
	var e teiError
	decodeStrict(t, b, &e)
	assert.Equal(t, "Empty", e.ErrorType)

	// No reranker among the models: 422 saying so.
	tiny := newTextFixture(t, textOptions{onlyTiny: true})
	st, b = tiny.post(t, "/rerank", `{"query":"q","texts":["a"]}`)
	assert.Equal(t, 422, st)
	assert.Contains(t, string(b), "no model served here answers /rerank")
}

// /tokenize: ids, texts and offsets of the model's tokenizer.
func TestTEITokenize(t *testing.T) {
	fx := newTextFixture(t, textOptions{onlyTiny: true})
	m := fx.model(t, "tiny-encoder")
	text := "Hello world"
	st, b := fx.post(t, "/tokenize", map[string]any{"inputs": []string{text}})
	require.Equal(t, 200, st, string(b))
	type token struct {
		ID      int64  `json:"id"`
		Text    string `json:"text"`
		Special bool   `json:"special"`
		Start   *int   `json:"start"`
		Stop    *int   `json:"stop"`
	}
	var got [][]token
	decodeStrict(t, b, &got)
	ids, err := m.Tokenizer.AppendEncode(nil, text, 128, false)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Len(t, got[0], len(ids))
	for i, tok := range got[0] {
		assert.Equal(t, ids[i], tok.ID, "token %d", i)
		special := i == 0 || i == len(ids)-1
		assert.Equal(t, special, tok.Special, "token %d", i)
		if special {
			assert.Nil(t, tok.Start)
			continue
		}
		require.NotNil(t, tok.Start)
		assert.True(t, strings.EqualFold(text[*tok.Start:*tok.Stop], strings.TrimPrefix(tok.Text, "##")), "token %d spans its text: %q", i, tok.Text)
	}
	st, b = fx.post(t, "/tokenize", `{"inputs":"Hello world","add_special_tokens":false}`)
	require.Equal(t, 200, st, string(b))
	decodeStrict(t, b, &got)
	assert.Len(t, got[0], len(ids)-2)

	// Tokenizing is no inference: the model's statistics count neither a
	// success nor a failure for it.
	st, b = fx.get(t, "/v2/models/tiny-encoder/stats")
	require.Equal(t, 200, st, string(b))
	assert.Contains(t, string(b), `"success":{"count":0`, string(b))
	assert.Contains(t, string(b), `"fail":{"count":0`, string(b))
}

// /info describes the model TEI's way.
func TestTEIInfo(t *testing.T) {
	fx := newTextFixture(t, textOptions{})
	st, b := fx.get(t, "/info?model=tiny-encoder")
	require.Equal(t, 200, st, string(b))
	var info map[string]any
	require.NoError(t, json.Unmarshal(b, &info))
	assert.Equal(t, "tiny-encoder", info["model_id"])
	assert.Equal(t, map[string]any{"embedding": map[string]any{"pooling": "mean"}}, info["model_type"])
	assert.Equal(t, 128.0, info["max_input_length"])
	assert.Equal(t, float64(2048 /* max_client_batch_size */), info["max_client_batch_size"])
	assert.Equal(t, true, info["auto_truncate"])

	st, b = fx.get(t, "/info?model=classifier")
	require.Equal(t, 200, st, string(b))
	require.NoError(t, json.Unmarshal(b, &info))
	assert.Equal(t, map[string]any{"classifier": map[string]any{
		"id2label": map[string]any{"0": "negative", "1": "neutral", "2": "positive"},
		"label2id": map[string]any{"negative": 0.0, "neutral": 1.0, "positive": 2.0}}}, info["model_type"])

	st, b = fx.get(t, "/info")
	assert.Equal(t, 422, st, "several models: name one")
	assert.Contains(t, string(b), "classifier, reranker, scorer, tiny-encoder")
}

// The TEI endpoints: the inference token, in TEI's shape; the protocol
// label tei.
func TestTEIAuthAndMetrics(t *testing.T) {
	fx := newTextFixture(t, textOptions{onlyTiny: true, tokens: []string{"tok"}})
	st, b := fx.post(t, "/embed", `{"inputs":"a"}`)
	assert.Equal(t, 401, st)
	var e teiError
	decodeStrict(t, b, &e)
	assert.Contains(t, e.Error, "missing bearer token")
	st, _ = fx.post(t, "/embed", `{"inputs":"a"}`, "Authorization", "Bearer tok")
	assert.Equal(t, 200, st)
	st, _ = fx.post(t, "/tokenize", `{"inputs":"a"}`, "Authorization", "Bearer tok")
	assert.Equal(t, 200, st)
	st, _ = fx.post(t, "/embed", `{"inputs":[]}`, "Authorization", "Bearer tok")
	assert.Equal(t, 400, st)
	m := fx.metrics(t)
	assert.Contains(t, m, `stepserve_requests_total{model="tiny-encoder",outcome="success",protocol="tei"} 2`)
	assert.Contains(t, m, `stepserve_requests_total{model="tiny-encoder",outcome="invalid",protocol="tei"} 1`)
}

// A byte-level BPE tokenizer's tokens may end inside a character: /tokenize
// still answers valid JSON (the partial bytes as U+FFFD), and a Left
// truncation cuts at a character boundary, within the bucket.
func TestTEIByteLevelTokensInsideCharacters(t *testing.T) {
	fx := newTextFixture(t, textOptions{onlyTiny: true, tokenizer: "bpe"})
	st, b := fx.post(t, "/tokenize", `{"inputs":"a 😀 日本語のテキスト"}`)
	require.Equal(t, 200, st, string(b))
	assert.True(t, utf8.Valid(b), "the answer is UTF-8: %q", b)
	var toks [][]struct {
		ID          int64  `json:"id"`
		Text        string `json:"text"`
		Special     bool   `json:"special"`
		Start, Stop *int
	}
	decodeStrict(t, b, &toks)
	require.NotEmpty(t, toks[0])
	assert.Contains(t, string(b), `"text":"の"`, "whole characters are the input's own")

	long := strings.Repeat("héllo 😀😀 wörld 日本語のテキスト ", 40)
	for _, dir := range []string{"Left", "Right"} {
		st, b = fx.post(t, "/embed", map[string]any{"inputs": long, "truncate": true, "truncation_direction": dir})
		require.Equal(t, 200, st, "%s: %s", dir, b)
	}
}
