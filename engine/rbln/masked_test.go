package rbln

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/generation"
)

// Structured output on the worker: a constrained sequence samples in a
// decode bucket's masked twin, its token mask a section of the step's one
// input row, applied to the logits in the graph before the draw. Greedy
// and seeded tokens under the mask are the CPU engine's (the same
// sampler), every one allowed; an unconstrained sequence batched beside
// constrained ones runs as it does alone; every step is one copy each
// way, explained clean; and steps without a constrained row never take a
// masked bucket.
func TestWorkerDecoderSamplesUnderAMask(t *testing.T) {
	requireTorch(t)
	d, m, log := workerDecoder(t, "buckets:\n  batch: [1, 2, 4]\n  seq: [32]\n  context: [64]\ngeneration:\n  max_model_len: 160\n  max_num_seqs: 4\n  max_batch_tokens: 48\n  block_size: 8\n  kv_cache_blocks: 60\n")
	var masked []string
	for _, s := range d.Shapes() {
		if s.Mask && s.Seq == 1 {
			masked = append(masked, s.Label())
		}
	}
	assert.Equal(t, []string{"b1xs1xc64m", "b1xs1xc160m", "b2xs1xc64m", "b2xs1xc160m", "b4xs1xc64m", "b4xs1xc160m"}, masked)
	cpu, err := cpufallback.Engine{}.LoadDecoder(context.Background(), m)
	require.NoError(t, err)
	t.Cleanup(func() { cpu.Close() })
	loops := []*generation.Loop{enginetest.StartLoop(t, cpu, m), enginetest.StartLoop(t, d, m)}

	const n = 20
	vocab := m.Decoder.Config.Vocab
	prompts := enginetest.Prompts(1, 9, 33, 50)
	strides := func(i int) generation.Constraint {
		if i == 3 {
			return nil // beside the constrained ones, free
		}
		return &enginetest.Stride{Vocab: vocab, Every: 5 + 2*i, Offset: 31 * i}
	}
	sampling := make([]generation.Sampling, len(prompts))
	for i := range sampling {
		sampling[i] = generation.Sampling{Temperature: 0.9, TopK: 30 * (i % 2), TopP: 0.95, Seed: uint64(40 + i), Logprobs: -1}
	}
	var got [2][2][][]int32 // engine, greedy or seeded
	for e, loop := range loops {
		got[e][0] = enginetest.GenerateUnder(t, loop, prompts, n, nil, strides)
		got[e][1] = enginetest.GenerateUnder(t, loop, prompts, n, sampling, strides)
	}
	assert.Equal(t, got[0][0], got[1][0], "greedy under masks: CPU engine and worker")
	assert.Equal(t, got[0][1], got[1][1], "seeded under masks: CPU engine and worker")
	for mode := range 2 {
		for i, out := range got[1][mode][:3] {
			require.Len(t, out, n)
			c := strides(i).(*enginetest.Stride)
			for k, tok := range out {
				assert.True(t, c.Allows(k, tok), "prompt %d token %d: %d is not allowed", i, k, tok)
			}
		}
	}
	// The free sequence is what it is alone, and not what the masks
	// would have made it.
	alone := enginetest.Generate(t, loops[1], prompts[3:], n, nil)
	assert.Equal(t, alone[0], got[1][0][3], "an unconstrained sequence beside constrained ones")

	log.mu.Lock()
	var usedMasked []string
	for i, b := range log.buckets {
		x := log.steps[i]
		assert.True(t, x.Clean && x.H2D == 1 && x.D2H == 1, "bucket %s: %+v", d.p.shapes[b].Label(), x)
		if s := d.p.shapes[b]; s.Mask && !slices.Contains(usedMasked, s.Label()) {
			usedMasked = append(usedMasked, s.Label())
		}
	}
	log.buckets, log.steps, log.rows = log.buckets[:0], log.steps[:0], log.rows[:0]
	log.mu.Unlock()
	assert.NotEmpty(t, usedMasked, "no step took a masked bucket")

	// Without constraints, no masked bucket runs.
	enginetest.Generate(t, loops[1], prompts, 8, nil)
	log.mu.Lock()
	defer log.mu.Unlock()
	for _, b := range log.buckets {
		assert.False(t, d.p.shapes[b].Mask, "an unconstrained step in %s", d.p.shapes[b].Label())
	}
	// The masked twins are programs of their own, reported as decodes.
	reports := d.Programs(context.Background())
	require.Len(t, reports, len(d.p.shapes))
	for _, r := range reports {
		if strings.HasSuffix(r.Bucket, "m") && strings.Contains(r.Bucket, "xs1x") {
			assert.Equal(t, "decode", r.Kind, r.Bucket)
		}
	}
}

// generation.structured_output and prompt_logprobs false compile no twin:
// the decoder has its decode and prefill buckets only, and refuses a
// constrained sequence's step naming the key.
func TestNoMaskedBucketsWithoutStructuredOutput(t *testing.T) {
	requireTorch(t)
	d, m, _ := workerDecoder(t, "buckets:\n  batch: [1, 2]\n  seq: [32]\n  context: [64]\ngeneration:\n  max_model_len: 96\n  max_num_seqs: 2\n  max_batch_tokens: 32\n  structured_output: false\n  prompt_logprobs: false\n")
	for _, s := range d.Shapes() {
		assert.False(t, s.Mask, s.Label())
	}
	require.Len(t, d.Shapes(), 2*2+2)
	loop := enginetest.StartLoop(t, d, m)
	st, err := loop.Generate(context.Background(), generation.Request{Prompt: []int32{1, 2, 3}, MaxTokens: 4,
		Sampling: generation.Sampling{Logprobs: -1}, Constraint: &enginetest.Stride{Vocab: m.Decoder.Config.Vocab, Every: 3}})
	require.NoError(t, err)
	var last error
	for {
		ev, ok := st.Next(context.Background())
		if !ok {
			break
		}
		if ev.Err != nil {
			last = ev.Err
		}
	}
	require.Error(t, last)
	assert.Contains(t, last.Error(), "generation.structured_output is false")
}

// Penalties and logit bias on the worker: each running sequence's token
// counts stay on the device by its lane, counted as its prefill and
// masked decode steps compute its tokens. Greedy and seeded tokens under
// repetition, frequency and presence penalties and a logit bias are the
// CPU engine's (which counts in Go), alone and batched with unpenalized
// sequences, through chunked prompts, shared prefixes and preemption
// (a tight cache: sequences are recomputed, their counts rebuilt), and
// the penalties change what the model writes.
func TestWorkerDecoderPenalties(t *testing.T) {
	requireTorch(t)
	d, m, _ := workerDecoder(t, "buckets:\n  batch: [1, 2, 4]\n  seq: [32]\n  context: [64]\ngeneration:\n  max_model_len: 160\n  max_num_seqs: 4\n  max_batch_tokens: 40\n  block_size: 8\n  kv_cache_blocks: 24\n")
	cpu, err := cpufallback.Engine{}.LoadDecoder(context.Background(), m)
	require.NoError(t, err)
	t.Cleanup(func() { cpu.Close() })
	loops := []*generation.Loop{enginetest.StartLoop(t, cpu, m), enginetest.StartLoop(t, d, m)}

	shared := enginetest.Prompts(30)[0]
	prompts := [][]int32{append(slices.Clone(shared), 7, 8, 9), enginetest.Prompts(1)[0], append(slices.Clone(shared), 11), enginetest.Prompts(5, 40)[1]}
	pens := []generation.Penalties{
		{Repetition: 1.5},
		{Frequency: 0.8, Presence: 0.4},
		{Repetition: 0.7, Frequency: -0.5, Bias: []generation.LogitBias{{Token: 3, Bias: 5}, {Token: 100, Bias: -100}}},
		{}, // none, batched beside the others
	}
	const n = 24
	run := func(loop *generation.Loop, temp float32) [][]int32 {
		s := make([]generation.Sampling, len(prompts))
		for i := range s {
			s[i] = generation.Sampling{Temperature: temp, TopK: 20 * (i % 2), Seed: uint64(90 + i), Logprobs: -1, Penalties: pens[i]}
		}
		return enginetest.Generate(t, loop, prompts, n, s)
	}
	for _, temp := range []float32{0, 0.8} {
		onCPU, onWorker := run(loops[0], temp), run(loops[1], temp)
		assert.Equal(t, onCPU, onWorker, "temperature %g: CPU engine and worker", temp)
	}
	// Two-token prompts after those, on lanes they used: their first
	// token runs as a one-token row that is not sampled, which must
	// still reset and count (a masked twin), or the lane's old counts
	// would penalize them.
	two := [][]int32{{5, 6}, {7, 8}, {9}}
	ts := make([]generation.Sampling, len(two))
	for i := range ts {
		ts[i] = generation.Sampling{Logprobs: -1, Penalties: generation.Penalties{Frequency: 2, Repetition: 1.5, Presence: 1}}
	}
	assert.Equal(t, enginetest.Generate(t, loops[0], two, n, ts), enginetest.Generate(t, loops[1], two, n, ts), "short penalized prompts on used lanes")
	// The penalties change the output; without them the same prompts
	// write what they write unpenalized.
	plain := enginetest.Generate(t, loops[1], prompts, n, nil)
	penalized := run(loops[1], 0)
	for i := range 3 {
		assert.NotEqual(t, plain[i], penalized[i], "prompt %d: the penalties changed nothing", i)
	}
	assert.Equal(t, plain[3], penalized[3], "an unpenalized sequence beside penalized ones")
	// A repetition penalty of 1.5 on a greedy 24 tokens: fewer repeats.
	repeats := func(out []int32) int {
		seen, r := map[int32]bool{}, 0
		for _, tok := range append(slices.Clone(prompts[0]), out...) {
			if seen[tok] {
				r++
			}
			seen[tok] = true
		}
		return r
	}
	assert.LessOrEqual(t, repeats(penalized[0]), repeats(plain[0]))
	// The logit bias of +5 on token 3: it is written.
	assert.Contains(t, penalized[2], int32(3))
	assert.NotContains(t, penalized[2], int32(100))
}

// The prompt's log-probabilities on the worker: a scoring twin of each
// prefill bucket returns every position's next-token log-probability and
// most likely tokens beside its sampled row. They are the CPU engine's
// (to float32 rounding; the same tokens most likely), for prompts
// prefilled in one chunk, in several (a chunk's last token scored by the
// next chunk's first, NEXT), beside unscored sequences, and for a
// constrained sequence (whose last prompt token runs as a masked decode
// row).
func TestWorkerDecoderScoresPrompts(t *testing.T) {
	requireTorch(t)
	d, m, log := workerDecoder(t, "buckets:\n  batch: [1, 2, 4]\n  seq: [32]\n  context: [64]\ngeneration:\n  max_model_len: 160\n  max_num_seqs: 4\n  max_batch_tokens: 48\n  block_size: 8\n  kv_cache_blocks: 60\n")
	cpu, err := cpufallback.Engine{}.LoadDecoder(context.Background(), m)
	require.NoError(t, err)
	t.Cleanup(func() { cpu.Close() })
	prompts := enginetest.Prompts(2, 20, 70, 9)
	run := func(dec generation.Model) [][]generation.PromptLogprob {
		loop := enginetest.StartLoop(t, dec, m)
		out := make([][]generation.PromptLogprob, len(prompts))
		var sts []*generation.Stream
		for i, p := range prompts {
			r := generation.Request{Prompt: p, MaxTokens: 3, Sampling: generation.Sampling{Logprobs: -1}, ScorePrompt: i != 3, PromptTop: 3}
			if i == 2 {
				r.Constraint = &enginetest.Stride{Vocab: m.Decoder.Config.Vocab, Every: 4}
			}
			st, err := loop.Generate(context.Background(), r)
			require.NoError(t, err)
			sts = append(sts, st)
		}
		for i, st := range sts {
			for {
				ev, ok := st.Next(context.Background())
				if !ok {
					break
				}
				require.NoError(t, ev.Err)
				if ev.Prompt != nil {
					out[i] = ev.Prompt
				}
			}
		}
		return out
	}
	want, got := run(cpu), run(d)
	for i, p := range prompts {
		if i == 3 {
			assert.Nil(t, got[i], "not asked")
			continue
		}
		require.Len(t, got[i], len(p)-1, "prompt %d", i)
		for k, s := range got[i] {
			w := want[i][k]
			assert.Equal(t, p[k+1], s.Token)
			assert.InDelta(t, w.Logprob, s.Logprob, 1e-3, "prompt %d token %d", i, k+1)
			require.Len(t, s.Top, 3)
			assert.Equal(t, w.Top[0].Token, s.Top[0].Token, "prompt %d token %d: the most likely", i, k+1)
		}
	}
	scoring := false
	log.mu.Lock()
	for _, b := range log.buckets {
		if s := d.p.shapes[b]; s.Mask && s.Seq > 1 {
			scoring = true
		}
	}
	log.mu.Unlock()
	assert.True(t, scoring, "no scoring prefill step ran")
}
