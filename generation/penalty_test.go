package generation

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Penalize applies the bias, then the repetition penalty to every token
// seen (dividing a positive logit, multiplying a negative one), then the
// frequency penalty per output occurrence and the presence penalty once:
// vLLM's order and arithmetic, in float32. Tokens not seen are unchanged,
// and its scratch is clear for the next call.
func TestPenalize(t *testing.T) {
	sp := NewSampler(6)
	logits := []float32{2, -2, 3, 1, -1, 0.5}
	p := &Penalties{Repetition: 2, Frequency: 0.5, Presence: 0.25, Bias: []LogitBias{{Token: 5, Bias: 1}, {Token: 9, Bias: 7}}}
	// Prompt 0, 1; output 1, 2, 2.
	sp.Penalize(logits, p, []int32{0, 1}, []int32{1, 2, 2})
	want := []float32{
		2.0 / 2,              // prompt: repetition only
		-2*2 - 0.5*1 - 0.25,  // prompt and output once
		3.0/2 - 0.5*2 - 0.25, // output twice
		1, -1, 0.5 + 1,       // unseen; token 5 biased (token 9 is outside)
	}
	assert.Equal(t, want, logits)
	// Nothing carried over: no penalties, no change.
	again := []float32{1, 1, 1, 1, 1, 1}
	sp.Penalize(again, &Penalties{Frequency: 1}, nil, nil)
	assert.Equal(t, []float32{1, 1, 1, 1, 1, 1}, again)
	assert.False(t, (&Penalties{Repetition: 1}).Active())
	assert.True(t, (&Penalties{Presence: -0.1}).Active())
}
