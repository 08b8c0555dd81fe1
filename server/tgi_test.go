package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tgiSchemas are the shapes of text-generation-inference's answers, as
// its OpenAPI document (docs/openapi.json, 3.3.x) gives them, closed to
// other keys: GenerateResponse (Details, Token, PrefillToken),
// StreamResponse (StreamDetails), Info and ErrorResponse.
const tgiSchemas = `{
  "$defs": {
    "finish": {"enum": ["length", "eos_token", "stop_sequence"]},
    "token": {"type": "object", "required": ["id", "text", "logprob", "special"], "additionalProperties": false,
      "properties": {"id": {"type": "integer", "minimum": 0}, "text": {"type": "string"},
        "logprob": {"type": ["number", "null"]}, "special": {"type": "boolean"}}},
    "prefill": {"type": "object", "required": ["id", "text", "logprob"], "additionalProperties": false,
      "properties": {"id": {"type": "integer", "minimum": 0}, "text": {"type": "string"}, "logprob": {"type": ["number", "null"]}}},
    "seed": {"type": ["integer", "null"], "minimum": 0},
    "details": {"type": "object", "required": ["finish_reason", "generated_tokens", "prefill", "tokens"], "additionalProperties": false,
      "properties": {"finish_reason": {"$ref": "#/$defs/finish"}, "generated_tokens": {"type": "integer", "minimum": 0},
        "prefill": {"type": "array", "items": {"$ref": "#/$defs/prefill"}}, "seed": {"$ref": "#/$defs/seed"},
        "tokens": {"type": "array", "items": {"$ref": "#/$defs/token"}},
        "top_tokens": {"type": "array", "items": {"type": "array", "items": {"$ref": "#/$defs/token"}}},
        "best_of_sequences": {"type": ["array", "null"]}}},
    "generate": {"type": "object", "required": ["generated_text"], "additionalProperties": false,
      "properties": {"generated_text": {"type": "string"}, "details": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/details"}]}}},
    "stream": {"type": "object", "required": ["index", "token"], "additionalProperties": false,
      "properties": {"index": {"type": "integer", "minimum": 0}, "token": {"$ref": "#/$defs/token"},
        "top_tokens": {"type": "array", "items": {"$ref": "#/$defs/token"}},
        "generated_text": {"type": ["string", "null"]},
        "details": {"anyOf": [{"type": "null"}, {"type": "object", "required": ["finish_reason", "generated_tokens", "input_length"],
          "additionalProperties": false, "properties": {"finish_reason": {"$ref": "#/$defs/finish"},
            "generated_tokens": {"type": "integer", "minimum": 0}, "input_length": {"type": "integer", "minimum": 0},
            "seed": {"$ref": "#/$defs/seed"}}}]}}},
    "info": {"type": "object", "additionalProperties": false,
      "required": ["model_id", "max_concurrent_requests", "max_best_of", "max_stop_sequences", "max_input_tokens", "max_total_tokens",
        "validation_workers", "max_client_batch_size", "router", "version"],
      "properties": {"model_id": {"type": "string"}, "model_sha": {"type": ["string", "null"]}, "model_pipeline_tag": {"type": ["string", "null"]},
        "max_concurrent_requests": {"type": "integer", "minimum": 0}, "max_best_of": {"type": "integer", "minimum": 0},
        "max_stop_sequences": {"type": "integer", "minimum": 0}, "max_input_tokens": {"type": "integer", "minimum": 0},
        "max_total_tokens": {"type": "integer", "minimum": 0}, "validation_workers": {"type": "integer", "minimum": 0},
        "max_client_batch_size": {"type": "integer", "minimum": 0}, "router": {"type": "string"}, "version": {"type": "string"},
        "sha": {"type": ["string", "null"]}, "docker_label": {"type": ["string", "null"]}}},
    "error": {"type": "object", "required": ["error", "error_type"], "additionalProperties": false,
      "properties": {"error": {"type": "string"}, "error_type": {"type": "string"}}}
  }
}`

// tgiValidate checks body against the schema of tgiSchemas named def.
func tgiValidate(t *testing.T, def string, body []byte) {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(tgiSchemas))
	require.NoError(t, err)
	c := jsonschema.NewCompiler()
	require.NoError(t, c.AddResource("tgi.json", doc))
	sch, err := c.Compile("tgi.json#/$defs/" + def)
	require.NoError(t, err)
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(string(body)))
	require.NoError(t, err, string(body))
	assert.NoError(t, sch.Validate(inst), "%s: %s", def, body)
}

type tgiResponse struct {
	GeneratedText string `json:"generated_text"`
	Details       *struct {
		FinishReason    string `json:"finish_reason"`
		GeneratedTokens int    `json:"generated_tokens"`
		Seed            *int64 `json:"seed"`
		Tokens          []struct {
			ID      int32    `json:"id"`
			Text    string   `json:"text"`
			Logprob *float64 `json:"logprob"`
		} `json:"tokens"`
		TopTokens [][]struct {
			ID int32 `json:"id"`
		} `json:"top_tokens"`
	} `json:"details"`
}

func (f *genFixture) tgi(t *testing.T, body any) tgiResponse {
	t.Helper()
	st, b := f.post(t, "/generate", body)
	require.Equal(t, http.StatusOK, st, string(b))
	tgiValidate(t, "generate", b)
	var r tgiResponse
	require.NoError(t, json.Unmarshal(b, &r))
	return r
}

// TGI's routes as text-generation-inference answers them, shape by
// shape against its OpenAPI document: greedy by default (the text
// /v1/completions writes at temperature 0), details with every token,
// top tokens and the seed, the seed drawn and reported when none is
// given (and that seed reproducing the answer), stop sequences kept at
// the end, return_full_text, grammar, the stream of one event a token
// whose last carries the whole text, POST / as an array of one or a
// stream, GET /info, and TGI's refusals.
func TestTGIRoutes(t *testing.T) {
	f := newGenFixture(t, "")
	prompt := "the cat sat on"

	greedy := f.tgi(t, map[string]any{"inputs": prompt, "parameters": map[string]any{"max_new_tokens": 12}})
	assert.Nil(t, greedy.Details, "details are asked for")
	st, b := f.post(t, "/v1/completions", map[string]any{"model": "tiny-llama", "prompt": prompt, "max_tokens": 12, "temperature": 0})
	require.Equal(t, 200, st, string(b))
	var c completion
	require.NoError(t, json.Unmarshal(b, &c))
	assert.Equal(t, c.Choices[0].Text, greedy.GeneratedText)

	// Sampled, with details and top tokens: reproducible by its seed.
	params := map[string]any{"max_new_tokens": 10, "do_sample": true, "seed": 7, "details": true, "top_n_tokens": 2}
	a := f.tgi(t, map[string]any{"inputs": prompt, "parameters": params})
	again := f.tgi(t, map[string]any{"inputs": prompt, "parameters": params})
	assert.Equal(t, a, again)
	require.NotNil(t, a.Details)
	assert.Equal(t, int64(7), *a.Details.Seed)
	assert.Equal(t, "length", a.Details.FinishReason)
	assert.Equal(t, 10, a.Details.GeneratedTokens)
	require.Len(t, a.Details.Tokens, 10)
	require.Len(t, a.Details.TopTokens, 10)
	var joined strings.Builder
	for i, tk := range a.Details.Tokens {
		require.NotNil(t, tk.Logprob)
		assert.LessOrEqual(t, *tk.Logprob, 0.0)
		assert.Len(t, a.Details.TopTokens[i], 2)
		joined.WriteString(tk.Text)
	}
	assert.Equal(t, a.GeneratedText, joined.String())

	// No seed: one is drawn and reported, and it reproduces the answer.
	drawn := f.tgi(t, map[string]any{"inputs": prompt, "parameters": map[string]any{"max_new_tokens": 8, "temperature": 0.9, "details": true}})
	require.NotNil(t, drawn.Details.Seed)
	replay := f.tgi(t, map[string]any{"inputs": prompt, "parameters": map[string]any{"max_new_tokens": 8, "temperature": 0.9, "seed": *drawn.Details.Seed}})
	assert.Equal(t, drawn.GeneratedText, replay.GeneratedText)

	// A stop sequence ends it and is kept, as TGI writes it.
	stop := greedy.GeneratedText[3:6]
	cut := f.tgi(t, map[string]any{"inputs": prompt, "parameters": map[string]any{"max_new_tokens": 12, "stop": []string{stop}, "details": true}})
	assert.Equal(t, "stop_sequence", cut.Details.FinishReason)
	assert.True(t, strings.HasSuffix(cut.GeneratedText, stop), cut.GeneratedText)
	assert.True(t, strings.HasPrefix(greedy.GeneratedText, cut.GeneratedText), "%q, %q", greedy.GeneratedText, cut.GeneratedText)

	// decoder_input_details: the prompt's tokens with their scores, the
	// first null.
	st, b = f.post(t, "/generate", map[string]any{"inputs": prompt, "parameters": map[string]any{"max_new_tokens": 2, "details": true, "decoder_input_details": true}})
	require.Equal(t, 200, st, string(b))
	tgiValidate(t, "generate", b)
	var pre struct {
		Details struct {
			Prefill []struct {
				ID      int      `json:"id"`
				Logprob *float64 `json:"logprob"`
			} `json:"prefill"`
		} `json:"details"`
	}
	require.NoError(t, json.Unmarshal(b, &pre))
	require.Greater(t, len(pre.Details.Prefill), 2)
	assert.Nil(t, pre.Details.Prefill[0].Logprob)
	for _, p := range pre.Details.Prefill[1:] {
		require.NotNil(t, p.Logprob)
		assert.LessOrEqual(t, *p.Logprob, 0.0)
	}

	full := f.tgi(t, map[string]any{"inputs": prompt, "parameters": map[string]any{"max_new_tokens": 12, "return_full_text": true}})
	assert.Equal(t, prompt+greedy.GeneratedText, full.GeneratedText)

	// Grammar: the output is one of the regex's words.
	g := f.tgi(t, map[string]any{"inputs": prompt, "parameters": map[string]any{"max_new_tokens": 20, "details": true,
		"grammar": map[string]any{"type": "regex", "value": "(yes|no|maybe)"}}})
	assert.Contains(t, []string{"yes", "no", "maybe"}, g.GeneratedText)
	assert.Equal(t, "eos_token", g.Details.FinishReason)
	js := f.tgi(t, map[string]any{"inputs": prompt, "parameters": map[string]any{"max_new_tokens": 200, "do_sample": true, "seed": 3,
		"grammar": map[string]any{"type": "json", "value": json.RawMessage(structuredSchema)}}})
	validStructured(t, js.GeneratedText)

	// The stream: one event a token, numbered from 1; the last with the
	// whole text and the details.
	events := f.events(t, "/generate_stream", map[string]any{"inputs": prompt, "parameters": map[string]any{"max_new_tokens": 12, "details": true}})
	require.Len(t, events, 12)
	var streamed strings.Builder
	for i, ev := range events {
		tgiValidate(t, "stream", ev)
		var e struct {
			Index int `json:"index"`
			Token struct {
				Text string `json:"text"`
			} `json:"token"`
			GeneratedText *string `json:"generated_text"`
			Details       *struct {
				FinishReason    string `json:"finish_reason"`
				GeneratedTokens int    `json:"generated_tokens"`
				InputLength     int    `json:"input_length"`
			} `json:"details"`
		}
		require.NoError(t, json.Unmarshal(ev, &e))
		assert.Equal(t, i+1, e.Index)
		streamed.WriteString(e.Token.Text)
		if i < len(events)-1 {
			assert.Nil(t, e.GeneratedText)
			assert.Nil(t, e.Details)
			continue
		}
		require.NotNil(t, e.GeneratedText)
		assert.Equal(t, greedy.GeneratedText, *e.GeneratedText)
		require.NotNil(t, e.Details)
		assert.Equal(t, "length", e.Details.FinishReason)
		assert.Equal(t, 12, e.Details.GeneratedTokens)
		assert.Positive(t, e.Details.InputLength)
	}
	assert.Equal(t, greedy.GeneratedText, streamed.String())

	// POST /: an array of one answer, or the stream.
	st, b = f.post(t, "/", map[string]any{"inputs": prompt, "parameters": map[string]any{"max_new_tokens": 12}})
	require.Equal(t, 200, st, string(b))
	var arr []json.RawMessage
	require.NoError(t, json.Unmarshal(b, &arr), string(b))
	require.Len(t, arr, 1)
	tgiValidate(t, "generate", arr[0])
	assert.Contains(t, string(arr[0]), greedy.GeneratedText)
	assert.Len(t, f.events(t, "/", map[string]any{"inputs": prompt, "stream": true, "parameters": map[string]any{"max_new_tokens": 5}}), 5)

	resp, err := http.Get(f.srv.URL + "/info")
	require.NoError(t, err)
	info, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode, string(info))
	tgiValidate(t, "info", info)
	var in struct {
		ModelID        string `json:"model_id"`
		MaxTotalTokens int    `json:"max_total_tokens"`
	}
	require.NoError(t, json.Unmarshal(info, &in))
	assert.Equal(t, "tiny-llama", in.ModelID)
	m, _ := f.set.Model("tiny-llama")
	assert.Equal(t, m.GenerationOptions().MaxModelLen, in.MaxTotalTokens)

	for _, bad := range []struct {
		body map[string]any
		want string
	}{
		{map[string]any{"inputs": ""}, "`inputs` cannot be empty"},
		{map[string]any{"parameters": map[string]any{}}, "`inputs` is required"},
		{map[string]any{"inputs": "x", "parameters": map[string]any{"top_p": 1.0}}, "`top_p` must be > 0.0 and < 1.0"},
		{map[string]any{"inputs": "x", "parameters": map[string]any{"temperature": 0}}, "`temperature` must be strictly positive"},
		{map[string]any{"inputs": "x", "parameters": map[string]any{"max_new_tokens": 0}}, "`max_new_tokens` must be strictly positive"},
		{map[string]any{"inputs": "x", "parameters": map[string]any{"stop": []string{"a", "b", "c", "d", "e"}}}, "up to 4 stop sequences"},
		{map[string]any{"inputs": "x", "parameters": map[string]any{"best_of": 2, "do_sample": true}}, "best_of 2"},
		{map[string]any{"inputs": "x", "parameters": map[string]any{"grammar": map[string]any{"type": "yaml", "value": "x"}}}, "grammar.type"},
		{map[string]any{"inputs": "x", "parameters": map[string]any{"max_new_tokens": 100000}}, "max_tokens"},
	} {
		st, b := f.post(t, "/generate", bad.body)
		assert.Equal(t, http.StatusUnprocessableEntity, st, "%v: %s", bad.body, b)
		tgiValidate(t, "error", b)
		assert.Contains(t, string(b), bad.want)
		assert.Contains(t, string(b), `"error_type":"validation"`)
	}
	st, b = f.post(t, "/generate_stream", map[string]any{"inputs": "x", "parameters": map[string]any{"decoder_input_details": true}})
	assert.Equal(t, http.StatusUnprocessableEntity, st, string(b))
	assert.Contains(t, string(b), "not supported when streaming")
	assert.Positive(t, testutil.ToFloat64(f.s.c.Metrics.Requests.WithLabelValues("tiny-llama", "success", "tgi")))
	assert.Positive(t, testutil.ToFloat64(f.s.c.Metrics.Requests.WithLabelValues("tiny-llama", "invalid", "tgi")))
}

// Penalties, logit_bias and stop_token_ids on OpenAI's completions (and
// TGI's repetition_penalty): each changes the greedy text as it says,
// and out-of-range values are refused naming the field.
func TestGenerationPenaltiesAndBias(t *testing.T) {
	f := newGenFixture(t, "")
	text := func(extra map[string]any) (string, []int32) {
		body := map[string]any{"model": "tiny-llama", "prompt": "the cat sat on the mat and the cat", "max_tokens": 24, "temperature": 0,
			"ignore_eos": true, "logprobs": 0, "return_tokens_as_token_ids": true}
		for k, v := range extra {
			body[k] = v
		}
		st, b := f.post(t, "/v1/completions", body)
		require.Equal(t, 200, st, string(b))
		var c struct {
			Choices []struct {
				Text     string `json:"text"`
				Logprobs struct {
					Tokens []string `json:"tokens"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal(b, &c))
		var ids []int32
		for _, tk := range c.Choices[0].Logprobs.Tokens {
			var id int32
			_, err := fmt.Sscanf(tk, "token_id:%d", &id)
			require.NoError(t, err, tk)
			ids = append(ids, id)
		}
		return c.Choices[0].Text, ids
	}
	plain, plainIDs := text(nil)
	distinct := func(ids []int32) int {
		m := map[int32]bool{}
		for _, id := range ids {
			m[id] = true
		}
		return len(m)
	}
	freq, freqIDs := text(map[string]any{"frequency_penalty": 2.0})
	assert.NotEqual(t, plain, freq)
	assert.GreaterOrEqual(t, distinct(freqIDs), distinct(plainIDs), "a frequency penalty repeats no more")
	pres, _ := text(map[string]any{"presence_penalty": 2.0})
	assert.NotEqual(t, plain, pres)
	rep, _ := text(map[string]any{"repetition_penalty": 2.0})
	assert.NotEqual(t, plain, rep)

	// logit_bias: +100 on one token makes every greedy token it; -100
	// on the plain text's first token keeps it out.
	_, forced := text(map[string]any{"logit_bias": map[string]any{"42": 100}})
	for _, id := range forced {
		assert.Equal(t, int32(42), id)
	}
	_, banned := text(map[string]any{"logit_bias": map[string]any{fmt.Sprint(plainIDs[0]): -100}})
	assert.NotContains(t, banned, plainIDs[0])

	// stop_token_ids: the plain text's fifth token ends it, left out.
	_, stopped := text(map[string]any{"stop_token_ids": []int32{plainIDs[4]}})
	assert.Equal(t, plainIDs[:4], stopped)

	// TGI's repetition_penalty is the same penalty.
	g := f.tgi(t, map[string]any{"inputs": "the cat sat on the mat and the cat", "parameters": map[string]any{"max_new_tokens": 24, "repetition_penalty": 2.0}})
	assert.NotEqual(t, g.GeneratedText, f.tgi(t, map[string]any{"inputs": "the cat sat on the mat and the cat", "parameters": map[string]any{"max_new_tokens": 24}}).GeneratedText)

	for field, v := range map[string]any{"frequency_penalty": 3.0, "presence_penalty": -2.5, "repetition_penalty": 0.0,
		"logit_bias": map[string]any{"1": 101}, "stop_token_ids": []int{1 << 30}} {
		st, b := f.post(t, "/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "x", field: v})
		assert.Equal(t, 400, st, "%s: %s", field, b)
		var e openaiErrorResponse
		require.NoError(t, json.Unmarshal(b, &e))
		if assert.NotNil(t, e.Error.Param, field) {
			assert.Equal(t, field, *e.Error.Param, string(b))
		}
	}
}

// POST / keeps TEI's bodies TEI's: a classification or feature
// extraction body with Hugging Face's parameters (top_k, truncate) is not
// taken for TGI's, whose own parameters send a body to a language model.
func TestRootKeepsTEIParameters(t *testing.T) {
	fx := newTextFixture(t, textOptions{})
	st, b := fx.post(t, "/?model=classifier", `{"inputs":"I love this","parameters":{"top_k":2,"truncate":true}}`)
	assert.Equal(t, 200, st, string(b))
	assert.Contains(t, string(b), `"label"`)
	st, b = fx.post(t, "/", `{"inputs":"hello","parameters":{"max_new_tokens":4}}`)
	assert.Equal(t, http.StatusUnprocessableEntity, st, string(b))
	assert.Contains(t, string(b), "no model served here answers")
}
