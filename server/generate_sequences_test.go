package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/serving"
)

// A client that goes away mid-stream stops its sequence: its KV cache
// blocks are free again (the gauge says so) long before max_tokens.
func TestGenerateClientGoneFreesBlocks(t *testing.T) {
	f := newGenFixture(t, "")
	// Steps run only as the gate lets them: enough for the first text
	// (greedy, so the same every run), far fewer than max_tokens.
	f.eng.gate = make(chan struct{}, 1000)
	for range 50 {
		f.eng.gate <- struct{}{}
	}
	used := func() float64 {
		return metricValue(t, f.reg, "stepserve_generation_kv_cache_blocks", "used")
	}
	ctx, cancel := context.WithCancel(context.Background())
	b, _ := json.Marshal(map[string]any{"model": "tiny-llama", "prompt": strings.Repeat("long prompt ", 30), "max_tokens": 500, "temperature": 0, "ignore_eos": true, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, "POST", f.srv.URL+"/v1/completions", bytes.NewReader(b))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	sc := bufio.NewScanner(resp.Body)
	require.True(t, sc.Scan(), "a first event")
	assert.Positive(t, used(), "the sequence holds blocks while it runs")
	cancel()
	resp.Body.Close()
	// The handler ends (the request is counted), then the loop, let go,
	// drops the sequence at its next step.
	require.Eventually(t, func() bool {
		return metricValue(t, f.reg, "stepserve_generation_request_duration_seconds", "") == 1
	}, 10*time.Second, 5*time.Millisecond)
	close(f.eng.gate)
	require.Eventually(t, func() bool { return used() == 0 }, 10*time.Second, 5*time.Millisecond)
	gen := metricValue(t, f.reg, "stepserve_generation_generated_tokens_total", "")
	assert.Less(t, gen, 500.0, "the sequence was cancelled, not run to max_tokens")
}

// Concurrent generations all end, each with the text it would have had
// alone.
func TestGenerateConcurrent(t *testing.T) {
	f := newGenFixture(t, "generation:\n  max_num_seqs: 4\n  max_batch_tokens: 32\n  max_model_len: 256\n  block_size: 8\n  kv_cache_blocks: 40\n")
	prompts := []string{"a", "hello world", strings.Repeat("long ", 20), "x y z", "The end.", "0123456789", "tiny", "llama"}
	alone := make([]string, len(prompts))
	for i, p := range prompts {
		_, b := f.post(t, "/v1/completions", map[string]any{"model": "tiny-llama", "prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": true})
		alone[i] = decodeCompletion(t, b).Choices[0].Text
	}
	var wg sync.WaitGroup
	got := make([]string, len(prompts))
	for i, p := range prompts {
		wg.Go(func() {
			st, b := f.post(t, "/v1/completions", map[string]any{"model": "tiny-llama", "prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": true})
			if st == 200 {
				got[i] = decodeCompletion(t, b).Choices[0].Text
			}
		})
	}
	wg.Wait()
	assert.Equal(t, alone, got)
}

// metricValue is tiny-llama's series of name (with state, when given):
// a gauge's or counter's value, a histogram's count.
func metricValue(t *testing.T, g prometheus.Gatherer, name, state string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "state" && l.GetValue() != state || l.GetName() == "model" && l.GetValue() != "tiny-llama" {
					continue series
				}
			}
			switch {
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	t.Fatalf("no series %s{state=%q}", name, state)
	return 0
}

// Past max_num_seqs running and generation.max_queue_size waiting, a
// generation is refused with 503 at once, never queued without bound.
func TestGenerateQueueBound(t *testing.T) {
	f := newGenFixture(t, "generation:\n  max_num_seqs: 1\n  max_queue_size: 1\n  max_batch_tokens: 32\n  max_model_len: 128\n")
	f.eng.gate = make(chan struct{})
	body := map[string]any{"model": "tiny-llama", "prompt": "hi", "max_tokens": 2, "ignore_eos": true}
	var wg sync.WaitGroup
	statuses := make([]int, 2)
	for i := range 2 {
		wg.Go(func() { statuses[i], _ = f.post(t, "/v1/completions", body) })
	}
	// Both hold their places (one running, held by the gate; one
	// waiting), the third is refused.
	m, ok := f.set.Model("tiny-llama")
	require.True(t, ok)
	require.Eventually(t, func() bool { return m.Generations() == 2 }, 10*time.Second, 5*time.Millisecond)
	st, b := f.post(t, "/v1/completions", body)
	require.Equal(t, 503, st, string(b))
	var e openaiErrorResponse
	decodeStrict(t, b, &e)
	assert.Contains(t, e.Error.Message, "max_queue_size 1")
	assert.Equal(t, "overloaded", *e.Error.Code)
	close(f.eng.gate)
	wg.Wait()
	assert.Equal(t, []int{200, 200}, statuses, "the two admitted end")
}

// A temperature too small for 1/t is greedy, not the last token id.
func TestGenerateTinyTemperatureIsGreedy(t *testing.T) {
	f := newGenFixture(t, "")
	body := map[string]any{"model": "tiny-llama", "prompt": "Once", "max_tokens": 8, "temperature": 0, "ignore_eos": true}
	_, greedy := f.post(t, "/v1/completions", body)
	body["temperature"] = 1e-40
	_, tiny := f.post(t, "/v1/completions", body)
	assert.Equal(t, decodeCompletion(t, greedy).Choices[0].Text, decodeCompletion(t, tiny).Choices[0].Text)
}

// A prompt of token ids completes as the same prompt as text does; a bad
// id is refused naming it.
func TestGenerateTokenIDPrompt(t *testing.T) {
	f := newGenFixture(t, "")
	m, ok := f.set.Model("tiny-llama")
	require.True(t, ok)
	ids, err := m.Model().Tokenizer.(*models.HFTokenizer).EncodeIDs("Once upon a time", true)
	require.NoError(t, err)
	body := map[string]any{"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "ignore_eos": true}
	_, b := f.post(t, "/v1/completions", body)
	text := decodeCompletion(t, b)
	for _, prompt := range []any{ids, []any{ids}} {
		body["prompt"] = prompt
		st, b := f.post(t, "/v1/completions", body)
		require.Equal(t, 200, st, string(b))
		c := decodeCompletion(t, b)
		assert.Equal(t, text.Choices[0].Text, c.Choices[0].Text)
		assert.Equal(t, text.Usage.PromptTokens, c.Usage.PromptTokens)
	}
	for _, c := range []struct {
		prompt any
		want   string
	}{
		{[]int{1, 99999}, "prompt[1] is token id 99999"},
		{[]int{}, "empty"},
		{[]any{"a", 7}, "want a string, an array of token ids"},
		{[]any{1.5}, "want a string, an array of token ids"},
	} {
		body["prompt"] = c.prompt
		st, b := f.post(t, "/v1/completions", body)
		assert.Equal(t, 400, st, string(b))
		assert.Contains(t, string(b), c.want)
	}
	body["prompt"], body["min_tokens"] = "hi", 20
	body["max_tokens"] = 10
	st, b := f.post(t, "/v1/completions", body)
	assert.Equal(t, 400, st, string(b))
	assert.Contains(t, string(b), "min_tokens 20")
}

// return_tokens_as_token_ids (vLLM's) names each logprobs token by its
// id, and the ids are the ones generated: the prompt extended by the
// first five continues with the sixth.
func TestGenerateTokensAsIDs(t *testing.T) {
	f := newGenFixture(t, "")
	m, ok := f.set.Model("tiny-llama")
	require.True(t, ok)
	prompt, err := m.Model().Tokenizer.(*models.HFTokenizer).EncodeIDs("Once upon a time", true)
	require.NoError(t, err)
	ids := func(b []byte) []int32 {
		var c struct {
			Choices []struct {
				Logprobs struct {
					Tokens      []string             `json:"tokens"`
					TopLogprobs []map[string]float32 `json:"top_logprobs"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal(b, &c), string(b))
		var out []int32
		for i, tok := range c.Choices[0].Logprobs.Tokens {
			id, ok := strings.CutPrefix(tok, "token_id:")
			require.True(t, ok, "token %q", tok)
			n, err := strconv.Atoi(id)
			require.NoError(t, err)
			out = append(out, int32(n))
			assert.Contains(t, c.Choices[0].Logprobs.TopLogprobs[i], tok, "the greedy token is among the most likely")
		}
		return out
	}
	body := map[string]any{"model": "tiny-llama", "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": true,
		"logprobs": 2, "return_tokens_as_token_ids": true}
	st, b := f.post(t, "/v1/completions", body)
	require.Equal(t, 200, st, string(b))
	gen := ids(b)
	require.Len(t, gen, 8)
	body["prompt"], body["max_tokens"] = append(slices.Clone(prompt), gen[:5]...), 1
	st, b = f.post(t, "/v1/completions", body)
	require.Equal(t, 200, st, string(b))
	assert.Equal(t, gen[5:6], ids(b))

	st, b = f.post(t, "/v1/chat/completions", map[string]any{"model": "tiny-llama", "max_tokens": 3, "logprobs": true,
		"return_tokens_as_token_ids": true, "messages": []map[string]any{{"role": "user", "content": "hi"}}})
	require.Equal(t, 200, st, string(b))
	assert.Regexp(t, `"token":"token_id:\d+"`, string(b))
}

// Two chats with the same long system prompt: the second shares its
// computed blocks (the hit counter says so) and answers as it would
// have without them.
func TestGeneratePrefixCacheHits(t *testing.T) {
	body := func(user string) map[string]any {
		return map[string]any{"model": "tiny-llama", "max_tokens": 16, "temperature": 0, "ignore_eos": true,
			"messages": []map[string]any{{"role": "system", "content": strings.Repeat("You are a careful assistant. ", 12)}, {"role": "user", "content": user}}}
	}
	cold := newGenFixture(t, "generation:\n  prefix_caching: false\n")
	_, want := cold.post(t, "/v1/chat/completions", body("second question"))
	assert.Zero(t, metricValue(t, cold.reg, "stepserve_generation_prefix_cache_hit_tokens_total", ""))

	f := newGenFixture(t, "")
	f.post(t, "/v1/chat/completions", body("first question"))
	assert.Zero(t, metricValue(t, f.reg, "stepserve_generation_prefix_cache_hit_tokens_total", ""), "nothing cached before")
	_, got := f.post(t, "/v1/chat/completions", body("second question"))
	assert.Positive(t, metricValue(t, f.reg, "stepserve_generation_prefix_cache_hit_tokens_total", ""), "the system prompt's blocks were shared")
	assert.Equal(t, decodeCompletion(t, want).Choices[0].Message.Content, decodeCompletion(t, got).Choices[0].Message.Content)
}

// A parameter of too many values is refused 413 naming it: the field at
// fault, not the prompt.
func TestTooManyValuesNamesTheField(t *testing.T) {
	f := newGenFixture(t, "")
	stops := `"a"` + strings.Repeat(`,"a"`, 9999)
	bias := `"1":0` + strings.Repeat(`,"1":0`, 99999)
	for field, body := range map[string]string{
		"stop":       `{"model":"tiny-llama","prompt":"hi","stop":[` + stops + `]}`,
		"logit_bias": `{"model":"tiny-llama","prompt":"hi","logit_bias":{` + bias + `}}`,
	} {
		st, b := f.post(t, "/v1/completions", json.RawMessage(body))
		require.Equal(t, 413, st, string(b))
		var e openaiErrorResponse
		decodeStrict(t, b, &e)
		assert.Contains(t, e.Error.Message, "JSON values ("+field+" holds", field)
		require.NotNil(t, e.Error.Param, field)
		assert.Equal(t, field, *e.Error.Param)
	}
}

// A generation whose client does not read it holds its place only while
// the loop generates it: once generated, its events wait for the client
// and a new generation is admitted (they were once refused "queue full"
// until every unread stream was closed).
func TestUnreadGenerationsGiveTheirPlacesBack(t *testing.T) {
	f := newGenFixture(t, "generation:\n  max_num_seqs: 1\n  max_queue_size: 1\n  max_batch_tokens: 32\n  max_model_len: 128\n")
	m, ok := f.set.Model("tiny-llama")
	require.True(t, ok)
	four := 4
	var held []*serving.TextStream
	for range 2 {
		ts, err := m.Generate(context.Background(), &serving.GenerateRequest{Prompt: "hi", MaxTokens: &four, IgnoreEOS: true, Logprobs: -1})
		require.NoError(t, err)
		defer ts.Close()
		held = append(held, ts)
	}
	require.Eventually(t, func() bool { return m.Generations() == 0 }, 10*time.Second, 5*time.Millisecond,
		"generated and unread: no place held")
	st, b := f.post(t, "/v1/completions", map[string]any{"model": "tiny-llama", "prompt": "hi", "max_tokens": 2})
	require.Equal(t, 200, st, string(b))
	for _, ts := range held { // their events waited, all of them
		n := 0
		for {
			ev, ok := ts.Next(context.Background())
			if !ok {
				break
			}
			require.NoError(t, ev.Err)
			n += len(ev.Tokens)
		}
		assert.Equal(t, 4, n)
	}
}

// vLLM's names for a language model's series, with model_name: the
// scheduler's running and waiting sequences and the KV cache's use as
// stepserve's own gauges say them while generations run, the cache's
// geometry, and the counters and histograms equal to stepserve's.
func TestVLLMMetricNames(t *testing.T) {
	f := newGenFixture(t, "generation:\n  max_num_seqs: 2\n  max_batch_tokens: 32\n  max_model_len: 256\n  block_size: 8\n  kv_cache_blocks: 64\n")
	// Steps run one at a time as the test lets them (the loop takes new
	// generations between steps), until two run and one waits.
	f.eng.gate = make(chan struct{}, 1000)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			b, _ := json.Marshal(map[string]any{"model": "tiny-llama", "prompt": strings.Repeat("word ", 5+i), "max_tokens": 40, "ignore_eos": true})
			resp, err := http.Post(f.srv.URL+"/v1/completions", "application/json", bytes.NewReader(b))
			if assert.NoError(t, err) {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	require.Eventually(t, func() bool {
		if metricValue(t, f.reg, "vllm:num_requests_running", "") == 2 && metricValue(t, f.reg, "vllm:num_requests_waiting", "") == 1 {
			return true
		}
		select {
		case f.eng.gate <- struct{}{}: // one more step
		default:
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "two running (max_num_seqs), one waiting")
	assert.Equal(t, metricValue(t, f.reg, "stepserve_generation_sequences", "running"), metricValue(t, f.reg, "vllm:num_requests_running", ""))
	assert.Equal(t, metricValue(t, f.reg, "stepserve_generation_sequences", "waiting"), metricValue(t, f.reg, "vllm:num_requests_waiting", ""))
	used := metricValue(t, f.reg, "stepserve_generation_kv_cache_blocks", "used")
	free := metricValue(t, f.reg, "stepserve_generation_kv_cache_blocks", "free")
	assert.Positive(t, used)
	assert.InDelta(t, used/(used+free), metricValue(t, f.reg, "vllm:kv_cache_usage_perc", ""), 1e-9)
	close(f.eng.gate)
	wg.Wait()
	require.Eventually(t, func() bool { return metricValue(t, f.reg, "vllm:e2e_request_latency_seconds", "") == 3 }, 10*time.Second, 5*time.Millisecond)
	for vllm, own := range map[string]string{"vllm:prompt_tokens_total": "stepserve_generation_prompt_tokens_total",
		"vllm:generation_tokens_total": "stepserve_generation_generated_tokens_total", "vllm:prefix_cache_queries_total": "stepserve_generation_prefix_cache_queried_tokens_total",
		"vllm:prefix_cache_hits_total": "stepserve_generation_prefix_cache_hit_tokens_total", "vllm:time_to_first_token_seconds": "stepserve_generation_time_to_first_token_seconds",
		"vllm:time_per_output_token_seconds": "stepserve_generation_time_per_output_token_seconds"} {
		assert.Equal(t, metricValue(t, f.reg, own, ""), metricValue(t, f.reg, vllm, ""), vllm)
	}
	assert.Equal(t, 120.0, metricValue(t, f.reg, "vllm:generation_tokens_total", ""))
	mfs, err := f.reg.Gather()
	require.NoError(t, err)
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "vllm:cache_config_info" {
			labels := map[string]string{}
			for _, l := range mf.GetMetric()[0].GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			assert.Equal(t, map[string]string{"model_name": "tiny-llama", "block_size": "8", "num_gpu_blocks": "64"}, labels)
			found = true
		}
	}
	assert.True(t, found, "vllm:cache_config_info")
}
