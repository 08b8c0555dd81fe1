package rbln

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/internal/randweights"
	"github.com/stepserve/stepserve/models"
)

// The worker's decoder on the torch engine (a real worker on torch's
// CPU): its greedy tokens equal the hand-written torch Llama's
// (engine/cpufallback/testdata/llama_ref.py, recomputing every prefix)
// alone, batched and after preemption; in bfloat16, the first 16 do.

var workerDecoders = map[string]randweights.Decoder{
	"llama": {Arch: "LlamaForCausalLM", Vocab: 512, Hidden: 128, Layers: 2, Heads: 4, KVHeads: 2, Inter: 344,
		MaxPosition: 2048, RopeTheta: 10000, BOS: 0, EOS: 2},
	"qwen2": {Arch: "Qwen2ForCausalLM", Vocab: 512, Hidden: 96, Layers: 3, Heads: 8, KVHeads: 2, Inter: 200,
		MaxPosition: 4096, RopeTheta: 500000, QKVBias: true, Llama3Scaling: true, BOS: 0, EOS: 2},
}

func writeWorkerDecoder(t *testing.T, shape randweights.Decoder, yaml string) string {
	t.Helper()
	tok, err := os.ReadFile("../../models/testdata/tokenizers/bpe.json")
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "lm")
	require.NoError(t, randweights.WriteDecoderFolder(dir, randweights.DecoderFolder{Shape: shape, Seed: 11, Tokenizer: tok,
		ModelYAML: "engine: torch\n" + yaml, Generator: t.Name()}))
	return dir
}

func torchReference(t *testing.T, dir string, prompts [][]int32, n int, dtype string) [][]int32 {
	t.Helper()
	in, err := json.Marshal(prompts)
	require.NoError(t, err)
	cmd := exec.Command(python, "../cpufallback/testdata/llama_ref.py", dir, fmt.Sprint(n), dtype)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "the torch reference: %s", stderr.String())
	var ids [][]int32
	require.NoError(t, json.Unmarshal(out, &ids))
	return ids
}

func runLoop(t *testing.T, dec generation.Model, m *models.Model, prompts [][]int32, n int, sampling []generation.Sampling) [][]int32 {
	t.Helper()
	g := m.Config.Generation
	loop, err := generation.NewLoop(generation.Options{Blocks: g.KVCacheBlocks, BlockSize: g.BlockSize, MaxNumSeqs: g.MaxNumSeqs,
		MaxModelLen: g.MaxModelLen, MaxBatchTokens: g.MaxBatchTokens, PrefixCaching: true}, dec)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { loop.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	out := make([][]int32, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		s := generation.Sampling{Logprobs: -1}
		if sampling != nil {
			s = sampling[i]
		}
		st, err := loop.Generate(context.Background(), generation.Request{Prompt: p, MaxTokens: n, Sampling: s})
		require.NoError(t, err)
		wg.Go(func() {
			for {
				ev, ok := st.Next(context.Background())
				if !ok {
					return
				}
				if ev.Err != nil {
					t.Errorf("prompt %d: %v", i, ev.Err)
					return
				}
				if !ev.Last() {
					out[i] = append(out[i], ev.Token)
				}
			}
		})
	}
	wg.Wait()
	return out
}

func workerPrompts() [][]int32 {
	var ps [][]int32
	for i, n := range []int{1, 5, 17, 40, 70} {
		p := make([]int32, n)
		for j := range p {
			p[j] = int32((i*131 + j*37 + 11) % 500)
		}
		ps = append(ps, p)
	}
	return ps
}

func TestWorkerDecoderMatchesTorch(t *testing.T) {
	requireTorch(t)
	const n = 64
	prompts := workerPrompts()
	for name, shape := range workerDecoders {
		t.Run(name, func(t *testing.T) {
			// Small buckets and a tight cache: prompts are prefilled in
			// chunks split over several steps, rows pad, and sequences
			// are preempted and recomputed.
			dir := writeWorkerDecoder(t, shape, "buckets:\n  batch: [1, 2, 4]\n  seq: [32]\ngeneration:\n  max_model_len: 160\n  max_num_seqs: 4\n  max_batch_tokens: 48\n  block_size: 8\n  kv_cache_blocks: 40\n")
			want := torchReference(t, dir, prompts, n, "float32")
			m, err := models.Load(dir)
			require.NoError(t, err)
			e, _ := newEngine(t, Options{})
			dec, err := e.LoadDecoder(context.Background(), m)
			require.NoError(t, err)
			defer dec.Close()
			assert.Equal(t, want[:1], runLoop(t, dec, m, prompts[:1], n, nil), "alone")
			assert.Equal(t, want, runLoop(t, dec, m, prompts, n, nil), "batched, chunked, preempted")

			// Seeded sampling: the same tokens alone and batched, and the
			// same draws as the CPU engine's where the two agree on the
			// distribution (the same counter-based generator).
			sampling := make([]generation.Sampling, len(prompts))
			for i := range sampling {
				sampling[i] = generation.Sampling{Temperature: 0.7, TopK: 40 * (i % 2), TopP: 0.9, Seed: uint64(7 + i), Logprobs: 3}
			}
			batched := runLoop(t, dec, m, prompts, 24, sampling)
			alone := runLoop(t, dec, m, prompts[2:3], 24, sampling[2:3])
			assert.Equal(t, batched[2], alone[0], "a seeded sequence alone and batched")
			cpu, err := cpufallback.Engine{}.LoadDecoder(context.Background(), m)
			require.NoError(t, err)
			defer cpu.Close()
			onCPU := runLoop(t, cpu, m, prompts, 24, sampling)
			same := 0
			for i := range prompts {
				if assert.Len(t, onCPU[i], 24) && onCPU[i][0] == batched[i][0] {
					same++
				}
			}
			assert.GreaterOrEqual(t, same, len(prompts)-1, "the first sampled token, CPU engine and worker: %v vs %v", onCPU, batched)
		})
	}
}

func TestWorkerDecoderBFloat16(t *testing.T) {
	requireTorch(t)
	const n = 16
	prompts := workerPrompts()[:3]
	dir := writeWorkerDecoder(t, workerDecoders["llama"], "device_dtype: bfloat16\ngeneration:\n  max_model_len: 128\n  max_num_seqs: 4\n  max_batch_tokens: 64\n")
	want := torchReference(t, dir, prompts, n, "bfloat16")
	m, err := models.Load(dir)
	require.NoError(t, err)
	e, _ := newEngine(t, Options{Env: map[string]string{cpuDtypeEnv: "device"}})
	dec, err := e.LoadDecoder(context.Background(), m)
	require.NoError(t, err)
	defer dec.Close()
	assert.Equal(t, want, runLoop(t, dec, m, prompts, n, nil))
}
