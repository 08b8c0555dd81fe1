package cpufallback

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

	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/internal/randweights"
	"github.com/stepserve/stepserve/models"
)

// decoderShapes are the random decoders the engine is held to the torch
// reference on: the shipped demo's shape, and a Qwen2-style one with
// q/k/v biases, llama3 RoPE scaling and four query heads per KV head.
var decoderShapes = map[string]randweights.Decoder{
	"llama": {Arch: "LlamaForCausalLM", Vocab: 512, Hidden: 128, Layers: 2, Heads: 4, KVHeads: 2, Inter: 344,
		MaxPosition: 2048, RopeTheta: 10000, BOS: 0, EOS: 2},
	"qwen2": {Arch: "Qwen2ForCausalLM", Vocab: 512, Hidden: 96, Layers: 3, Heads: 8, KVHeads: 2, Inter: 200,
		MaxPosition: 4096, RopeTheta: 500000, QKVBias: true, Llama3Scaling: true, BOS: 0, EOS: 2},
}

// writeDecoder writes a random decoder folder of shape into a temporary
// repository, with model.yaml's generation keys yaml, and returns the
// folder.
func writeDecoder(t testing.TB, shape randweights.Decoder, yaml string) string {
	t.Helper()
	tok, err := os.ReadFile("../../models/testdata/tokenizers/bpe.json")
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "lm")
	require.NoError(t, randweights.WriteDecoderFolder(dir, randweights.DecoderFolder{Shape: shape, Seed: 7, Tokenizer: tok,
		ModelYAML: "engine: cpu\n" + yaml, Generator: t.Name()}))
	return dir
}

// torchGreedy runs testdata/llama_ref.py: each prompt's greedy
// continuation of n tokens, recomputed from scratch for every token.
func torchGreedy(t *testing.T, dir string, prompts [][]int32, n int) [][]int32 {
	t.Helper()
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3 (python3-torch) to compute the reference")
	}
	in, err := json.Marshal(prompts)
	require.NoError(t, err)
	cmd := exec.Command("/usr/bin/python3", "testdata/llama_ref.py", dir, fmt.Sprint(n), "float32")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "the torch reference: %s", stderr.String())
	var ids [][]int32
	require.NoError(t, json.Unmarshal(out, &ids))
	return ids
}

// startDecoder loads the folder on the CPU engine and runs its loop.
func startDecoder(t testing.TB, dir string) (*generation.Loop, *models.Model) {
	t.Helper()
	m, err := models.Load(dir)
	require.NoError(t, err)
	dec, err := Engine{}.LoadDecoder(context.Background(), m)
	require.NoError(t, err)
	g := m.Config.Generation
	loop, err := generation.NewLoop(generation.Options{Blocks: g.KVCacheBlocks, BlockSize: g.BlockSize, MaxNumSeqs: g.MaxNumSeqs,
		MaxModelLen: g.MaxModelLen, MaxBatchTokens: g.MaxBatchTokens, PrefixCaching: true}, dec)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { loop.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; dec.Close() })
	return loop, m
}

// generate runs each prompt through loop at once, max tokens each and no
// end-of-sequence token, and returns what each produced.
func generate(t *testing.T, loop *generation.Loop, prompts [][]int32, max int, sampling []generation.Sampling) [][]int32 {
	t.Helper()
	out := make([][]int32, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		var s generation.Sampling
		if sampling != nil {
			s = sampling[i]
		}
		st, err := loop.Generate(context.Background(), generation.Request{Prompt: p, MaxTokens: max, Sampling: s})
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

func testPrompts() [][]int32 {
	var ps [][]int32
	for i, n := range []int{1, 5, 17, 40, 3, 70} {
		p := make([]int32, n)
		for j := range p {
			p[j] = int32((i*131 + j*37 + 11) % 500)
		}
		ps = append(ps, p)
	}
	return ps
}

// TestDecoderMatchesTorch holds the CPU engine's greedy tokens to a
// hand-written torch Llama that recomputes every prefix (no cache): for
// 64 new tokens, each prompt alone, all of them batched, with prompts
// prefilled in small chunks, and with a KV cache so small that sequences
// are preempted and recomputed.
func TestDecoderMatchesTorch(t *testing.T) {
	const n = 64
	prompts := testPrompts()
	for name, shape := range decoderShapes {
		t.Run(name, func(t *testing.T) {
			base := writeDecoder(t, shape, "generation:\n  max_model_len: 256\n  max_num_seqs: 8\n  max_batch_tokens: 64\n")
			want := torchGreedy(t, base, prompts, n)

			loop, _ := startDecoder(t, base)
			for i, p := range prompts {
				assert.Equal(t, want[i], generate(t, loop, [][]int32{p}, n, nil)[0], "prompt %d alone", i)
			}
			assert.Equal(t, want, generate(t, loop, prompts, n, nil), "batched")

			chunked := writeDecoder(t, shape, "generation:\n  max_model_len: 256\n  max_num_seqs: 4\n  max_batch_tokens: 8\n  block_size: 4\n")
			loop, _ = startDecoder(t, chunked)
			assert.Equal(t, want, generate(t, loop, prompts, n, nil), "chunked prefill, 4 sequences at a time")

			tight := writeDecoder(t, shape, "generation:\n  max_model_len: 160\n  max_num_seqs: 6\n  max_batch_tokens: 32\n  block_size: 8\n  kv_cache_blocks: 30\n")
			loop, _ = startDecoder(t, tight)
			assert.Equal(t, want, generate(t, loop, prompts, n, nil), "a KV cache that preempts")
		})
	}
}

// TestDecoderSeededSampling: a seeded sequence draws the same tokens
// alone and batched with others, whatever they ask for.
func TestDecoderSeededSampling(t *testing.T) {
	dir := writeDecoder(t, decoderShapes["llama"], "generation:\n  max_model_len: 256\n  max_num_seqs: 8\n  max_batch_tokens: 64\n")
	loop, _ := startDecoder(t, dir)
	prompts := testPrompts()
	sampling := make([]generation.Sampling, len(prompts))
	for i := range sampling {
		sampling[i] = generation.Sampling{Temperature: 0.8 + 0.1*float32(i), TopK: 50 * (i % 3), TopP: []float32{1, 0.9, 0.5}[i%3], Seed: uint64(100 + i), Logprobs: -1}
	}
	batched := generate(t, loop, prompts, 32, sampling)
	for i, p := range prompts {
		alone := generate(t, loop, [][]int32{p}, 32, sampling[i:i+1])
		assert.Equal(t, batched[i], alone[0], "prompt %d", i)
	}
	greedy := generate(t, loop, prompts[:1], 32, nil)
	assert.NotEqual(t, greedy[0], batched[0], "temperature 0.8 drew the greedy tokens throughout")
	other := sampling[0]
	other.Seed++
	assert.NotEqual(t, batched[0], generate(t, loop, prompts[:1], 32, []generation.Sampling{other})[0], "another seed drew the same")
}

// TestDecoderStepAllocs: a decode step allocates nothing.
func TestDecoderStepAllocs(t *testing.T) {
	dir := writeDecoder(t, decoderShapes["llama"], "generation:\n  max_model_len: 256\n  max_num_seqs: 4\n  max_batch_tokens: 64\n")
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
