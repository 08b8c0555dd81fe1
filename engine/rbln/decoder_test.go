package rbln

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/models"
)

// The worker's decoder on the torch engine (a real worker on torch's
// CPU): its greedy tokens equal the hand-written torch Llama's
// (engine/cpufallback/testdata/llama_ref.py, recomputing every prefix)
// alone, batched and after preemption; in bfloat16, the first 16 do.

func TestWorkerDecoderMatchesTorch(t *testing.T) {
	requireTorch(t)
	const n = 64
	prompts := enginetest.Prompts(1, 5, 17, 40, 70)
	for name, shape := range enginetest.DecoderShapes {
		t.Run(name, func(t *testing.T) {
			// Small buckets and a tight cache: prompts are prefilled in
			// chunks split over several steps, rows pad, and sequences
			// are preempted and recomputed.
			dir := enginetest.WriteDecoder(t, shape, 11, "engine: torch\nbuckets:\n  batch: [1, 2, 4]\n  seq: [32]\ngeneration:\n  max_model_len: 160\n  max_num_seqs: 4\n  max_batch_tokens: 48\n  block_size: 8\n  kv_cache_blocks: 40\n")
			want := enginetest.TorchGreedy(t, dir, prompts, n, "float32")
			m, err := models.Load(dir)
			require.NoError(t, err)
			e, _ := newEngine(t, Options{})
			dec, err := e.LoadDecoder(context.Background(), m)
			require.NoError(t, err)
			defer dec.Close()
			loop := enginetest.StartLoop(t, dec, m)
			assert.Equal(t, want[:1], enginetest.Generate(t, loop, prompts[:1], n, nil), "alone")
			assert.Equal(t, want, enginetest.Generate(t, loop, prompts, n, nil), "batched, chunked, preempted, prefixes shared")

			// Seeded sampling: the same tokens alone and batched, and the
			// same draws as the CPU engine's where the two agree on the
			// distribution (the same counter-based generator).
			sampling := make([]generation.Sampling, len(prompts))
			for i := range sampling {
				sampling[i] = generation.Sampling{Temperature: 0.7, TopK: 40 * (i % 2), TopP: 0.9, Seed: uint64(7 + i), Logprobs: 3}
			}
			batched := enginetest.Generate(t, loop, prompts, 24, sampling)
			alone := enginetest.Generate(t, loop, prompts[2:3], 24, sampling[2:3])
			assert.Equal(t, batched[2], alone[0], "a seeded sequence alone and batched")
			cpu, err := cpufallback.Engine{}.LoadDecoder(context.Background(), m)
			require.NoError(t, err)
			defer cpu.Close()
			onCPU := enginetest.Generate(t, enginetest.StartLoop(t, cpu, m), prompts, 24, sampling)
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
	prompts := enginetest.Prompts(1, 5, 17)
	dir := enginetest.WriteDecoder(t, enginetest.DecoderShapes["llama"], 11, "engine: torch\ndevice_dtype: bfloat16\ngeneration:\n  max_model_len: 128\n  max_num_seqs: 4\n  max_batch_tokens: 64\n")
	want := enginetest.TorchGreedy(t, dir, prompts, n, "bfloat16")
	m, err := models.Load(dir)
	require.NoError(t, err)
	e, _ := newEngine(t, Options{Env: map[string]string{cpuDtypeEnv: "device"}})
	dec, err := e.LoadDecoder(context.Background(), m)
	require.NoError(t, err)
	defer dec.Close()
	assert.Equal(t, want, enginetest.Generate(t, enginetest.StartLoop(t, dec, m), prompts, n, nil))
}
