package cpufallback

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/internal/randweights"
	"github.com/stepserve/stepserve/models"
)

// TestDecoderPromptLookup: with drafts by prompt lookup, every sequence's
// tokens are those plain decoding produces, greedy and seeded, alone and
// batched, in float32 and Q8_0; and drafts were made and kept, in fewer
// steps than tokens.
func TestDecoderPromptLookup(t *testing.T) {
	const n = 48
	// Prompts that repeat themselves, as a quote or an edit does, and
	// the usual ones.
	quote := enginetest.Prompts(12)[0]
	prompts := append([][]int32{append(append(append([]int32{}, quote...), 7, 8), quote...)}, testPrompts()...)
	sampling := make([]generation.Sampling, len(prompts))
	for i := range sampling {
		sampling[i] = generation.Sampling{Logprobs: -1}
		if i%2 == 1 {
			sampling[i] = generation.Sampling{Temperature: 0.7, TopK: 40, Seed: uint64(i), Logprobs: 2}
		}
	}
	for _, quant := range []string{"", "quantization: q8_0\n"} {
		t.Run("q8="+quant, func(t *testing.T) {
			keys := quant + "generation:\n  max_model_len: 256\n  max_num_seqs: 8\n  max_batch_tokens: 64\n"
			plain := writeDecoder(t, enginetest.DecoderShapes["llama"], keys)
			looked := writeDecoder(t, enginetest.DecoderShapes["llama"], keys+"  speculative:\n    num_speculative_tokens: 5\n    prompt_lookup_min: 1\n")
			loop, _ := startDecoder(t, plain)
			want := enginetest.Generate(t, loop, prompts, n, sampling)

			loop, m := startDecoder(t, looked)
			require.Equal(t, 5, m.Config.Generation.Speculative.NumSpeculativeTokens)
			var steps, drafted, kept int
			loop.Observe = func(step *generation.Step, _ time.Duration, _ generation.State) {
				if len(step.Work) > 0 {
					steps++
				}
				drafted += step.DraftTokens
				kept += step.AcceptedTokens
			}
			assert.Equal(t, want, enginetest.Generate(t, loop, prompts, n, sampling), "batched")
			for i, p := range prompts[:3] {
				assert.Equal(t, want[i], enginetest.Generate(t, loop, [][]int32{p}, n, sampling[i:i+1])[0], "prompt %d alone", i)
			}
			assert.Positive(t, drafted)
			assert.Positive(t, kept)
			assert.LessOrEqual(t, kept, drafted)
			t.Logf("%d steps, %d tokens drafted, %d kept", steps, drafted, kept)
		})
	}
}

// TestDecoderLookupLogprobs: a drafted step's tokens carry the
// log-probabilities plain decoding gives them.
func TestDecoderLookupLogprobs(t *testing.T) {
	keys := "generation:\n  max_model_len: 256\n  max_num_seqs: 4\n  max_batch_tokens: 64\n"
	quote := enginetest.Prompts(10)[0]
	prompt := append(append(append([]int32{}, quote...), 9), quote...)
	run := func(dir string) []generation.Event {
		loop, _ := startDecoder(t, dir)
		st, err := loop.Generate(context.Background(), generation.Request{Prompt: prompt, MaxTokens: 24, Sampling: generation.Sampling{Logprobs: 3}})
		require.NoError(t, err)
		var evs []generation.Event
		for {
			ev, ok := st.Next(context.Background())
			if !ok {
				return evs
			}
			evs = append(evs, ev)
		}
	}
	want := run(writeDecoder(t, enginetest.DecoderShapes["llama"], keys))
	got := run(writeDecoder(t, enginetest.DecoderShapes["llama"], keys+"  speculative:\n    prompt_lookup_min: 1\n"))
	require.Len(t, got, len(want))
	for i := range want {
		assert.Equal(t, want[i].Token, got[i].Token, "event %d", i)
		assert.InDelta(t, want[i].Logprob, got[i].Logprob, 1e-4, "event %d", i)
		require.Len(t, got[i].Top, len(want[i].Top), "event %d", i)
		for j := range want[i].Top {
			assert.Equal(t, want[i].Top[j].Token, got[i].Top[j].Token, "event %d top %d", i, j)
		}
	}
}

// TestLookupNeedsAVerifier: speculative decoding on a model whose steps
// do not verify drafts is refused, with the reason.
func TestLookupNeedsAVerifier(t *testing.T) {
	dir := writeDecoder(t, enginetest.DecoderShapes["llama"], "generation:\n  max_model_len: 64\n  speculative: {}\n")
	m, err := models.Load(dir)
	require.NoError(t, err)
	_, err = generation.NewLoop(m.Config.Generation.Loop(), stepFunc(nil))
	require.ErrorContains(t, err, "verify drafts")
}

type stepFunc func(ctx context.Context, step *generation.Step) ([]generation.Sampled, error)

func (f stepFunc) Step(ctx context.Context, step *generation.Step) ([]generation.Sampled, error) {
	return f(ctx, step)
}

// BenchmarkDraftStep times a decode step of one sequence of a
// SmolLM-135M-shaped decoder (vocab 49152) at 300 tokens of context with a
// draft of 0 to 8 tokens (prompt lookup): what a drafted step costs
// against a plain one, in float32 and Q8_0.
//
//	go test -run '^$' -bench DraftStep ./engine/cpufallback
func BenchmarkDraftStep(b *testing.B) {
	shape := randweights.SmolLM(49152)
	for _, dtype := range []string{"f32", "q8_0"} {
		yaml := "generation:\n  max_model_len: 512\n  max_num_seqs: 4\n  max_batch_tokens: 256\n"
		if dtype == "q8_0" {
			yaml = "quantization: q8_0\n" + yaml
		}
		m, err := models.Load(writeDecoder(b, shape, yaml))
		require.NoError(b, err)
		dec, err := Engine{}.LoadDecoder(context.Background(), m)
		require.NoError(b, err)
		for _, k := range []int{0, 1, 2, 4, 8} {
			opts := m.Config.Generation.Loop()
			opts.PromptLookup = generation.PromptLookup{Tokens: max(k, 1), MaxN: 2, MinN: 1}
			s, err := generation.New(opts)
			require.NoError(b, err)
			prompt := make([]int32, 300)
			for j := range prompt {
				prompt[j] = int32(3 + j%20) // a loop: every lookup finds a draft
			}
			require.NoError(b, s.Add(&generation.Sequence{Prompt: prompt, MaxTokens: 100, NoDraft: k == 0, Sampling: generation.Sampling{Logprobs: -1}}))
			step := s.Schedule()
			for step.Tokens() > 1+k || len(step.Work[0].Draft) != k {
				out, err := dec.Step(context.Background(), step)
				require.NoError(b, err)
				s.Advance(step, []int32{out[0].Token})
				step = s.Schedule()
			}
			b.Run(fmt.Sprintf("%s/draft=%d", dtype, k), func(b *testing.B) {
				for b.Loop() {
					if _, err := dec.Step(context.Background(), step); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/step")
			})
		}
		dec.Close()
	}
}
