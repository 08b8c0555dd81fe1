package cpufallback

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/internal/randweights"
	"github.com/stepserve/stepserve/models"
)

// startDecoder loads the folder on the CPU engine and runs its loop.
func startDecoder(t testing.TB, dir string) (*generation.Loop, *models.Model) {
	t.Helper()
	m, err := models.Load(dir)
	require.NoError(t, err)
	dec, err := Engine{}.LoadDecoder(context.Background(), m)
	require.NoError(t, err)
	t.Cleanup(func() { dec.Close() })
	return enginetest.StartLoop(t, dec, m), m
}

func testPrompts() [][]int32 { return enginetest.Prompts(1, 5, 17, 40, 3, 70) }

// writeDecoder writes a random decoder of shape, on the CPU engine with
// the generation keys yaml.
func writeDecoder(t testing.TB, shape randweights.Decoder, yaml string) string {
	return enginetest.WriteDecoder(t, shape, 7, "engine: cpu\n"+yaml)
}

// TestDecoderMatchesTorch holds the CPU engine's greedy tokens to a
// hand-written torch Llama that recomputes every prefix (no cache): for
// 64 new tokens, each prompt alone, all of them batched, with prompts
// prefilled in small chunks, and with a KV cache so small that sequences
// are preempted and recomputed.
func TestDecoderMatchesTorch(t *testing.T) {
	const n = 64
	prompts := testPrompts()
	for name, shape := range enginetest.DecoderShapes {
		t.Run(name, func(t *testing.T) {
			base := writeDecoder(t, shape, "generation:\n  max_model_len: 256\n  max_num_seqs: 8\n  max_batch_tokens: 64\n")
			want := enginetest.TorchGreedy(t, base, prompts, n, "float32")

			loop, _ := startDecoder(t, base)
			for i, p := range prompts {
				assert.Equal(t, want[i], enginetest.Generate(t, loop, [][]int32{p}, n, nil)[0], "prompt %d alone", i)
			}
			assert.Equal(t, want, enginetest.Generate(t, loop, prompts, n, nil), "batched")

			chunked := writeDecoder(t, shape, "generation:\n  max_model_len: 256\n  max_num_seqs: 4\n  max_batch_tokens: 8\n  block_size: 4\n")
			loop, _ = startDecoder(t, chunked)
			assert.Equal(t, want, enginetest.Generate(t, loop, prompts, n, nil), "chunked prefill, 4 sequences at a time")

			tight := writeDecoder(t, shape, "generation:\n  max_model_len: 160\n  max_num_seqs: 6\n  max_batch_tokens: 32\n  block_size: 8\n  kv_cache_blocks: 30\n")
			loop, _ = startDecoder(t, tight)
			assert.Equal(t, want, enginetest.Generate(t, loop, prompts, n, nil), "a KV cache that preempts")
		})
	}
}

// TestDecoderSeededSampling: a seeded sequence draws the same tokens
// alone and batched with others, whatever they ask for.
func TestDecoderSeededSampling(t *testing.T) {
	dir := writeDecoder(t, enginetest.DecoderShapes["llama"], "generation:\n  max_model_len: 256\n  max_num_seqs: 8\n  max_batch_tokens: 64\n")
	loop, _ := startDecoder(t, dir)
	prompts := testPrompts()
	sampling := make([]generation.Sampling, len(prompts))
	for i := range sampling {
		sampling[i] = generation.Sampling{Temperature: 0.8 + 0.1*float32(i), TopK: 50 * (i % 3), TopP: []float32{1, 0.9, 0.5}[i%3], Seed: uint64(100 + i), Logprobs: -1}
	}
	batched := enginetest.Generate(t, loop, prompts, 32, sampling)
	for i, p := range prompts {
		alone := enginetest.Generate(t, loop, [][]int32{p}, 32, sampling[i:i+1])
		assert.Equal(t, batched[i], alone[0], "prompt %d", i)
	}
	greedy := enginetest.Generate(t, loop, prompts[:1], 32, nil)
	assert.NotEqual(t, greedy[0], batched[0], "temperature 0.8 drew the greedy tokens throughout")
	other := sampling[0]
	other.Seed++
	assert.NotEqual(t, batched[0], enginetest.Generate(t, loop, prompts[:1], 32, []generation.Sampling{other})[0], "another seed drew the same")
}

// TestDecoderStepAllocs: a decode step allocates nothing.
func TestDecoderStepAllocs(t *testing.T) {
	dir := writeDecoder(t, enginetest.DecoderShapes["llama"], "generation:\n  max_model_len: 256\n  max_num_seqs: 4\n  max_batch_tokens: 64\n")
	m, err := models.Load(dir)
	require.NoError(t, err)
	dec, err := Engine{}.LoadDecoder(context.Background(), m)
	require.NoError(t, err)
	defer dec.Close()
	g := m.Config.Generation
	s, err := generation.New(generation.Options{Blocks: g.KVCacheBlocks, BlockSize: g.BlockSize, MaxNumSeqs: 4, MaxModelLen: 256, MaxBatchTokens: 64})
	require.NoError(t, err)
	for i := range 4 {
		require.NoError(t, s.Add(&generation.Sequence{Prompt: []int32{int32(i + 1), 7, 9}, MaxTokens: 200, Sampling: generation.Sampling{Logprobs: -1}}))
	}
	step := s.Schedule() // the prompts
	out, err := dec.Step(context.Background(), step)
	require.NoError(t, err)
	tokens := make([]int32, len(out))
	advance := func() {
		for i, o := range out {
			tokens[i] = o.Token
		}
		s.Advance(step, tokens)
	}
	advance()
	step = s.Schedule() // a decode step; run again and again, it rewrites the same cache slots
	require.Len(t, step.Work, 4)
	allocs := testing.AllocsPerRun(20, func() {
		out, err = dec.Step(context.Background(), step)
	})
	require.NoError(t, err)
	assert.Zero(t, allocs, "allocations per decode step of 4 sequences")
	for i := range step.Work {
		step.Work[i].Seq.Sampling = generation.Sampling{Temperature: 0.7, TopK: 40, TopP: 0.9, Seed: 3, Logprobs: 5}
	}
	allocs = testing.AllocsPerRun(20, func() {
		out, err = dec.Step(context.Background(), step)
	})
	require.NoError(t, err)
	assert.Zero(t, allocs, "allocations per sampled decode step with top_logprobs")
	assert.Len(t, out[0].Top, 5)
}

// BenchmarkDecodeStep times one decode step of a SmolLM-135M-shaped
// decoder (vocab 8192) at 1 and 16 sequences of 256 tokens of context,
// float32, bfloat16 (where the CPU has them) and Q8_0 weights:
//
//	go test -run '^$' -bench DecodeStep ./engine/cpufallback
func BenchmarkDecodeStep(b *testing.B) {
	shape := randweights.SmolLM(8192)
	for _, dtype := range []string{"", "bfloat16", "q8_0"} {
		if dtype == "bfloat16" && !BFloat16() {
			continue
		}
		yaml := ""
		switch dtype {
		case "bfloat16":
			yaml = "device_dtype: bfloat16\n"
		case "q8_0":
			yaml = "quantization: q8_0\n"
		}
		dir := writeDecoder(b, shape, yaml+"generation:\n  max_model_len: 512\n  max_num_seqs: 16\n  max_batch_tokens: 256\n")
		m, err := models.Load(dir)
		require.NoError(b, err)
		dec, err := Engine{}.LoadDecoder(context.Background(), m)
		require.NoError(b, err)
		for _, seqs := range []int{1, 8, 16} {
			g := m.Config.Generation
			s, err := generation.New(generation.Options{Blocks: g.KVCacheBlocks, BlockSize: g.BlockSize, MaxNumSeqs: seqs, MaxModelLen: 512, MaxBatchTokens: 256})
			require.NoError(b, err)
			for i := range seqs {
				prompt := make([]int32, 256)
				for j := range prompt {
					prompt[j] = int32(3 + (i*131+j*37)%8000)
				}
				require.NoError(b, s.Add(&generation.Sequence{Prompt: prompt, MaxTokens: 100, Sampling: generation.Sampling{Logprobs: -1}}))
			}
			var step *generation.Step
			for {
				step = s.Schedule()
				if step.Tokens() == len(step.Work) && len(step.Work) == seqs {
					break // every sequence decodes
				}
				out, err := dec.Step(context.Background(), step)
				require.NoError(b, err)
				tokens := make([]int32, len(out))
				for i, o := range out {
					tokens[i] = o.Token
				}
				s.Advance(step, tokens)
			}
			name := map[string]string{"": "f32", "bfloat16": "bf16", "q8_0": "q8_0"}[dtype]
			b.Run(fmt.Sprintf("%s/seqs=%d", name, seqs), func(b *testing.B) {
				for b.Loop() {
					if _, err := dec.Step(context.Background(), step); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(seqs*b.N)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
		dec.Close()
	}
}

// BenchmarkDecodeContext times a decode step of one sequence at 64 tokens
// of context on the demo's Llama shape with max_model_len 1024 and 128: a
// step's work follows the sequence's context, not max_model_len (the
// torch engine's counterpart is engine/rbln's BenchmarkCompiledDecoder).
// Compare the two lines of one run.
//
//	go test -run '^$' -bench DecodeContext ./engine/cpufallback
func BenchmarkDecodeContext(b *testing.B) {
	for _, maxLen := range []int{1024, 128} {
		dir := writeDecoder(b, enginetest.DecoderShapes["llama"], fmt.Sprintf("generation:\n  max_model_len: %d\n  max_num_seqs: 16\n  max_tokens: 32\n", maxLen))
		m, err := models.Load(dir)
		require.NoError(b, err)
		dec, err := Engine{}.LoadDecoder(context.Background(), m)
		require.NoError(b, err)
		g := m.Config.Generation
		s, err := generation.New(generation.Options{Blocks: g.KVCacheBlocks, BlockSize: g.BlockSize, MaxNumSeqs: 1, MaxModelLen: maxLen, MaxBatchTokens: 256})
		require.NoError(b, err)
		require.NoError(b, s.Add(&generation.Sequence{Prompt: enginetest.Prompts(63)[0], MaxTokens: 32, Sampling: generation.Sampling{Logprobs: -1}}))
		step := s.Schedule() // the prompt
		out, err := dec.Step(context.Background(), step)
		require.NoError(b, err)
		s.Advance(step, []int32{out[0].Token})
		step = s.Schedule() // the decode at position 63: a context of 64
		require.Equal(b, 1, step.Tokens())
		b.Run(fmt.Sprintf("len%d", maxLen), func(b *testing.B) {
			for b.Loop() {
				if _, err := dec.Step(context.Background(), step); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(b.Elapsed().Seconds()*1e6/float64(b.N), "µs/token")
		})
		dec.Close()
	}
}
