package server

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSpeculativeDecoding: a model with generation.speculative answers
// as it does without it (greedy and seeded, over OpenAI's completions and
// Triton's generate), a request may opt out, and the drafted and kept
// tokens are counted under both names.
func TestSpeculativeDecoding(t *testing.T) {
	const keys = "generation:\n  max_model_len: 512\n  max_tokens: 64\n"
	plain := newGenFixture(t, keys)
	spec := newGenFixture(t, keys+"  speculative:\n    method: ngram\n    num_speculative_tokens: 6\n    prompt_lookup_min: 1\n")
	quote := "The quick brown fox jumps over the lazy dog, and the dog sleeps on. "
	prompts := []string{strings.Repeat(quote, 3), "Summarise: " + quote + quote, "hello"}
	text := func(f *genFixture, body map[string]any) string {
		code, out := f.post(t, "/v1/completions", body)
		require.Equal(t, 200, code, "%s", out)
		var c completion
		require.NoError(t, json.Unmarshal(out, &c))
		return c.Choices[0].Text
	}
	for i, p := range prompts {
		for _, seed := range []any{nil, 7} {
			body := map[string]any{"model": "tiny-llama", "prompt": p, "max_tokens": 48, "ignore_eos": true, "temperature": 0}
			if seed != nil {
				body["temperature"], body["seed"] = 0.8, seed
			}
			want := text(plain, body)
			assert.Equal(t, want, text(spec, body), "prompt %d, seed %v", i, seed)
			body["speculative_decoding"] = false
			assert.Equal(t, want, text(spec, body), "prompt %d, seed %v, opted out", i, seed)
		}
	}
	drafted := metricValue(t, spec.reg, "stepserve_generation_draft_tokens_total", "")
	kept := metricValue(t, spec.reg, "stepserve_generation_draft_accepted_tokens_total", "")
	assert.Positive(t, drafted)
	assert.Positive(t, kept)
	assert.LessOrEqual(t, kept, drafted)
	assert.Equal(t, drafted, metricValue(t, spec.reg, "vllm:spec_decode_num_draft_tokens_total", ""))
	assert.Equal(t, kept, metricValue(t, spec.reg, "vllm:spec_decode_num_accepted_tokens_total", ""))
	assert.Positive(t, metricValue(t, spec.reg, "vllm:spec_decode_num_drafts_total", ""))
	assert.Zero(t, metricValue(t, plain.reg, "stepserve_generation_draft_tokens_total", ""))

	// Opted out, a request drafts nothing.
	body := map[string]any{"model": "tiny-llama", "prompt": prompts[0], "max_tokens": 48, "ignore_eos": true, "temperature": 0, "speculative_decoding": false}
	text(spec, body)
	assert.Equal(t, drafted, metricValue(t, spec.reg, "stepserve_generation_draft_tokens_total", ""))

	// Triton's generate extension takes the same switch.
	code, out := spec.post(t, "/v2/models/tiny-llama/generate", map[string]any{"text_input": prompts[0],
		"parameters": map[string]any{"max_tokens": 16, "speculative_decoding": "no"}})
	assert.Equal(t, 400, code)
	assert.Contains(t, string(out), "speculative_decoding: want a boolean")
	code, out = spec.post(t, "/v2/models/tiny-llama/generate", map[string]any{"text_input": prompts[0],
		"parameters": map[string]any{"max_tokens": 16, "speculative_decoding": false}})
	assert.Equal(t, 200, code, "%s", out)
	assert.Equal(t, drafted, metricValue(t, spec.reg, "stepserve_generation_draft_tokens_total", ""))
	// null is the default: it drafts.
	code, out = spec.post(t, "/v2/models/tiny-llama/generate", map[string]any{"text_input": prompts[0],
		"parameters": map[string]any{"max_tokens": 32, "temperature": 0, "ignore_eos": true, "speculative_decoding": nil}})
	assert.Equal(t, 200, code, "%s", out)
	assert.Greater(t, metricValue(t, spec.reg, "stepserve_generation_draft_tokens_total", ""), drafted)
}
