package generation

import "fmt"

// PromptLookup drafts tokens by prompt lookup (speculative decoding with
// no draft model, as vLLM's ngram method and llama.cpp's lookup decoding
// do): the sequence's last n tokens, for n from MaxN down to MinN, are
// looked for earlier in its prompt and output, and the tokens that
// followed the latest match are the draft. A decoding sequence's step
// then computes its last token and the draft together, sampling at each
// place; the draft's tokens are kept while each equals what was sampled
// before it, and the token sampled after the last one kept is kept too.
//
// Sampling draws a token from its position's logits with a generator
// keyed by the sequence's seed and the position (Sampler), so a kept
// token is the token plain decoding would have drawn there: the output
// is the same, greedy or not, and only the number of steps changes.
type PromptLookup struct {
	// Tokens is the most tokens drafted for a sequence a step; 0 drafts
	// none.
	Tokens int
	// MaxN and MinN bound the n-grams looked for: longer matches are
	// tried first.
	MaxN, MinN int
}

// Check reports what is wrong with the options, if anything.
func (p PromptLookup) Check() error {
	switch {
	case p.Tokens == 0:
		return nil
	case p.Tokens < 0 || p.Tokens > MaxDraftTokens:
		return fmt.Errorf("generation: num_speculative_tokens %d; want 0 (none) to %d", p.Tokens, MaxDraftTokens)
	case p.MinN < 1 || p.MaxN < p.MinN || p.MaxN > maxLookupN:
		return fmt.Errorf("generation: prompt_lookup_min %d and prompt_lookup_max %d; want 1 <= min <= max <= %d", p.MinN, p.MaxN, maxLookupN)
	}
	return nil
}

// MaxDraftTokens bounds PromptLookup.Tokens: a longer draft is rarely
// all kept, and each token of it is computed.
const MaxDraftTokens = 16

// maxLookupN bounds the n-grams looked up.
const maxLookupN = 16

// Drafter is a Model whose steps verify drafts: a Work with a Draft
// computes its sequence's last token and the draft's tokens (Work.Token)
// and samples at each of those places, the first as any work samples
// (Sampled.Token) and the rest into Sampled.Next. A loop drafts only for
// a model that reports it does.
type Drafter interface {
	VerifiesDrafts() bool
}

// lookup fills q's draft buffer with at most k tokens by prompt lookup
// and returns it; empty when no n-gram of the sizes asked for recurs.
// The longest match wins, and of those the latest: a sequence repeating
// itself repeats what it said last. One pass from the end: a place whose
// token is the last one is extended backwards.
func (p PromptLookup) lookup(q *Sequence, k int) []int32 {
	L := q.Len()
	q.draft = q.draft[:0]
	if L < 2 {
		return q.draft
	}
	last := q.Token(L - 1)
	best, bestN := -1, 0
	// A match ends at i, before the sequence's last token, so that at
	// least one token follows it: i+1 < L.
	for i := L - 2; i >= 0; i-- {
		if q.Token(i) != last {
			continue
		}
		n := 1
		for n < p.MaxN && n <= i && q.Token(i-n) == q.Token(L-1-n) {
			n++
		}
		if n > bestN {
			best, bestN = i, n
			if n == p.MaxN {
				break
			}
		}
	}
	if bestN < p.MinN {
		return q.draft
	}
	// What followed the match follows the sequence; past the sequence's
	// end, the draft goes on as the sequence did after the match (a loop
	// of period L-1-best continues).
	for j := best + 1; len(q.draft) < k; j++ {
		if j < L {
			q.draft = append(q.draft, q.Token(j))
		} else {
			q.draft = append(q.draft, q.draft[j-L])
		}
	}
	return q.draft
}
