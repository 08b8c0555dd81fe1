package generation

import (
	"cmp"
	"math"
	"slices"
)

// minTemperature is the least temperature that samples; below it is
// greedy (as vLLM rounds its tiny temperatures: 1/t would overflow).
const minTemperature = 1e-5

// Sampler draws tokens from logits as a step does on its device (the CPU
// engine's step calls it; the worker's programs do the same in torch):
// temperature, then top-k, then top-p, then one draw from a counter-based
// generator keyed by the sequence's seed and the token's position. It
// holds scratch for one vocabulary, so that sampling allocates nothing;
// it is not safe for concurrent use.
type Sampler struct {
	idx    []int32
	probs  []float32
	masked []float32 // the logits under a mask
	// Penalize's scratch: the output's counts and the tokens seen, by
	// token, and which it set.
	counts  []int32
	seen    []bool
	touched []int32
}

// NewSampler is a sampler for a vocabulary of vocab tokens.
func NewSampler(vocab int) Sampler {
	return Sampler{idx: make([]int32, vocab), probs: make([]float32, vocab)}
}

// Sample draws the token at position pos from logits (the model's, one
// per token id; they are not changed) as s says; top, of capacity
// s.Logprobs at least, receives the most likely tokens when asked. With
// a mask (a constrained sequence's: [Constraint.Mask]), the tokens it
// does not allow are out of the draw and of the log-probabilities, as if
// their logits were -inf; a mask that allows none samples token -1,
// which its constraint refuses.
func (sp *Sampler) Sample(logits []float32, mask []uint32, s Sampling, pos int, top []TopLogprob) Sampled {
	var out Sampled
	if mask != nil {
		if sp.masked == nil {
			sp.masked = make([]float32, len(sp.probs))
		}
		masked, some := sp.masked[:len(logits)], false
		for i, v := range logits {
			if Allowed(mask, int32(i)) {
				masked[i], some = v, true
			} else {
				masked[i] = float32(math.Inf(-1))
			}
		}
		if !some {
			return Sampled{Token: -1}
		}
		logits = masked
	}
	if s.Temperature < minTemperature {
		out.Token = argmax(logits)
	} else {
		out.Token = sp.draw(logits, s, pos)
	}
	if s.Logprobs >= 0 {
		lse := logSumExp(logits)
		out.Logprob = logits[out.Token] - lse
		if s.Logprobs > 0 {
			out.Top = topN(logits, s.Logprobs, lse, top[:0])
		}
	}
	return out
}

// Score is token's log-probability under logits (a vocabulary's, raw:
// no temperature, penalty or mask), with the top most likely tokens'
// appended to dst: a prompt token's score (Request.ScorePrompt).
func Score(logits []float32, token int32, top int, dst []TopLogprob) PromptLogprob {
	lse := logSumExp(logits)
	out := PromptLogprob{Token: token, Logprob: logits[token] - lse}
	if top > 0 {
		out.Top = topN(logits, top, lse, dst[:0])
	}
	return out
}

// argmax is the first index of the largest value (torch.argmax's).
func argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

func logSumExp(x []float32) float32 {
	m := x[argmax(x)]
	var sum float64
	for _, v := range x {
		sum += math.Exp(float64(v - m))
	}
	return m + float32(math.Log(sum))
}

// topN appends the n largest logits' tokens to dst, largest first (the
// lower id first among equals), as log-probabilities.
func topN(x []float32, n int, lse float32, dst []TopLogprob) []TopLogprob {
	n = min(n, len(x))
	for i, v := range x {
		if len(dst) == n && v <= dst[n-1].Logprob {
			continue
		}
		if len(dst) < n {
			dst = append(dst, TopLogprob{})
		}
		j := len(dst) - 1
		for j > 0 && dst[j-1].Logprob < v {
			dst[j] = dst[j-1]
			j--
		}
		dst[j] = TopLogprob{Token: int32(i), Logprob: v}
	}
	for i := range dst {
		dst[i].Logprob -= lse
	}
	return dst
}

// draw samples from softmax(logits / temperature), cut to the top k and
// then to the top p of the mass. The probabilities are float32, as the
// step graphs compute them; sums are kept in float64 here, which only
// moves a draw that lands within a rounding of a boundary.
func (sp *Sampler) draw(logits []float32, s Sampling, pos int) int32 {
	inv := 1 / s.Temperature
	m := logits[argmax(logits)]
	var total float64
	for i, v := range logits {
		e := float32(math.Exp(float64((v - m) * inv)))
		sp.probs[i] = e
		total += float64(e)
	}
	n := len(logits)
	cut := (s.TopK > 0 && s.TopK < n) || (s.TopP > 0 && s.TopP < 1)
	if !cut {
		u := float64(Uniform(s.Seed, pos)) * total
		for i, p := range sp.probs[:n] {
			if u -= float64(p); u < 0 {
				return int32(i)
			}
		}
		return int32(n - 1)
	}
	idx := sp.idx[:n]
	for i := range idx {
		idx[i] = int32(i)
	}
	probs := sp.probs
	slices.SortFunc(idx, func(a, b int32) int {
		if c := cmp.Compare(probs[b], probs[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	keep := n
	if s.TopK > 0 && s.TopK < n {
		keep = s.TopK
	}
	var mass float64
	for _, i := range idx[:keep] {
		mass += float64(probs[i])
	}
	if s.TopP > 0 && s.TopP < 1 {
		want, cum := float64(s.TopP)*mass, 0.0
		for k, i := range idx[:keep] {
			cum += float64(probs[i])
			if cum >= want {
				keep = k + 1
				break
			}
		}
		mass = cum
	}
	u := float64(Uniform(s.Seed, pos)) * mass
	for _, i := range idx[:keep] {
		if u -= float64(probs[i]); u < 0 {
			return i
		}
	}
	return idx[keep-1]
}

// Uniform is the draw of the token at position pos of a sequence seeded
// seed: a number in [0, 1) that depends on the two alone (no state
// carried from step to step, nothing shared between sequences), in 32-bit
// integer arithmetic and a float32 result, so that a device's step graph
// computes the same bits with no 64-bit integer or float64 tensor (the
// worker's decoder.py uniform; the engines' agreement on 1,000 pairs is
// engine/rbln/worker/testdata/uniform32.json). Each 32-bit half of the
// seed and the position go through Wellons' lowbias32 mixer in turn; the
// top 24 bits of the result are the float32's mantissa.
func Uniform(seed uint64, pos int) float32 {
	h := mix32(uint32(pos) + 0x9e3779b9)
	h = mix32(h ^ uint32(seed>>32))
	h = mix32(h ^ uint32(seed))
	return float32(h>>8) / (1 << 24)
}

// mix32 is lowbias32 (Chris Wellons' hash-prospector): a bijection of
// uint32 with a bias of 0.17 over its avalanche.
func mix32(x uint32) uint32 {
	x ^= x >> 16
	x *= 0x7feb352d
	x ^= x >> 15
	x *= 0x846ca68b
	x ^= x >> 16
	return x
}
