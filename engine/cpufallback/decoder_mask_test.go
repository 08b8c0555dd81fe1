package cpufallback

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/generation"
)

// setConstraint allows any of its tokens at every position, and nothing
// else.
type setConstraint struct{ mask []uint32 }

func newSetConstraint(vocab int, tokens ...int32) *setConstraint {
	c := &setConstraint{mask: make([]uint32, (vocab+31)/32)}
	for _, t := range tokens {
		c.mask[t/32] |= 1 << (t % 32)
	}
	return c
}

func (c *setConstraint) Mask() []uint32 { return c.mask }
func (c *setConstraint) Done() bool     { return false }
func (c *setConstraint) Accept(t int32) error {
	if !generation.Allowed(c.mask, t) {
		return errors.New("not in the set")
	}
	return nil
}

// TestDecoderSamplesUnderAMask: the CPU engine's step applies a
// constrained sequence's mask before it samples, greedy and seeded, and
// the sequences batched beside it sample as they would alone.
func TestDecoderSamplesUnderAMask(t *testing.T) {
	dir := writeDecoder(t, enginetest.DecoderShapes["llama"], "generation:\n  max_model_len: 256\n  max_num_seqs: 8\n  max_batch_tokens: 64\n")
	loop, m := startDecoder(t, dir)
	vocab := m.Decoder.Config.Vocab
	prompts := testPrompts()
	const n = 24
	free := enginetest.Generate(t, loop, prompts, n, nil)
	allowed := []int32{5, 17, int32(vocab) - 1, 300 % int32(vocab)}
	for _, sampling := range []generation.Sampling{{Logprobs: -1}, {Temperature: 1, TopP: 0.9, Seed: 5, Logprobs: -1}} {
		st, err := loop.Generate(context.Background(), generation.Request{Prompt: prompts[0], MaxTokens: n, Sampling: sampling,
			Constraint: newSetConstraint(vocab, allowed...)})
		require.NoError(t, err)
		others := enginetest.Generate(t, loop, prompts[1:], n, nil)
		var got []int32
		for {
			ev, ok := st.Next(context.Background())
			require.True(t, ok)
			require.NoError(t, ev.Err)
			if ev.Last() {
				assert.Equal(t, generation.FinishLength, ev.Finish)
				break
			}
			got = append(got, ev.Token)
		}
		require.Len(t, got, n)
		for i, tok := range got {
			assert.True(t, slices.Contains(allowed, tok), "token %d (%d) is outside the mask", i, tok)
		}
		assert.NotEqual(t, free[0], got, "the mask changed what was sampled")
		assert.Equal(t, free[1:], others, "the unconstrained sequences sampled as alone")
	}
}
