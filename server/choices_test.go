package server

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type choicesAnswer struct {
	Choices []struct {
		Index        int    `json:"index"`
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
		Logprobs     *struct {
			TokenLogprobs []float64 `json:"token_logprobs"`
		} `json:"logprobs"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

func (f *genFixture) choices(t *testing.T, body map[string]any) choicesAnswer {
	t.Helper()
	body["model"] = "tiny-llama"
	st, b := f.post(t, "/v1/completions", body)
	require.Equal(t, 200, st, string(b))
	var a choicesAnswer
	require.NoError(t, json.Unmarshal(b, &a), string(b))
	return a
}

// Completions' n, best_of, prompt arrays and echo: n greedy choices are
// equal, n seeded ones differ and come back the same for the same seed;
// an array of prompts answers one choice (or n) a prompt, in order, each
// what the prompt alone gets; best_of keeps the most likely; echo puts
// the prompt first; streamed choices carry their index and add up to
// the whole answer; the n choices of one prompt share its cached blocks.
func TestCompletionChoices(t *testing.T) {
	f := newGenFixture(t, "")
	const prompt = "Once upon a time there was a small model that"
	greedy := f.choices(t, map[string]any{"prompt": prompt, "max_tokens": 10, "temperature": 0, "n": 3})
	require.Len(t, greedy.Choices, 3)
	for i, c := range greedy.Choices {
		assert.Equal(t, i, c.Index)
		assert.Equal(t, greedy.Choices[0].Text, c.Text)
	}
	assert.Equal(t, 30, greedy.Usage.CompletionTokens)
	one := f.choices(t, map[string]any{"prompt": prompt, "max_tokens": 10, "temperature": 0})
	assert.Equal(t, one.Usage.PromptTokens, greedy.Usage.PromptTokens, "the prompt counted once")

	seeded := map[string]any{"prompt": prompt, "max_tokens": 12, "temperature": 1, "seed": 5, "n": 3}
	a, b := f.choices(t, seeded), f.choices(t, seeded)
	assert.Equal(t, a, b, "reproducible")
	assert.False(t, a.Choices[0].Text == a.Choices[1].Text && a.Choices[1].Text == a.Choices[2].Text, "three draws: %+v", a.Choices)

	prompts := []string{"the cat", "a dog barked at", "in the beginning"}
	arr := f.choices(t, map[string]any{"prompt": prompts, "max_tokens": 6, "temperature": 0, "n": 2})
	require.Len(t, arr.Choices, 6)
	for i, p := range prompts {
		alone := f.choices(t, map[string]any{"prompt": p, "max_tokens": 6, "temperature": 0})
		for j := range 2 {
			assert.Equal(t, 2*i+j, arr.Choices[2*i+j].Index)
			assert.Equal(t, alone.Choices[0].Text, arr.Choices[2*i+j].Text, "prompt %d choice %d", i, j)
		}
	}
	ids := f.choices(t, map[string]any{"prompt": [][]int{{5, 6, 7}, {8, 9}}, "max_tokens": 4, "temperature": 0})
	require.Len(t, ids.Choices, 2)

	// best_of 4, n 2: the two most likely of four draws.
	best := f.choices(t, map[string]any{"prompt": prompt, "max_tokens": 8, "temperature": 1, "seed": 11, "best_of": 4, "n": 2, "logprobs": 0})
	require.Len(t, best.Choices, 2)
	all := f.choices(t, map[string]any{"prompt": prompt, "max_tokens": 8, "temperature": 1, "seed": 11, "n": 4, "logprobs": 0})
	sum := func(lp []float64) float64 {
		s := 0.0
		for _, v := range lp {
			s += v
		}
		return s
	}
	var sums []float64
	for _, c := range all.Choices {
		sums = append(sums, sum(c.Logprobs.TokenLogprobs))
	}
	for _, c := range best.Choices {
		better := 0
		for _, s := range sums {
			if s > sum(c.Logprobs.TokenLogprobs)+1e-4 {
				better++
			}
		}
		assert.Less(t, better, 2, "a kept choice is among the two most likely of %v", sums)
	}

	echo := f.choices(t, map[string]any{"prompt": "the cat", "max_tokens": 5, "temperature": 0, "echo": true})
	plain := f.choices(t, map[string]any{"prompt": "the cat", "max_tokens": 5, "temperature": 0})
	assert.Equal(t, "the cat"+plain.Choices[0].Text, echo.Choices[0].Text)

	// Streamed: each event names its choice; the pieces add up.
	texts := map[int]*strings.Builder{}
	for _, ev := range f.events(t, "/v1/completions", map[string]any{"model": "tiny-llama", "prompt": prompts, "max_tokens": 6, "temperature": 0, "n": 2, "stream": true}) {
		var c choicesAnswer
		require.NoError(t, json.Unmarshal(ev, &c))
		for _, ch := range c.Choices {
			if texts[ch.Index] == nil {
				texts[ch.Index] = &strings.Builder{}
			}
			texts[ch.Index].WriteString(ch.Text)
		}
	}
	require.Len(t, texts, 6)
	for i, c := range arr.Choices {
		assert.Equal(t, c.Text, texts[i].String(), "choice %d", i)
	}

	// Shared blocks: the second and third choices of a long prompt take
	// its whole blocks from the first's.
	long := strings.Repeat("a long shared prompt of many words ", 12)
	before := metricValue(t, f.reg, "stepserve_generation_prefix_cache_hit_tokens_total", "")
	three := f.choices(t, map[string]any{"prompt": long, "max_tokens": 2, "temperature": 0, "n": 3})
	hits := metricValue(t, f.reg, "stepserve_generation_prefix_cache_hit_tokens_total", "") - before
	full := float64(three.Usage.PromptTokens / 16 * 16) // tiny-llama's blocks are 16 tokens
	assert.GreaterOrEqual(t, hits, 2*full, "the other two choices share the first's %v prompt tokens in whole blocks", full)

	// A one-token prompt echoed with logprobs: its token listed, null.
	st, one1 := f.post(t, "/v1/completions", map[string]any{"model": "tiny-llama", "prompt": []int{9}, "max_tokens": 2, "echo": true, "logprobs": 0})
	require.Equal(t, 200, st, string(one1))
	var e1 struct {
		Choices []struct {
			Logprobs struct {
				TokenLogprobs []*float64 `json:"token_logprobs"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal(one1, &e1))
	require.Len(t, e1.Choices[0].Logprobs.TokenLogprobs, 3)
	assert.Nil(t, e1.Choices[0].Logprobs.TokenLogprobs[0])

	for _, bad := range []map[string]any{
		{"prompt": "x", "n": 0}, {"prompt": "x", "n": 2, "best_of": 1}, {"prompt": "x", "best_of": 3, "stream": true},
		{"prompt": []string{}}, {"prompt": "x", "n": 65},
	} {
		bad["model"] = "tiny-llama"
		st, b := f.post(t, "/v1/completions", bad)
		assert.Equal(t, 400, st, "%v: %s", bad, b)
	}
}

// Chat's n: n messages, each its own draw (seeded: reproducible), and
// streamed with each choice's role chunk first and its index on every
// chunk.
func TestChatChoices(t *testing.T) {
	f := newGenFixture(t, "")
	body := map[string]any{"model": "tiny-llama", "messages": []map[string]any{{"role": "user", "content": "hi"}}, "max_tokens": 8,
		"temperature": 1, "seed": 3, "n": 3}
	st, b := f.post(t, "/v1/chat/completions", body)
	require.Equal(t, 200, st, string(b))
	var c completion
	require.NoError(t, json.Unmarshal(b, &c))
	require.Len(t, c.Choices, 3)
	_, again := f.post(t, "/v1/chat/completions", body)
	var c2 completion
	require.NoError(t, json.Unmarshal(again, &c2))
	for i := range 3 {
		assert.Equal(t, i, c.Choices[i].Index)
		assert.Equal(t, c.Choices[i].Message.Content, c2.Choices[i].Message.Content)
	}
	body["stream"] = true
	texts, roles := map[int]string{}, map[int]int{}
	for _, ev := range f.events(t, "/v1/chat/completions", body) {
		var chunk struct {
			Choices []struct {
				Index int `json:"index"`
				Delta struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal(ev, &chunk))
		for _, ch := range chunk.Choices {
			if ch.Delta.Role != "" {
				roles[ch.Index]++
				assert.Empty(t, texts[ch.Index], "the role first")
			}
			texts[ch.Index] += ch.Delta.Content
		}
	}
	assert.Equal(t, map[int]int{0: 1, 1: 1, 2: 1}, roles)
	for i := range 3 {
		assert.Equal(t, c.Choices[i].Message.Content, texts[i], "choice %d", i)
	}
}

// echo with logprobs: the prompt's tokens come first with their
// log-probabilities (the first null), computed by the steps that compute
// the prompt; a prompt of a greedy answer's own tokens scores them as
// the decode steps that sampled them did.
func TestEchoLogprobs(t *testing.T) {
	f := newGenFixture(t, "")
	type lp struct {
		Tokens        []string             `json:"tokens"`
		TokenLogprobs []*float64           `json:"token_logprobs"`
		TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	}
	ask := func(body map[string]any) (string, lp) {
		body["model"], body["return_tokens_as_token_ids"] = "tiny-llama", true
		st, b := f.post(t, "/v1/completions", body)
		require.Equal(t, 200, st, string(b))
		var a struct {
			Choices []struct {
				Text     string `json:"text"`
				Logprobs lp     `json:"logprobs"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal(b, &a), string(b))
		return a.Choices[0].Text, a.Choices[0].Logprobs
	}
	ids := func(names []string) []int {
		var out []int
		for _, n := range names {
			var id int
			_, err := fmt.Sscanf(n, "token_id:%d", &id)
			require.NoError(t, err)
			out = append(out, id)
		}
		return out
	}
	const prompt = "the cat sat on the mat"
	text, echoed := ask(map[string]any{"prompt": prompt, "max_tokens": 6, "temperature": 0, "echo": true, "logprobs": 2})
	assert.True(t, strings.HasPrefix(text, prompt), text)
	promptIDs := ids(echoed.Tokens[:len(echoed.Tokens)-6])
	require.NotEmpty(t, promptIDs)
	assert.Nil(t, echoed.TokenLogprobs[0], "the first token has nothing before it")
	assert.Nil(t, echoed.TopLogprobs[0])
	for i := 1; i < len(echoed.TokenLogprobs); i++ {
		require.NotNil(t, echoed.TokenLogprobs[i], "token %d", i)
		assert.LessOrEqual(t, *echoed.TokenLogprobs[i], 0.0)
		assert.Len(t, echoed.TopLogprobs[i], 2)
	}
	// The answer's own tokens as a prompt: scored as they were sampled.
	_, plain := ask(map[string]any{"prompt": promptIDs, "max_tokens": 6, "temperature": 0, "logprobs": 0})
	both := append(promptIDs, ids(plain.Tokens)...)
	_, rescored := ask(map[string]any{"prompt": both, "max_tokens": 1, "temperature": 0, "echo": true, "logprobs": 0})
	require.Len(t, rescored.TokenLogprobs, len(both)+1)
	for k := range 6 {
		got := rescored.TokenLogprobs[len(promptIDs)+k]
		require.NotNil(t, got)
		assert.InDelta(t, *plain.TokenLogprobs[k], *got, 2e-3, "token %d: sampled by a decode step, scored by the prefill", k)
	}
	for k := 1; k < len(promptIDs); k++ {
		assert.InDelta(t, *echoed.TokenLogprobs[k], *rescored.TokenLogprobs[k], 1e-4, "prompt token %d scored alike", k)
	}
}

// generation.prompt_logprobs false: echo with logprobs is refused naming
// the key; echo alone is answered.
func TestPromptLogprobsOff(t *testing.T) {
	f := newGenFixture(t, "generation:\n  prompt_logprobs: false\n")
	st, b := f.post(t, "/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "x", "max_tokens": 2, "echo": true, "logprobs": 0})
	assert.Equal(t, 400, st, string(b))
	assert.Contains(t, string(b), "generation.prompt_logprobs false")
	st, b = f.post(t, "/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "x", "max_tokens": 2, "echo": true})
	assert.Equal(t, 200, st, string(b))
}
