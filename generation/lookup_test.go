package generation

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLookup(t *testing.T) {
	p := PromptLookup{Tokens: 4, MaxN: 3, MinN: 1}
	for _, c := range []struct {
		name   string
		tokens []int32
		k      int
		want   []int32
	}{
		{"no repeat", []int32{1, 2, 3, 4}, 4, nil},
		{"a trigram", []int32{1, 2, 3, 9, 8, 7, 6, 1, 2, 3}, 4, []int32{9, 8, 7, 6}},
		{"cut to k", []int32{1, 2, 3, 9, 8, 7, 6, 1, 2, 3}, 2, []int32{9, 8}},
		{"up to the end", []int32{5, 1, 2, 3, 9, 1, 2, 3}, 4, []int32{9, 1, 2, 3}},
		{"a loop goes on", []int32{5, 1, 2, 3, 1, 2, 3}, 7, []int32{1, 2, 3, 1, 2, 3, 1}},
		{"the latest match", []int32{1, 2, 7, 1, 2, 8, 1, 2}, 4, []int32{8, 1, 2, 8}},
		{"longer first", []int32{3, 2, 5, 9, 9, 2, 6, 3, 2}, 4, []int32{5, 9, 9, 2}}, // "3 2" beats the later "2"
		{"one token", []int32{4, 6, 1, 4}, 4, []int32{6, 1, 4, 6}},
		{"a run", []int32{7, 7, 7, 7}, 3, []int32{7, 7, 7}},
		{"too short", []int32{1}, 4, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := &Sequence{Prompt: c.tokens[:1], Output: c.tokens[1:]}
			got := p.lookup(q, c.k)
			if c.want == nil {
				assert.Empty(t, got)
			} else {
				assert.Equal(t, c.want, got)
			}
		})
	}
	q := &Sequence{Prompt: []int32{4, 6, 1, 4}}
	assert.Empty(t, PromptLookup{Tokens: 4, MaxN: 3, MinN: 2}.lookup(q, 4), "a unigram is below MinN 2")
}

func TestPromptLookupCheck(t *testing.T) {
	for _, p := range []PromptLookup{{Tokens: -1, MaxN: 2, MinN: 1}, {Tokens: MaxDraftTokens + 1, MaxN: 2, MinN: 1},
		{Tokens: 4, MaxN: 1, MinN: 2}, {Tokens: 4, MaxN: 2, MinN: 0}, {Tokens: 4, MaxN: 99, MinN: 1}} {
		assert.Error(t, p.Check(), "%+v", p)
	}
	assert.NoError(t, PromptLookup{}.Check())
	assert.NoError(t, PromptLookup{Tokens: 4, MaxN: 4, MinN: 2}.Check())
	_, err := New(Options{Blocks: 8, BlockSize: 4, MaxNumSeqs: 1, MaxModelLen: 16, MaxBatchTokens: 16, PromptLookup: PromptLookup{Tokens: 99}})
	assert.ErrorContains(t, err, "num_speculative_tokens 99")
}

// cyclic is a stand-in decoder whose next token depends on the last two
// only, so that its output falls into a loop prompt lookup drafts; 0
// (the tests' EOS) comes after the pair (5, 5).
func cyclic(tokens []int32) int32 {
	a, b := tokens[len(tokens)-2], tokens[len(tokens)-1]
	if a == 5 && b == 5 {
		return 0
	}
	return 1 + (a*7+b*3)%11
}

// runDrafted steps s as a model verifying drafts would, computing
// each place's token from the sequence and the draft before it.
func runDrafted(t *testing.T, s *Scheduler, limit int) []*Step {
	t.Helper()
	var steps []*Step
	for range limit {
		step := s.Schedule()
		if len(step.Work) == 0 {
			return steps
		}
		require.LessOrEqual(t, step.Tokens(), s.opts.MaxBatchTokens, "the step's token budget")
		sampled := make([]int32, len(step.Work))
		for i, w := range step.Work {
			require.LessOrEqual(t, w.End, len(w.Seq.table)*s.pool.BlockSize(), "the sequence's blocks hold what the step computes, its draft too")
			require.LessOrEqual(t, w.End, s.opts.MaxModelLen)
			if !w.Samples() {
				continue
			}
			toks := make([]int32, 0, w.End)
			for pos := range w.End {
				toks = append(toks, w.Token(pos))
			}
			sampled[i] = cyclic(toks[:w.Seq.Len()])
			var verified []int32
			for j := range w.Draft {
				verified = append(verified, cyclic(toks[:w.Seq.Len()+j+1]))
			}
			step.SetVerified(i, verified)
		}
		s.Advance(step, sampled)
		for _, w := range step.Work {
			if w.Samples() && w.Seq.Finish == NotFinished {
				require.Equal(t, w.Seq.Len()-1, w.Seq.computed, "the cache holds all but the last token")
				require.LessOrEqual(t, len(w.Seq.table), s.pool.geo.BlocksFor(w.Seq.Len()), "the blocks only the rejected draft used went back")
			}
		}
		steps = append(steps, step)
	}
	t.Fatalf("work left after %d steps", limit)
	return nil
}

// plainCyclic is q's output decoded one token a step.
func plainCyclic(q Sequence) ([]int32, FinishReason) {
	toks := append([]int32{}, q.Prompt...)
	var out []int32
	for len(out) < q.MaxTokens {
		tok := cyclic(toks)
		if tok == 0 && len(out) >= q.MinTokens {
			return out, FinishStop
		}
		out, toks = append(out, tok), append(toks, tok)
	}
	return out, FinishLength
}

// TestDraftsKeepOutput: with drafts, each sequence's output and finish
// are plain decoding's, in fewer steps, whatever ends it (max_tokens, an
// end-of-sequence token in the middle of a draft, min_tokens), and every
// block comes back.
func TestDraftsKeepOutput(t *testing.T) {
	prompts := [][]int32{{1, 2}, {3, 4, 3, 4, 3}, {5, 1}, {9, 9, 9, 9}, {2, 8, 2}}
	for _, caching := range []bool{false, true} {
		s := newScheduler(t, Options{Blocks: 40, BlockSize: 4, MaxNumSeqs: 4, MaxModelLen: 64, MaxBatchTokens: 12, PrefixCaching: caching,
			PromptLookup: PromptLookup{Tokens: 5, MaxN: 3, MinN: 1}})
		var qs []*Sequence
		for i, p := range prompts {
			q := &Sequence{Prompt: p, MaxTokens: 20 + i*7, EOS: []int32{0}, MinTokens: 3 * (i % 2)}
			require.NoError(t, s.Add(q))
			qs = append(qs, q)
		}
		steps := runDrafted(t, s, 500)
		drafted, kept, tokens := 0, 0, 0
		for _, step := range steps {
			drafted, kept = drafted+step.DraftTokens, kept+step.AcceptedTokens
		}
		for i, q := range qs {
			want, why := plainCyclic(Sequence{Prompt: prompts[i], MaxTokens: q.MaxTokens, MinTokens: q.MinTokens})
			assert.Equal(t, want, q.Output, "prompt %d", i)
			assert.Equal(t, why, q.Finish, "prompt %d", i)
			tokens += len(q.Output)
		}
		assert.Positive(t, kept)
		assert.LessOrEqual(t, kept, drafted)
		assert.Less(t, len(steps), tokens/2, "drafts kept save steps")
		assert.Equal(t, s.pool.Total(), s.pool.Free(), "every block back")
	}
}

// TestDraftsLeaveRoom: drafts take only what the decodes leave of the
// budget, and never preempt; a sequence that opts out or is penalized
// gets none.
func TestDraftsLeaveRoom(t *testing.T) {
	s := newScheduler(t, Options{Blocks: 15, BlockSize: 4, MaxNumSeqs: 4, MaxModelLen: 24, MaxBatchTokens: 6,
		PromptLookup: PromptLookup{Tokens: 8, MaxN: 2, MinN: 1}})
	rep := []int32{1, 2, 1, 2, 1, 2, 1}
	a := &Sequence{Prompt: rep, MaxTokens: 10}
	b := &Sequence{Prompt: rep, MaxTokens: 10, NoDraft: true}
	c := &Sequence{Prompt: rep, MaxTokens: 10, Sampling: Sampling{Penalties: Penalties{Presence: 1}}}
	for _, q := range []*Sequence{a, b, c} {
		require.NoError(t, s.Add(q))
	}
	step := s.Schedule() // the prompts: 7 tokens each, within the budget one at a time
	for step.Tokens() > 0 && len(step.Work) > 0 && step.Work[0].Samples() == false {
		s.Advance(step, make([]int32, len(step.Work)))
		step = s.Schedule()
	}
	aDrafted := 0
	for range 20 {
		if len(step.Work) == 0 {
			break
		}
		for _, w := range step.Work {
			if w.Seq == a {
				aDrafted += len(w.Draft)
			} else {
				assert.Empty(t, w.Draft, "no draft for an opted-out or penalized sequence")
			}
		}
		require.LessOrEqual(t, step.Tokens(), 6)
		assert.Empty(t, step.Preempted, "a draft preempts nothing")
		sampled := make([]int32, len(step.Work))
		for i, w := range step.Work {
			sampled[i] = 1 + int32(w.Seq.Len()%2) // 1, 2, 1, 2...: the drafts are right
			var v []int32
			for j := range w.Draft {
				v = append(v, 1+int32((w.Seq.Len()+j+1)%2))
			}
			step.SetVerified(i, v)
		}
		s.Advance(step, sampled)
		step = s.Schedule()
	}
	assert.Positive(t, aDrafted)
	assert.Equal(t, FinishLength, a.Finish)
	assert.Len(t, a.Output, 10)
}

// TestDraftsLeaveBlocksToPrompts: a waiting sequence whose prompt fits in
// the free blocks is admitted when it would be without drafts, though a
// running sequence drafts (and has its drafts rejected) at every step.
func TestDraftsLeaveBlocksToPrompts(t *testing.T) {
	admitted := func(tokens int) int {
		s := newScheduler(t, Options{Blocks: 6, BlockSize: 4, MaxNumSeqs: 2, MaxModelLen: 24, MaxBatchTokens: 16,
			PromptLookup: PromptLookup{Tokens: tokens, MaxN: 2, MinN: 1}})
		a := &Sequence{Prompt: []int32{1, 1, 2, 1, 3, 2, 2, 3, 3, 1}, MaxTokens: 14} // every bigram of {1,2,3}: a lookup always drafts
		require.NoError(t, s.Add(a))
		step := s.Schedule() // a's prompt
		s.Advance(step, []int32{1})
		b := &Sequence{Prompt: []int32{7, 8, 9, 10, 11, 12, 13}, MaxTokens: 1}
		require.NoError(t, s.Add(b))
		for n := 1; ; n++ {
			step := s.Schedule()
			require.NotEmpty(t, step.Work)
			sampled := make([]int32, len(step.Work))
			for i, w := range step.Work {
				if w.Seq == b {
					return n
				}
				sampled[i] = 1 + int32(w.Seq.Len()%3) // a small alphabet: its bigrams recur
				if len(w.Draft) > 0 {
					sampled[i] = w.Draft[0]%3 + 1 // never the draft's first token
				}
				v := make([]int32, len(w.Draft))
				for j := range v {
					v[j] = w.Draft[j]%3 + 1
				}
				step.SetVerified(i, v)
			}
			s.Advance(step, sampled)
		}
	}
	plain, drafted := admitted(0), admitted(8)
	t.Logf("b admitted at step %d plain, %d with drafts", plain, drafted)
	assert.Equal(t, plain, drafted, "drafts keep a sequence that fits in the free blocks out")
}
