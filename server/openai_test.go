package server

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openaiEmbeddingsResponse is the answer as OpenAI's reference gives it.
type openaiEmbeddingsResponse struct {
	Object string `json:"object"`
	Data   []struct {
		Object    string          `json:"object"`
		Index     int             `json:"index"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Model string `json:"model"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

type openaiErrorResponse struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func decodeStrict(t *testing.T, b []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(v), string(b))
}

func floats(t *testing.T, raw json.RawMessage) []float32 {
	var v []float32
	require.NoError(t, json.Unmarshal(raw, &v), string(raw))
	return v
}

func norm(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

// An OpenAI client's body: the same vectors as OIP, the object shapes and
// field names of OpenAI's reference, and the real token count.
func TestOpenAIEmbeddingsMatchOIP(t *testing.T) {
	fx := newTextFixture(t, textOptions{onlyTiny: true})
	texts := []string{"hello world", "The quick brown fox jumps over the lazy dog.", ""}
	want := fx.oipEmbeddings(t, "tiny-encoder", texts)
	st, b := fx.post(t, "/v1/embeddings", map[string]any{"input": texts, "model": "tiny-encoder", "user": "someone", "encoding_format": "float"})
	require.Equal(t, 200, st, string(b))
	var resp openaiEmbeddingsResponse
	decodeStrict(t, b, &resp)
	assert.Equal(t, "list", resp.Object)
	assert.Equal(t, "tiny-encoder", resp.Model)
	require.Len(t, resp.Data, 3)
	m := fx.model(t, "tiny-encoder")
	tokens := 0
	for i, d := range resp.Data {
		assert.Equal(t, "embedding", d.Object)
		assert.Equal(t, i, d.Index)
		assertVector(t, want[i], floats(t, d.Embedding), "row %d as OIP answers it", i)
		tokens += tokenCount(t, m, texts[i])
	}
	assert.Equal(t, tokens, resp.Usage.PromptTokens, "[CLS] and [SEP] counted")
	assert.Equal(t, tokens, resp.Usage.TotalTokens)

	// A single string is a list of one.
	st, b = fx.post(t, "/v1/embeddings", `{"input":"hello world","model":"tiny-encoder"}`)
	require.Equal(t, 200, st, string(b))
	decodeStrict(t, b, &resp)
	require.Len(t, resp.Data, 1)
	assertVector(t, want[0], floats(t, resp.Data[0].Embedding))
	assert.Equal(t, tokenCount(t, m, "hello world"), resp.Usage.PromptTokens)
}

// base64 is the little-endian float32 bytes of the same vector.
func TestOpenAIEmbeddingsBase64(t *testing.T) {
	fx := newTextFixture(t, textOptions{onlyTiny: true})
	want := fx.oipEmbeddings(t, "tiny-encoder", []string{"hello world"})[0]
	st, b := fx.post(t, "/v1/embeddings", `{"input":["hello world"],"model":"tiny-encoder","encoding_format":"base64"}`)
	require.Equal(t, 200, st, string(b))
	var resp openaiEmbeddingsResponse
	decodeStrict(t, b, &resp)
	var s string
	require.NoError(t, json.Unmarshal(resp.Data[0].Embedding, &s), "a base64 string")
	raw, err := base64.StdEncoding.DecodeString(s)
	require.NoError(t, err)
	require.Len(t, raw, 4*len(want))
	for i := range want {
		assert.InDelta(t, want[i], math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])), vectorTolerance, "element %d", i)
	}
}

// dimensions keeps the first N and, the model's embeddings being
// normalized, normalizes them again.
func TestOpenAIEmbeddingsDimensions(t *testing.T) {
	fx := newTextFixture(t, textOptions{onlyTiny: true})
	full := fx.oipEmbeddings(t, "tiny-encoder", []string{"hello world"})[0]
	st, b := fx.post(t, "/v1/embeddings", `{"input":"hello world","model":"tiny-encoder","dimensions":16}`)
	require.Equal(t, 200, st, string(b))
	var resp openaiEmbeddingsResponse
	decodeStrict(t, b, &resp)
	got := floats(t, resp.Data[0].Embedding)
	require.Len(t, got, 16)
	assert.InDelta(t, 1, norm(got), 1e-6, "normalized again")
	scale := norm(full[:16])
	for i := range got {
		assert.InDelta(t, float64(full[i])/scale, got[i], 1e-6, "element %d: the full vector's, rescaled", i)
	}

	for _, d := range []string{"0", "129", "-1"} {
		st, b = fx.post(t, "/v1/embeddings", `{"input":"a","model":"tiny-encoder","dimensions":`+d+`}`)
		assert.Equal(t, 400, st, d)
		var e openaiErrorResponse
		decodeStrict(t, b, &e)
		assert.Equal(t, "invalid_request_error", e.Error.Type)
		require.NotNil(t, e.Error.Param)
		assert.Equal(t, "dimensions", *e.Error.Param)
		assert.Contains(t, e.Error.Message, "want 1..128")
	}
}

// Errors in OpenAI's shape, with OpenAI's statuses.
func TestOpenAIEmbeddingsErrors(t *testing.T) {
	fx := newTextFixture(t, textOptions{})
	for _, tc := range []struct {
		body   string
		status int
		param  string
		code   string
		msg    string
	}{
		{`{"input":"a"}`, 400, "model", "", "model is required"},
		{`{"input":"a","model":"nope"}`, 404, "model", "model_not_found", `Request for unknown model: 'nope' is not found`},
		{`{"input":"a","model":"classifier"}`, 400, "model", "", "model classifier serves classification (/predict), not /v1/embeddings"},
		{`{"model":"tiny-encoder"}`, 400, "input", "", "input is required"},
		{`{"input":[],"model":"tiny-encoder"}`, 400, "input", "", "input is empty"},
		{`{"input":[1,2,3],"model":"tiny-encoder"}`, 400, "input", "", "token id arrays are not supported"},
		{`{"input":[[1,2]],"model":"tiny-encoder"}`, 400, "input", "", "token id arrays are not supported"},
		{`{"input":{"a":1},"model":"tiny-encoder"}`, 400, "input", "", "want a string or an array of strings"},
		{`{"input":"a","model":"tiny-encoder","encoding_format":"int8"}`, 400, "encoding_format", "", `encoding_format "int8" is not supported`},
		{`{"input":"a",`, 400, "input", "", "malformed JSON"},
	} {
		st, b := fx.post(t, "/v1/embeddings", tc.body)
		assert.Equal(t, tc.status, st, tc.body)
		var e openaiErrorResponse
		decodeStrict(t, b, &e)
		assert.Equal(t, "invalid_request_error", e.Error.Type, tc.body)
		assert.Contains(t, e.Error.Message, tc.msg, tc.body)
		if assert.NotNil(t, e.Error.Param, tc.body) {
			assert.Equal(t, tc.param, *e.Error.Param, tc.body)
		}
		if tc.code != "" && assert.NotNil(t, e.Error.Code, tc.body) {
			assert.Equal(t, tc.code, *e.Error.Code, tc.body)
		}
	}
}

// Too many texts: 413 in OpenAI's shape, before any of them runs.
func TestOpenAIEmbeddingsTooManyInputs(t *testing.T) {
	fx := newTextFixture(t, textOptions{onlyTiny: true})
	texts := make([]string, 2048 /* max_client_batch_size */ +1)
	for i := range texts {
		texts[i] = "a"
	}
	st, b := fx.post(t, "/v1/embeddings", map[string]any{"input": texts, "model": "tiny-encoder"})
	assert.Equal(t, 413, st)
	var e openaiErrorResponse
	decodeStrict(t, b, &e)
	assert.Contains(t, e.Error.Message, "2049 texts, more than the 2048")
	require.NotNil(t, e.Error.Code)
	assert.Equal(t, "request_too_large", *e.Error.Code)

	// A body of many values is refused unread, strings or not (an array
	// of nulls or empty objects builds as much as one of strings).
	for _, v := range []string{`"",`, `null,`, `{},`, `0,`} {
		many := `{"model":"tiny-encoder","input":[` + strings.Repeat(v, 200_000) + `""]}`
		st, b = fx.post(t, "/v1/embeddings", many)
		assert.Equal(t, 413, st, v)
		decodeStrict(t, b, &e)
		assert.Contains(t, e.Error.Message, "more than 7168 JSON values", v)
	}

	// Under the value bound, decoding costs its budget first: with a
	// small in-flight budget a large body is refused whole, not decoded.
	small := newTextFixture(t, textOptions{onlyTiny: true, maxInflight: 4 << 20})
	big := `{"model":"tiny-encoder","input":[` + strings.Repeat(`"`+strings.Repeat("x", 2000)+`",`, 2000) + `""]}`
	st, b = small.post(t, "/v1/embeddings", big)
	assert.Equal(t, 413, st)
	decodeStrict(t, b, &e)
	assert.Contains(t, e.Error.Message, "in-flight budget")
}

// The inference token guards /v1: 401 in OpenAI's shape.
func TestOpenAIAuth(t *testing.T) {
	fx := newTextFixture(t, textOptions{onlyTiny: true, tokens: []string{"sk-test"}})
	body := `{"input":"a","model":"tiny-encoder"}`
	st, b := fx.post(t, "/v1/embeddings", body)
	assert.Equal(t, 401, st)
	var e openaiErrorResponse
	decodeStrict(t, b, &e)
	require.NotNil(t, e.Error.Code)
	assert.Equal(t, "invalid_api_key", *e.Error.Code)
	st, _ = fx.post(t, "/v1/embeddings", body, "Authorization", "Bearer wrong")
	assert.Equal(t, 401, st)
	st, b = fx.post(t, "/v1/embeddings", body, "Authorization", "Bearer sk-test")
	assert.Equal(t, 200, st, string(b))
	st, _ = fx.get(t, "/v1/models")
	assert.Equal(t, 401, st)
}

// /v1/models lists the models that serve embeddings, in OpenAI's shape.
func TestOpenAIModels(t *testing.T) {
	before := time.Now().Unix()
	fx := newTextFixture(t, textOptions{})
	st, b := fx.get(t, "/v1/models")
	require.Equal(t, 200, st)
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Created int64  `json:"created"`
			OwnedBy string `json:"owned_by"`
		} `json:"data"`
	}
	decodeStrict(t, b, &list)
	assert.Equal(t, "list", list.Object)
	require.Len(t, list.Data, 1, "the classifiers serve no embeddings")
	assert.Equal(t, "tiny-encoder", list.Data[0].ID)
	assert.Equal(t, "model", list.Data[0].Object)
	assert.Equal(t, "stepserve", list.Data[0].OwnedBy)
	created := list.Data[0].Created
	assert.True(t, created >= before && created <= time.Now().Unix(), "created is when the model loaded: %d", created)

	st, b = fx.get(t, "/v1/models/tiny-encoder")
	assert.Equal(t, 200, st)
	assert.JSONEq(t, fmt.Sprintf(`{"id":"tiny-encoder","object":"model","created":%d,"owned_by":"stepserve"}`, created), string(b))
	for _, name := range []string{"nope", "classifier"} {
		st, b = fx.get(t, "/v1/models/"+name)
		assert.Equal(t, 404, st, name)
		var e openaiErrorResponse
		decodeStrict(t, b, &e)
		assert.Equal(t, "model_not_found", *e.Error.Code)
	}
}

// Requests are counted under protocol openai, and logged.
func TestOpenAIMetrics(t *testing.T) {
	fx := newTextFixture(t, textOptions{onlyTiny: true})
	assert.NotContains(t, fx.metrics(t), `protocol="openai"`, "no series before the API is used")
	fx.post(t, "/v1/embeddings", `{"input":"a","model":"tiny-encoder"}`)
	fx.post(t, "/v1/embeddings", `{"input":"a","model":"tiny-encoder","dimensions":0}`)
	fx.post(t, "/v1/embeddings", `{"input":"a","model":"nope"}`)
	m := fx.metrics(t)
	assert.Contains(t, m, `stepserve_requests_total{model="tiny-encoder",outcome="success",protocol="openai"} 1`)
	assert.Contains(t, m, `stepserve_requests_total{model="tiny-encoder",outcome="invalid",protocol="openai"} 1`)
	assert.Contains(t, m, `stepserve_requests_total{model="tiny-encoder",outcome="success",protocol="http"} 0`)
	assert.NotContains(t, m, `model="nope"`, "unknown names make no series")
}
