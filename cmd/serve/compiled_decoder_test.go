package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/enginetest"
)

// TestCompiledTinyLlamaServingRun serves the shipped tiny-llama on the
// torch engine compiled with inductor (the torch 2.x root, strict
// warm-up) and sends it 100 completions, streamed and not, eight at a
// time, of prompts from 1 to 600 tokens, some sharing a prefix, in a KV
// cache too small for them all (preemption), one in five constrained
// (guided_choice, or guided_json with a schema): afterwards every program
// in /explain is inductor's, one graph, no break, no recompile, nothing
// found by the step audit (the decode buckets' masked twins included),
// every completion was answered, and every constrained one is what its
// constraint allows.
func TestCompiledTinyLlamaServingRun(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles a language model's buckets (minutes): make test-long")
	}
	python := os.Getenv("TORCH2_PYTHON")
	if python == "" {
		t.Skip("TORCH2_PYTHON is unset: make test-long runs this in the torch 2.x root (make torch2-root)")
	}
	repo := t.TempDir()
	// Decode buckets of 4 and 16 rows in the default context partitions
	// (128, 512, 1024), prefill chunks of 64 tokens.
	enginetest.CopyModel(t, "../../model_repository/tiny-llama", filepath.Join(repo, "tiny-llama"), `engine: torch
buckets:
  batch: [4, 16]
  seq: [64]
generation:
  max_num_seqs: 16
  max_model_len: 1024
  max_batch_tokens: 64
  max_tokens: 32
  kv_cache_blocks: 96
`)
	p := startCmdWithin(t, exec.Command(binPath, "--server.addr", "127.0.0.1:0", "--model_repository", repo,
		"--rbln.python", python, "--rbln.torch_compile", "inductor", "--rbln.strict_warmup=true"), 10*time.Minute)

	rng := rand.New(rand.NewPCG(45, 45))
	shared := make([]int, 300)
	for i := range shared {
		shared[i] = 3 + rng.IntN(500)
	}
	var wg sync.WaitGroup
	jobs := make(chan int)
	var mu sync.Mutex
	answered, streamed, longest := 0, 0, 0
	for range 8 {
		wg.Go(func() {
			for i := range jobs {
				n := 1 + (i*599)/99 // 1 to 600 tokens
				prompt := make([]int, n)
				for j := range prompt {
					prompt[j] = 3 + (i*31+j*7)%500
				}
				if i%3 == 0 && n > len(shared) {
					copy(prompt, shared) // a prefix the cache has seen
				}
				stream := i%2 == 1
				req := map[string]any{"model": "tiny-llama", "prompt": prompt, "max_tokens": 8 + i%24,
					"stream": stream, "temperature": float64(i%3) * 0.5, "seed": i}
				switch i % 10 {
				case 0:
					req["guided_json"], req["max_tokens"] = compiledSchema, 64
				case 5:
					req["guided_choice"] = compiledChoices
				}
				body, _ := json.Marshal(req)
				resp, err := http.Post(p.base+"/v1/completions", "application/json", bytes.NewReader(body))
				if !assert.NoError(t, err) {
					continue
				}
				ok := resp.StatusCode == http.StatusOK
				var text strings.Builder
				sc := bufio.NewScanner(resp.Body)
				sc.Buffer(make([]byte, 1<<20), 1<<20)
				done := !stream
				for sc.Scan() {
					text.WriteString(sc.Text() + "\n")
					done = done || sc.Text() == "data: [DONE]"
				}
				resp.Body.Close()
				assert.True(t, ok && done, "completion %d (%d prompt tokens, stream %v): %d %s", i, n, stream, resp.StatusCode, text.String())
				if ok && done && i%5 == 0 {
					checkConstrained(t, i, text.String(), stream)
				}
				mu.Lock()
				if ok && done {
					answered++
					if stream {
						streamed++
					}
				}
				longest = max(longest, n)
				mu.Unlock()
			}
		})
	}
	for i := range 100 {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	assert.Equal(t, 100, answered)
	t.Logf("%d completions answered (%d streamed), prompts up to %d tokens", answered, streamed, longest)

	resp, err := http.Get(p.base + "/v2/models/tiny-llama/explain")
	require.NoError(t, err)
	defer resp.Body.Close()
	var x struct {
		Programs []engine.ProgramReport `json:"programs"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&x))
	// 2 batch sizes x (3 context partitions, masked and not, + 1 prefill
	// chunk length, scoring and not).
	require.Len(t, x.Programs, 16)
	kinds := map[string]int{}
	for _, r := range x.Programs {
		kinds[r.Kind]++
	}
	total := enginetest.CompiledWhole(t, x.Programs)
	assert.Equal(t, map[string]int{"decode": 12, "prefill": 4}, kinds)
	t.Logf("16 programs compiled in %.1f s in all", total)
	metrics := scrape(t, p.base)
	assert.NotRegexp(t, `stepserve_program_recompiles\{[^}]*model="tiny-llama"[^}]*\} [1-9]`, metrics)
	assert.NotRegexp(t, `stepserve_step_audit_findings\{[^}]*model="tiny-llama"[^}]*\} [1-9]`, metrics)
}

// The constraints of TestCompiledTinyLlamaServingRun's constrained
// completions.
var (
	compiledSchema  = json.RawMessage(`{"type":"object","properties":{"c":{"enum":["x","y"]},"b":{"type":"boolean"}},"required":["c","b"],"additionalProperties":false}`)
	compiledChoices = []string{"yes", "no", "maybe"}
)

// checkConstrained holds completion i's answer (the body, or its events)
// to its constraint: one of the choices, or JSON of the schema.
func checkConstrained(t *testing.T, i int, body string, stream bool) {
	t.Helper()
	var text strings.Builder
	for _, line := range strings.Split(body, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !stream {
			data, ok = line, line != ""
		}
		if !ok || data == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct{ Text string } `json:"choices"`
		}
		if assert.NoError(t, json.Unmarshal([]byte(data), &c), data) && len(c.Choices) > 0 {
			text.WriteString(c.Choices[0].Text)
		}
	}
	out := text.String()
	if i%10 == 5 {
		assert.Contains(t, compiledChoices, out, "completion %d", i)
		return
	}
	var v struct {
		C *string `json:"c"`
		B *bool   `json:"b"`
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if assert.NoError(t, dec.Decode(&v), "completion %d: %q", i, out) {
		assert.True(t, v.C != nil && v.B != nil && (*v.C == "x" || *v.C == "y"), "completion %d: %q", i, out)
	}
}
