package generation

import (
	"context"
	"errors"
	"math"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sequenceConstraint allows exactly want, token by token, then only eos
// (or, with done, stops at once); it counts the masks asked for.
type sequenceConstraint struct {
	want  []int32
	eos   int32
	done  bool // Done once want is out: nothing may follow
	vocab int
	at    int
	masks int
	mask  []uint32
}

func (c *sequenceConstraint) Mask() []uint32 {
	c.masks++
	c.mask = make([]uint32, (c.vocab+31)/32)
	next := c.eos
	if c.at < len(c.want) {
		next = c.want[c.at]
	}
	c.mask[next/32] |= 1 << (next % 32)
	return c.mask
}

func (c *sequenceConstraint) Accept(tok int32) error {
	if !Allowed(c.mask, tok) {
		return errors.New("not allowed")
	}
	if c.at < len(c.want) {
		c.at++
	}
	return nil
}

func (c *sequenceConstraint) Done() bool { return c.done && c.at == len(c.want) }

// maskedModel samples each sequence's next token from logits that favour
// token 7, under the sequence's mask (as an engine's step does); obey
// false ignores the mask, as a broken engine would.
type maskedModel struct {
	vocab int
	obey  bool
	sp    Sampler
}

func (m *maskedModel) Step(ctx context.Context, step *Step) ([]Sampled, error) {
	out := make([]Sampled, len(step.Work))
	logits := make([]float32, m.vocab)
	for i := range logits {
		logits[i] = float32(i % 5)
	}
	logits[7] = 10
	for i, w := range step.Work {
		if !w.Samples() {
			continue
		}
		mask := w.Seq.Mask()
		if !m.obey {
			mask = nil
		}
		out[i] = m.sp.Sample(logits, mask, Sampling{Temperature: 0.7, Seed: 3, Logprobs: 0}, w.End, nil)
	}
	return out, nil
}

// A constrained sequence samples only what its constraint allows: the
// tokens it wants, then its end (an end-of-sequence token, or the
// constraint's completion); an unconstrained one beside it is untouched.
func TestLoopSamplesUnderTheConstraint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const vocab = 70
		m := &maskedModel{vocab: vocab, obey: true, sp: NewSampler(vocab)}
		l := newLoop(t, Options{Blocks: 32, BlockSize: 4, MaxNumSeqs: 4, MaxModelLen: 64, MaxBatchTokens: 16}, m)
		ctx, stop := context.WithCancel(context.Background())
		go l.Run(ctx)
		defer stop()

		byEOS := &sequenceConstraint{want: []int32{40, 2, 69, 33}, eos: 1, vocab: vocab}
		st, err := l.Generate(context.Background(), Request{Prompt: []int32{5, 6}, MaxTokens: 20, EOS: []int32{1}, Constraint: byEOS})
		require.NoError(t, err)
		free, err := l.Generate(context.Background(), Request{Prompt: []int32{5, 6}, MaxTokens: 3, EOS: []int32{1}})
		require.NoError(t, err)
		got, last := collect(st)
		assert.Equal(t, []int32{40, 2, 69, 33}, got)
		assert.Equal(t, FinishStop, last.Finish, "ended by its end-of-sequence token, the only one allowed")
		assert.Equal(t, 5, byEOS.masks, "a mask for each sampled token")
		got, last = collect(free)
		assert.Equal(t, []int32{7, 7, 7}, got, "the unconstrained sequence samples its own")
		assert.Equal(t, FinishLength, last.Finish)

		complete := &sequenceConstraint{want: []int32{9, 8}, eos: 1, done: true, vocab: vocab}
		st, err = l.Generate(context.Background(), Request{Prompt: []int32{5}, MaxTokens: 20, EOS: []int32{1}, Constraint: complete})
		require.NoError(t, err)
		got, last = collect(st)
		assert.Equal(t, []int32{9, 8}, got)
		assert.Equal(t, FinishComplete, last.Finish, "ended where the constraint is complete")
		assert.Equal(t, "stop", last.Finish.String())

		cut := &sequenceConstraint{want: []int32{9, 8, 9, 8}, eos: 1, vocab: vocab}
		st, err = l.Generate(context.Background(), Request{Prompt: []int32{5}, MaxTokens: 2, EOS: []int32{1}, Constraint: cut})
		require.NoError(t, err)
		got, last = collect(st)
		assert.Equal(t, []int32{9, 8}, got)
		assert.Equal(t, FinishLength, last.Finish, "max_tokens cuts a constrained output short")
		assert.Equal(t, 32, l.sched.Pool().Free())
	})
}

// An engine that samples outside the mask ends the sequence with an
// error, not with output its constraint refuses.
func TestLoopRefusesATokenOutsideTheConstraint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const vocab = 70
		m := &maskedModel{vocab: vocab, obey: false, sp: NewSampler(vocab)}
		l := newLoop(t, Options{Blocks: 32, BlockSize: 4, MaxNumSeqs: 4, MaxModelLen: 64, MaxBatchTokens: 16}, m)
		ctx, stop := context.WithCancel(context.Background())
		go l.Run(ctx)
		defer stop()
		c := &sequenceConstraint{want: []int32{40, 2}, eos: 1, vocab: vocab}
		st, err := l.Generate(context.Background(), Request{Prompt: []int32{5}, MaxTokens: 20, Constraint: c})
		require.NoError(t, err)
		got, last := collect(st)
		assert.Empty(t, got)
		require.Error(t, last.Err)
		assert.Contains(t, last.Err.Error(), "token 7, which the sequence's constraint does not allow")
		assert.Equal(t, 32, l.sched.Pool().Free(), "its blocks came back")
	})
}

// Under a mask, the draw and the log-probabilities see only the allowed
// tokens; greedy takes the most likely allowed one; a mask allowing none
// samples -1.
func TestSampleUnderAMask(t *testing.T) {
	const vocab = 100
	logits := make([]float32, vocab)
	for i := range logits {
		logits[i] = float32(i%10) / 3
	}
	mask := make([]uint32, (vocab+31)/32)
	allowed := []int32{3, 31, 32, 64, 95}
	for _, a := range allowed {
		mask[a/32] |= 1 << (a % 32)
	}
	sp := NewSampler(vocab)
	greedy := sp.Sample(logits, mask, Sampling{Logprobs: 0}, 0, nil)
	assert.Equal(t, int32(95), greedy.Token, "the most likely allowed token (logit 5/3)")
	seen := map[int32]bool{}
	for pos := range 400 {
		s := sp.Sample(logits, mask, Sampling{Temperature: 1, TopP: 0.95, TopK: 3, Seed: 9, Logprobs: 2}, pos, make([]TopLogprob, 0, 2))
		require.Contains(t, allowed, s.Token, "position %d", pos)
		seen[s.Token] = true
		for _, top := range s.Top {
			assert.Contains(t, allowed, top.Token)
		}
	}
	assert.Greater(t, len(seen), 1, "the draw is a draw")
	var mass float64
	for _, a := range allowed {
		mass += math.Exp(float64(logits[a]))
	}
	lp := sp.Sample(logits, mask, Sampling{Logprobs: 0}, 0, nil).Logprob
	assert.InDelta(t, math.Log(math.Exp(float64(logits[95]))/mass), float64(lp), 1e-5, "a log-probability under the mask")
	assert.Equal(t, int32(-1), sp.Sample(logits, make([]uint32, len(mask)), Sampling{}, 0, nil).Token)
	assert.Equal(t, sp.Sample(logits, nil, Sampling{}, 0, nil).Token, int32(9), "no mask: the whole vocabulary")
}
