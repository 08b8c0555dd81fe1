package generation

// Penalties: what a sequence has seen changes its next token's logits,
// in the step, before the mask and the draw, as vLLM applies them: the
// logit bias added first, then the repetition penalty on every token of
// the prompt and the output, then the frequency and presence penalties
// on the output's. The CPU engine counts the sequence's tokens in Go
// (Sampler.Penalize); the worker keeps each running sequence's counts on
// its device, by its lane, counting the tokens each step computes, so
// that a step uploads no vocabulary-sized table.

// MaxLogitBias bounds a request's logit bias entries: they travel in the
// step's row.
const MaxLogitBias = 64

// Penalties are a sequence's logit bias and penalties; the zero value
// changes nothing.
type Penalties struct {
	// Repetition divides the logit of every token in the prompt or the
	// output so far when it is positive, and multiplies it when it is
	// not (vLLM's and TGI's repetition_penalty; CTRL's); 0 or 1 for none.
	Repetition float32
	// Frequency is subtracted from a token's logit once for each time it
	// is in the output so far, Presence once if it is (OpenAI's
	// frequency_penalty and presence_penalty); 0 for none.
	Frequency, Presence float32
	// Bias is added to the logits of its tokens (OpenAI's logit_bias),
	// at most MaxLogitBias entries.
	Bias []LogitBias
}

// LogitBias is one token's bias.
type LogitBias struct {
	Token int32
	Bias  float32
}

// Active reports whether p changes anything.
func (p *Penalties) Active() bool {
	return p.Repetition != 0 && p.Repetition != 1 || p.Frequency != 0 || p.Presence != 0 || len(p.Bias) > 0
}

// RepetitionOrOne is the repetition penalty, 1 for none.
func (p *Penalties) RepetitionOrOne() float32 {
	if p.Repetition == 0 {
		return 1
	}
	return p.Repetition
}

// A WholePrompter is a model that counts a penalized sequence's tokens as
// its steps compute them (on its device), so that such a sequence must
// compute its whole prompt: it shares no block the prefix cache holds.
type WholePrompter interface {
	CountsTokens() bool
}

// Penalize applies p to logits (a vocabulary's, changed in place) for a
// sequence whose tokens so far are prompt then output, in float32 as the
// worker's step graph computes them.
func (sp *Sampler) Penalize(logits []float32, p *Penalties, prompt, output []int32) {
	for _, b := range p.Bias {
		if int(b.Token) < len(logits) && b.Token >= 0 {
			logits[b.Token] += b.Bias
		}
	}
	if sp.counts == nil {
		sp.counts = make([]int32, len(sp.probs))
		sp.seen = make([]bool, len(sp.probs))
	}
	// The tokens seen, and the output's counts, in scratch that is
	// cleared by the tokens that set it.
	touched := sp.touched[:0]
	for _, t := range prompt {
		if !sp.seen[t] {
			sp.seen[t] = true
			touched = append(touched, t)
		}
	}
	for _, t := range output {
		if !sp.seen[t] {
			sp.seen[t] = true
			touched = append(touched, t)
		}
		sp.counts[t]++
	}
	rep := p.RepetitionOrOne()
	for _, t := range touched {
		l := logits[t]
		if rep != 1 {
			if l > 0 {
				l /= rep
			} else {
				l *= rep
			}
		}
		if c := sp.counts[t]; c > 0 {
			l -= float32(p.Frequency * float32(c)) // rounded before it is subtracted, as the graph's
			l -= p.Presence
		}
		logits[t] = l
		sp.seen[t], sp.counts[t] = false, 0
	}
	sp.touched = touched[:0]
}
