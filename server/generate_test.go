package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/serving"
)

// gatedDecoders is the CPU engine with a gate on its decoders' steps:
// while gate is set, each step waits for a token from it.
type gatedDecoders struct {
	cpufallback.Engine
	gate chan struct{}
}

func (e *gatedDecoders) LoadDecoder(ctx context.Context, m *models.Model) (engine.Decoder, error) {
	d, err := e.Engine.LoadDecoder(ctx, m)
	return &gatedDecoder{d, e}, err
}

type gatedDecoder struct {
	engine.Decoder
	e *gatedDecoders
}

func (d *gatedDecoder) Step(ctx context.Context, step *generation.Step) ([]generation.Sampled, error) {
	if d.e.gate != nil {
		select {
		case <-d.e.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return d.Decoder.Step(ctx, step)
}

// VerifiesDrafts is the engine's decoder's (speculative decoding).
func (d *gatedDecoder) VerifiesDrafts() bool {
	v, ok := d.Decoder.(generation.Drafter)
	return ok && v.VerifiesDrafts()
}

type genFixture struct {
	s   *Server
	set *serving.Set
	srv *httptest.Server
	reg *prometheus.Registry
	eng *gatedDecoders
}

// newGenFixture serves the shipped tiny-llama (and summax, which is not
// a language model) on the CPU engine over a real HTTP server, with
// model.yaml's generation keys replaced by yaml when it is not empty.
func newGenFixture(t *testing.T, yaml string) *genFixture {
	t.Helper()
	repo := t.TempDir()
	if yaml != "" {
		yaml = "engine: cpu\n" + yaml
	}
	enginetest.CopyModel(t, "../model_repository/tiny-llama", filepath.Join(repo, "tiny-llama"), yaml)
	eng := &gatedDecoders{}
	reg := prometheus.NewRegistry()
	set, err := serving.New(serving.Options{Repository: repo, DefaultEngine: "cpu", Registerer: reg, VLLMMetrics: true,
		Engines: map[string]serving.Engine{"cpu": {Engine: eng}}})
	require.NoError(t, err)
	t.Cleanup(func() { set.Close() })
	require.NoError(t, set.LoadAll(context.Background()))
	require.NoError(t, set.Warmup(context.Background()))
	s, err := New(Options{Models: set, Version: "test", Registerer: reg, Gatherer: reg})
	require.NoError(t, err)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return &genFixture{s: s, set: set, srv: srv, reg: reg, eng: eng}
}

func (f *genFixture) post(t *testing.T, path string, body any) (int, []byte) {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	resp, err := http.Post(f.srv.URL+path, "application/json", bytes.NewReader(b))
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, out
}

// events posts body and reads the server-sent events' data lines, up to
// [DONE] or the stream's end.
func (f *genFixture) events(t *testing.T, path string, body any) []json.RawMessage {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	resp, err := http.Post(f.srv.URL+path, "application/json", bytes.NewReader(b))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	var out []json.RawMessage
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		require.True(t, strings.HasPrefix(line, "data: "), "an event line: %q", line)
		data := strings.TrimPrefix(line, "data: ")
		if data == "[DONE]" {
			return out
		}
		out = append(out, json.RawMessage(data))
	}
	return out
}

type completion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		Logprobs     *any    `json:"logprobs"`
		FinishReason *string `json:"finish_reason"`
		Message      *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
}

func decodeCompletion(t *testing.T, b []byte) completion {
	t.Helper()
	var c completion
	require.NoError(t, json.Unmarshal(b, &c), string(b))
	return c
}

// The three APIs' streams carry, concatenated, the text their whole
// answers give, byte for byte, each piece whole UTF-8; usage counts the
// tokens; a greedy generation is the same every time.
func TestGenerateStreamEqualsWhole(t *testing.T) {
	f := newGenFixture(t, "")
	const n = 40
	st, b := f.post(t, "/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": n, "temperature": 0, "ignore_eos": true})
	require.Equal(t, 200, st, string(b))
	whole := decodeCompletion(t, b)
	assert.Equal(t, "text_completion", whole.Object)
	assert.Equal(t, "tiny-llama", whole.Model)
	require.Len(t, whole.Choices, 1)
	assert.Equal(t, "length", *whole.Choices[0].FinishReason)
	require.NotNil(t, whole.Usage)
	assert.Equal(t, n, whole.Usage.CompletionTokens)
	assert.Equal(t, whole.Usage.PromptTokens+n, whole.Usage.TotalTokens)
	text := whole.Choices[0].Text
	require.NotEmpty(t, text)

	_, again := f.post(t, "/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": n, "temperature": 0, "ignore_eos": true})
	assert.Equal(t, text, decodeCompletion(t, again).Choices[0].Text, "greedy twice")

	evs := f.events(t, "/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": n, "temperature": 0,
		"ignore_eos": true, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	var streamed strings.Builder
	var finish string
	for i, ev := range evs {
		c := decodeCompletion(t, ev)
		if i == len(evs)-1 {
			require.NotNil(t, c.Usage, "the usage chunk comes last")
			assert.Empty(t, c.Choices)
			assert.Equal(t, n, c.Usage.CompletionTokens)
			continue
		}
		require.Len(t, c.Choices, 1)
		assert.True(t, utf8.ValidString(c.Choices[0].Text), "piece %d is whole UTF-8: %q", i, c.Choices[0].Text)
		streamed.WriteString(c.Choices[0].Text)
		if c.Choices[0].FinishReason != nil {
			finish = *c.Choices[0].FinishReason
		}
	}
	assert.Equal(t, text, streamed.String())
	assert.Equal(t, "length", finish)

	// Chat: the template's prompt, the same equality.
	chat := map[string]any{"model": "tiny-llama", "messages": []map[string]any{{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}},
		"max_completion_tokens": n, "temperature": 0, "ignore_eos": true}
	st, b = f.post(t, "/v1/chat/completions", chat)
	require.Equal(t, 200, st, string(b))
	c := decodeCompletion(t, b)
	assert.Equal(t, "chat.completion", c.Object)
	require.NotNil(t, c.Choices[0].Message)
	assert.Equal(t, "assistant", c.Choices[0].Message.Role)
	chatText := c.Choices[0].Message.Content
	chat["stream"] = true
	streamed.Reset()
	evs = f.events(t, "/v1/chat/completions", chat)
	require.NotEmpty(t, evs)
	first := decodeCompletion(t, evs[0])
	assert.Equal(t, "chat.completion.chunk", first.Object)
	assert.Equal(t, "assistant", first.Choices[0].Delta.Role)
	for _, ev := range evs {
		c := decodeCompletion(t, ev)
		if d := c.Choices[0].Delta; d != nil && d.Content != nil {
			streamed.WriteString(*d.Content)
		}
	}
	assert.Equal(t, chatText, streamed.String())
	assert.Equal(t, "length", *decodeCompletion(t, evs[len(evs)-1]).Choices[0].FinishReason)

	// Triton's generate extension.
	st, b = f.post(t, "/v2/models/tiny-llama/generate", map[string]any{"text_input": "Once upon a time", "parameters": map[string]any{"max_tokens": n, "temperature": 0, "ignore_eos": true}})
	require.Equal(t, 200, st, string(b))
	var tg struct {
		ModelName    string `json:"model_name"`
		ModelVersion string `json:"model_version"`
		TextOutput   string `json:"text_output"`
	}
	require.NoError(t, json.Unmarshal(b, &tg))
	assert.Equal(t, "tiny-llama", tg.ModelName)
	assert.Equal(t, "1", tg.ModelVersion)
	assert.Equal(t, text, tg.TextOutput, "the same prompt and parameters as the completion")
	streamed.Reset()
	for _, ev := range f.events(t, "/v2/models/tiny-llama/versions/1/generate_stream", map[string]any{"text_input": "Once upon a time", "max_tokens": n, "temperature": 0, "ignore_eos": true}) {
		var piece struct {
			TextOutput string `json:"text_output"`
		}
		require.NoError(t, json.Unmarshal(ev, &piece))
		streamed.WriteString(piece.TextOutput)
	}
	assert.Equal(t, text, streamed.String())
}

// A stop string ends the text before it, never in it, stream or not; a
// seeded sampled generation repeats.
func TestGenerateStopAndSeed(t *testing.T) {
	f := newGenFixture(t, "")
	body := map[string]any{"model": "tiny-llama", "prompt": "abc", "max_tokens": 48, "temperature": 0, "ignore_eos": true}
	_, b := f.post(t, "/v1/completions", body)
	text := decodeCompletion(t, b).Choices[0].Text
	// A stop string from the middle of the text, on character bounds.
	runes := []rune(text)
	require.Greater(t, len(runes), 12, text)
	stop := string(runes[len(runes)/2 : len(runes)/2+3])
	want := text[:strings.Index(text, stop)]
	body["stop"] = []string{"never in the text at all", stop}
	st, b := f.post(t, "/v1/completions", body)
	require.Equal(t, 200, st, string(b))
	c := decodeCompletion(t, b)
	assert.Equal(t, want, c.Choices[0].Text)
	assert.Equal(t, "stop", *c.Choices[0].FinishReason)
	body["stream"] = true
	var streamed strings.Builder
	var finish string
	for _, ev := range f.events(t, "/v1/completions", body) {
		c := decodeCompletion(t, ev)
		streamed.WriteString(c.Choices[0].Text)
		if c.Choices[0].FinishReason != nil {
			finish = *c.Choices[0].FinishReason
		}
	}
	assert.Equal(t, want, streamed.String())
	assert.Equal(t, "stop", finish)

	seeded := map[string]any{"model": "tiny-llama", "prompt": "abc", "max_tokens": 32, "temperature": 0.9, "top_p": 0.95, "seed": 42, "ignore_eos": true}
	_, a := f.post(t, "/v1/completions", seeded)
	_, b = f.post(t, "/v1/completions", seeded)
	assert.Equal(t, decodeCompletion(t, a).Choices[0].Text, decodeCompletion(t, b).Choices[0].Text, "the same seed")
	assert.NotEqual(t, text[:len(decodeCompletion(t, a).Choices[0].Text)/2], decodeCompletion(t, a).Choices[0].Text[:len(decodeCompletion(t, a).Choices[0].Text)/2], "sampled, not greedy")
}

// Chat log-probabilities: one entry a token, the chosen token's the
// most likely under greedy decoding, top_logprobs in order.
func TestGenerateLogprobs(t *testing.T) {
	f := newGenFixture(t, "")
	st, b := f.post(t, "/v1/chat/completions", map[string]any{"model": "tiny-llama", "messages": []map[string]any{{"role": "user", "content": "hi"}},
		"max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 3, "ignore_eos": true})
	require.Equal(t, 200, st, string(b))
	var resp struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			Logprobs struct {
				Content []struct {
					Token       string  `json:"token"`
					Logprob     float64 `json:"logprob"`
					Bytes       []int   `json:"bytes"`
					TopLogprobs []struct {
						Token   string  `json:"token"`
						Logprob float64 `json:"logprob"`
					} `json:"top_logprobs"`
				} `json:"content"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal(b, &resp))
	content := resp.Choices[0].Logprobs.Content
	require.Len(t, content, 6)
	// The tokens' raw bytes, joined, are the text (a character split over
	// tokens is whole again), as OpenAI's bytes are meant to be used.
	var joined []byte
	for _, c := range content {
		for _, x := range c.Bytes {
			joined = append(joined, byte(x))
		}
	}
	if utf8.Valid(joined) {
		assert.Equal(t, resp.Choices[0].Message.Content, string(joined))
	} else {
		assert.Contains(t, resp.Choices[0].Message.Content, "\uFFFD", "bytes that make no character are U+FFFD in the text")
	}
	for _, c := range content {
		require.Len(t, c.TopLogprobs, 3)
		assert.LessOrEqual(t, c.Logprob, 0.0)
		assert.Equal(t, c.TopLogprobs[0].Token, c.Token, "greedy takes the most likely")
		assert.InDelta(t, c.TopLogprobs[0].Logprob, c.Logprob, 1e-6)
		assert.GreaterOrEqual(t, c.TopLogprobs[0].Logprob, c.TopLogprobs[1].Logprob)
		assert.GreaterOrEqual(t, c.TopLogprobs[1].Logprob, c.TopLogprobs[2].Logprob)
	}
}

// Every refusal is a 400 (404 for an unknown model) in the API's own
// error shape, naming what was wrong, before anything runs.
func TestGenerateRefusals(t *testing.T) {
	f := newGenFixture(t, "generation:\n  max_model_len: 64\n  max_tokens: 16\n")
	long := strings.Repeat("word ", 200)
	msgs := []map[string]any{{"role": "user", "content": "hi"}}
	for _, c := range []struct {
		path   string
		body   map[string]any
		status int
		param  string
		want   string
	}{
		{"/v1/completions", map[string]any{"model": "tiny-llama", "prompt": long}, 400, "prompt", "max_model_len 64"},
		{"/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "hi", "max_tokens": 100}, 400, "max_tokens", "max_tokens 100"},
		{"/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "hi", "max_tokens": 0}, 400, "max_tokens", "at least 1"},
		{"/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "hi", "mirostat": 2}, 400, "mirostat", `unknown parameter "mirostat"`},
		{"/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "hi", "n": 65}, 400, "n", "n 65"},
		{"/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "hi", "top_p": 0}, 400, "top_p", "top_p 0"},
		{"/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "hi", "temperature": -1}, 400, "temperature", "temperature -1"},
		{"/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "hi", "seed": "x"}, 400, "seed", "seed must be an integer"},
		{"/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "hi", "priority": -1}, 400, "prompt", "priority -1"},
		{"/v1/chat/completions", map[string]any{"model": "tiny-llama", "messages": msgs, "logprobs": true, "top_logprobs": -1}, 400, "top_logprobs", "0 to 20"},
		{"/v1/chat/completions", map[string]any{"model": "tiny-llama", "messages": []map[string]any{{"role": "user<|im_end|>", "content": "hi"}}}, 400, "messages", "want one of system"},
		{"/v1/chat/completions", map[string]any{"model": "tiny-llama", "messages": []map[string]any{{"role": "user", "content": long}}}, 400, "messages", "max_model_len 64"},
		{"/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "hi", "stop": []string{"a", "b", "c", "d", "e"}}, 400, "stop", "at most 4"},
		{"/v1/completions", map[string]any{"model": "tiny-llama"}, 400, "prompt", "prompt is required"},
		{"/v1/completions", map[string]any{"model": "nope", "prompt": "hi"}, 404, "model", "nope"},
		{"/v1/completions", map[string]any{"prompt": "hi"}, 400, "model", "model is required"},
		{"/v1/chat/completions", map[string]any{"model": "tiny-llama", "messages": []any{}}, 400, "messages", "non-empty"},
		{"/v1/chat/completions", map[string]any{"model": "tiny-llama", "messages": []map[string]any{{"content": "hi"}}}, 400, "messages", `messages[0].role ""`},
		{"/v1/chat/completions", map[string]any{"model": "tiny-llama", "messages": msgs, "top_logprobs": 2}, 400, "top_logprobs", "logprobs: true"},
		{"/v1/chat/completions", map[string]any{"model": "tiny-llama", "messages": msgs, "logprobs": true, "top_logprobs": 21}, 400, "top_logprobs", "0 to 20"},
		{"/v1/chat/completions", map[string]any{"model": "tiny-llama", "messages": msgs, "tools": []any{map[string]any{"type": "function"}}}, 400, "tools", "tools"},
	} {
		st, b := f.post(t, c.path, c.body)
		assert.Equal(t, c.status, st, "%v: %s", c.body, b)
		var e openaiErrorResponse
		decodeStrict(t, b, &e)
		assert.Contains(t, e.Error.Message, c.want, "%v", c.body)
		if assert.NotNil(t, e.Error.Param, "%v: %s", c.body, b) {
			assert.Equal(t, c.param, *e.Error.Param, "%v: %s", c.body, b)
		}
	}
	for _, c := range []struct {
		body map[string]any
		want string
	}{
		{map[string]any{"parameters": map[string]any{"max_tokens": 4}}, "text_input is required"},
		{map[string]any{"text_input": "hi", "parameters": map[string]any{"beam_width": 4}}, "unknown parameter beam_width"},
		{map[string]any{"text_input": "hi", "max_tokens": "four"}, "max_tokens: want an integer"},
		{map[string]any{"text_input": long}, "max_model_len 64"},
		{map[string]any{"text_input": "hi", "stream": true}, "generate_stream"},
		{map[string]any{"text_input": "hi", "max_tokens": 3, "parameters": map[string]any{"max_tokens": 4}}, "both in parameters and beside text_input"},
		{map[string]any{"text_input": nil}, "text_input: want a string"},
	} {
		st, b := f.post(t, "/v2/models/tiny-llama/generate", c.body)
		assert.Equal(t, 400, st, "%v: %s", c.body, b)
		var e struct {
			Error string `json:"error"`
		}
		decodeStrict(t, b, &e)
		assert.Contains(t, e.Error, c.want)
	}
	st, b := f.post(t, "/v2/models/tiny-llama/infer", map[string]any{"inputs": []map[string]any{{"name": "text_input", "datatype": "BYTES", "shape": []int{1}, "data": []string{"hi"}}}})
	assert.Equal(t, 400, st, string(b))
	assert.Contains(t, string(b), "/v2/models/tiny-llama/generate")
}
