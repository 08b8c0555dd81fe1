package generation

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// model is a stand-in for a decoder: the token after a sequence is a
// function of every token before it, so that a sequence's output shows
// whether each step saw the whole of it (a recomputed sequence must go on
// as it would have).
func model(q *Sequence) int32 {
	h := int32(7)
	for i := range q.Len() {
		h = (h*31 + q.Token(i)) % 1000
	}
	return 1 + h%97 // never 0, the test's EOS
}

// run steps s until no work is left (at most limit steps), checking on
// every step that the KV cache holds each scheduled sequence's tokens, and
// returns the steps' token counts.
func run(t *testing.T, s *Scheduler, limit int) []*Step {
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
			require.LessOrEqual(t, w.End, len(w.Seq.table)*s.pool.BlockSize(), "the sequence's blocks hold what the step computes")
			require.Equal(t, w.Seq.computed, w.Start, "work goes on from what the cache holds")
			if w.Samples() {
				sampled[i] = model(w.Seq)
			}
		}
		s.Advance(step, sampled)
		steps = append(steps, step)
	}
	t.Fatalf("work left after %d steps", limit)
	return nil
}

func newScheduler(t *testing.T, o Options) *Scheduler {
	t.Helper()
	s, err := New(o)
	require.NoError(t, err)
	return s
}

// alone is q's output generated with nothing beside it and room to spare.
func alone(t *testing.T, q Sequence) []int32 {
	s := newScheduler(t, Options{Blocks: 64, BlockSize: 4, MaxNumSeqs: 1, MaxModelLen: 256, MaxBatchTokens: 256})
	require.NoError(t, s.Add(&q))
	run(t, s, 1000)
	return q.Output
}

func TestOneSequence(t *testing.T) {
	s := newScheduler(t, Options{Blocks: 8, BlockSize: 4, MaxNumSeqs: 4, MaxModelLen: 64, MaxBatchTokens: 16})
	q := &Sequence{Prompt: []int32{5, 6, 7, 8, 9}, MaxTokens: 6}
	require.NoError(t, s.Add(q))
	steps := run(t, s, 100)
	require.Len(t, steps, 6, "one prefill, then one decode per token after the first")
	assert.Equal(t, []Work{{Seq: q, Start: 0, End: 5, samples: true, took: 1}}, steps[0].Work)
	assert.Equal(t, []Work{{Seq: q, Start: 5, End: 6, samples: true, took: 1}}, steps[1].Work)
	assert.Len(t, q.Output, 6)
	assert.Equal(t, FinishLength, q.Finish)
	assert.Equal(t, 8, s.Pool().Free(), "its blocks are back")
	assert.Zero(t, s.Running())
}

// A long prompt is prefilled a chunk a step, beside the decodes of the
// sequences already running, which go first.
func TestChunkedPrefillBesideDecodes(t *testing.T) {
	s := newScheduler(t, Options{Blocks: 32, BlockSize: 4, MaxNumSeqs: 4, MaxModelLen: 64, MaxBatchTokens: 4})
	a := &Sequence{Prompt: []int32{1, 2}, MaxTokens: 10}
	require.NoError(t, s.Add(a))
	step := s.Schedule()
	s.Advance(step, []int32{model(a)})
	b := &Sequence{Prompt: []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, MaxTokens: 3}
	require.NoError(t, s.Add(b))
	step = s.Schedule()
	assert.Equal(t, []Work{{Seq: a, Start: 2, End: 3, samples: true}, {Seq: b, Start: 0, End: 3}}, step.Work, "a's decode, then as much of b's prompt as the budget leaves")
	assert.False(t, step.Work[1].Samples())
	s.Advance(step, []int32{model(a), 0})
	run(t, s, 100)
	assert.Equal(t, alone(t, Sequence{Prompt: a.Prompt, MaxTokens: 10}), a.Output)
	assert.Equal(t, alone(t, Sequence{Prompt: b.Prompt, MaxTokens: 3}), b.Output)
}

// When blocks run out, the newest running sequence is preempted and later
// recomputed: every sequence's output is what it is alone.
func TestPreemptionKeepsTheOutput(t *testing.T) {
	s := newScheduler(t, Options{Blocks: 6, BlockSize: 2, MaxNumSeqs: 4, MaxModelLen: 12, MaxBatchTokens: 16})
	var qs []*Sequence
	for i := range 3 {
		q := &Sequence{Prompt: []int32{int32(i + 1), 2, 3}, MaxTokens: 5}
		require.NoError(t, s.Add(q))
		qs = append(qs, q)
	}
	steps := run(t, s, 200)
	preempted := 0
	for _, st := range steps {
		preempted += len(st.Preempted)
	}
	assert.Positive(t, preempted, "6 blocks cannot hold three sequences of 8 tokens")
	for _, q := range qs {
		assert.Equal(t, alone(t, Sequence{Prompt: q.Prompt, MaxTokens: 5}), q.Output)
		assert.Equal(t, FinishLength, q.Finish)
	}
	assert.Equal(t, 6, s.Pool().Free())
}

// Prompts prefilled a chunk at a time that hold every block between them
// do not wedge the scheduler: the newest waits.
func TestPrefillsThatHoldEveryBlockGoOn(t *testing.T) {
	s := newScheduler(t, Options{Blocks: 4, BlockSize: 2, MaxNumSeqs: 2, MaxModelLen: 8, MaxBatchTokens: 4})
	a := &Sequence{Prompt: []int32{1, 2, 3, 4, 5, 6, 7}, MaxTokens: 1}
	b := &Sequence{Prompt: []int32{9, 8, 7, 6, 5, 4, 3}, MaxTokens: 1}
	require.NoError(t, s.Add(a))
	require.NoError(t, s.Add(b))
	run(t, s, 100)
	assert.Equal(t, alone(t, Sequence{Prompt: a.Prompt, MaxTokens: 1}), a.Output)
	assert.Equal(t, alone(t, Sequence{Prompt: b.Prompt, MaxTokens: 1}), b.Output)
}

func TestMaxNumSeqsAndPriority(t *testing.T) {
	s := newScheduler(t, Options{Blocks: 64, BlockSize: 4, MaxNumSeqs: 2, MaxModelLen: 64, MaxBatchTokens: 64})
	low := &Sequence{Prompt: []int32{1}, MaxTokens: 4, Priority: 2}
	first := &Sequence{Prompt: []int32{2}, MaxTokens: 4, Priority: 1}
	second := &Sequence{Prompt: []int32{3}, MaxTokens: 4, Priority: 1}
	for _, q := range []*Sequence{low, first, second} {
		require.NoError(t, s.Add(q))
	}
	step := s.Schedule()
	require.Len(t, step.Work, 2, "max_num_seqs")
	assert.Same(t, first, step.Work[0].Seq, "priority, then arrival")
	assert.Same(t, second, step.Work[1].Seq)
	assert.Equal(t, 1, s.Waiting())
}

// A sequence ends at an end-of-sequence token (not in its output) or at
// the model's length; a cancelled one gives its blocks back at the next
// step.
func TestFinishAndCancel(t *testing.T) {
	s := newScheduler(t, Options{Blocks: 16, BlockSize: 4, MaxNumSeqs: 4, MaxModelLen: 8, MaxBatchTokens: 16})
	eos := &Sequence{Prompt: []int32{1, 2}, MaxTokens: 5, EOS: []int32{42}}
	long := &Sequence{Prompt: []int32{1, 2, 3}, MaxTokens: 5}
	gone := &Sequence{Prompt: []int32{4, 5, 6, 7}, MaxTokens: 4}
	for _, q := range []*Sequence{eos, long, gone} {
		require.NoError(t, s.Add(q))
	}
	step := s.Schedule()
	done := s.Advance(step, []int32{42, 9, 9})
	assert.Equal(t, []*Sequence{eos}, done)
	assert.Equal(t, FinishStop, eos.Finish)
	assert.Empty(t, eos.Output)
	s.Cancel(gone)
	step = s.Schedule()
	assert.Equal(t, []*Sequence{gone}, step.Finished)
	assert.Equal(t, FinishCancelled, gone.Finish)
	assert.Equal(t, []Work{{Seq: long, Start: 3, End: 4, samples: true}}, step.Work)
	assert.Equal(t, 16-1, s.Pool().Free(), "only long's block is held (4 tokens)")
	run(t, s, 100)
	assert.Equal(t, FinishLength, long.Finish)
	assert.Len(t, long.Output, 5, "prompt 3 + 5 = the model's length of 8")
}

func TestAddRefusals(t *testing.T) {
	s := newScheduler(t, Options{Blocks: 4, BlockSize: 4, MaxNumSeqs: 4, MaxModelLen: 32, MaxBatchTokens: 16})
	for _, tc := range []struct {
		q    Sequence
		want string
	}{
		{Sequence{MaxTokens: 1}, "the prompt is empty"},
		{Sequence{Prompt: []int32{1}}, "max_tokens 0; want at least 1"},
		{Sequence{Prompt: make([]int32, 30), MaxTokens: 3}, "a prompt of 30 tokens and max_tokens 3 make 33; the model's length (max_model_len) is 32"},
		{Sequence{Prompt: make([]int32, 10), MaxTokens: 10}, "20 tokens need 5 KV cache blocks; the cache has 4"},
	} {
		err := s.Add(&tc.q)
		assert.ErrorIs(t, err, ErrTooLong)
		assert.ErrorContains(t, err, tc.want)
	}
	assert.Zero(t, s.Waiting())
	_, err := New(Options{Blocks: 0, BlockSize: 4, MaxNumSeqs: 1, MaxModelLen: 1, MaxBatchTokens: 1})
	assert.ErrorContains(t, err, "want at least one block")
}

// Many sequences of every length through a small cache: each gets the
// output it gets alone, and the cache ends empty.
func TestManySequencesAsAlone(t *testing.T) {
	s := newScheduler(t, Options{Blocks: 12, BlockSize: 4, MaxNumSeqs: 5, MaxModelLen: 40, MaxBatchTokens: 8})
	var qs []*Sequence
	for i := range 24 {
		prompt := make([]int32, 1+i%13)
		for k := range prompt {
			prompt[k] = int32(i*7 + k)
		}
		q := &Sequence{Prompt: prompt, MaxTokens: 1 + (i*5)%9, Priority: i % 3}
		require.NoError(t, s.Add(q))
		qs = append(qs, q)
	}
	steps := run(t, s, 2000)
	preempted := 0
	for _, st := range steps {
		preempted += len(st.Preempted)
	}
	t.Logf("24 sequences in %d steps, %d preemptions", len(steps), preempted)
	for i, q := range qs {
		assert.Equal(t, alone(t, Sequence{Prompt: q.Prompt, MaxTokens: q.MaxTokens}), q.Output, "sequence %d", i)
	}
	assert.Equal(t, 12, s.Pool().Free())
	assert.Zero(t, s.Running()+s.Waiting())
}

// An end-of-sequence token before MinTokens is output like any other;
// from MinTokens on, it ends the sequence.
func TestMinTokens(t *testing.T) {
	s, err := New(Options{Blocks: 8, BlockSize: 4, MaxNumSeqs: 1, MaxModelLen: 32, MaxBatchTokens: 8})
	require.NoError(t, err)
	q := &Sequence{Prompt: []int32{1, 2}, MaxTokens: 10, EOS: []int32{9}, MinTokens: 3}
	require.NoError(t, s.Add(q))
	for range 10 {
		step := s.Schedule()
		if len(step.Work) == 0 {
			break
		}
		s.Advance(step, []int32{9}) // the model says EOS every time
	}
	assert.Equal(t, []int32{9, 9, 9}, q.Output)
	assert.Equal(t, FinishStop, q.Finish)
}

// refsZero reports whether no block is held: every one free or cached.
func refsZero(s *Scheduler) bool {
	for _, r := range s.pool.ref {
		if r != 0 {
			return false
		}
	}
	return s.pool.Free() == s.pool.Total()
}

// A sequence that starts with a finished one's tokens shares its whole
// computed blocks: its first work starts after them, its output is what
// it is alone, and once both end no block is held.
func TestPrefixCaching(t *testing.T) {
	s := newScheduler(t, Options{Blocks: 32, BlockSize: 4, MaxNumSeqs: 2, MaxModelLen: 64, MaxBatchTokens: 16, PrefixCaching: true})
	system := []int32{11, 12, 13, 14, 15, 16, 17, 18, 19, 20} // two whole blocks and two tokens
	a := &Sequence{Prompt: append(slices.Clone(system), 1), MaxTokens: 5}
	require.NoError(t, s.Add(a))
	run(t, s, 100)
	assert.True(t, refsZero(s), "a's blocks are back (cached)")
	assert.Positive(t, s.pool.Cached())

	b := &Sequence{Prompt: append(slices.Clone(system), 2, 3), MaxTokens: 5}
	require.NoError(t, s.Add(b))
	step := s.Schedule()
	require.Len(t, step.Work, 1)
	assert.Equal(t, 8, step.Work[0].Start, "the two whole blocks of the shared prefix are not computed again")
	assert.Equal(t, 8, step.CachedTokens)
	assert.Equal(t, 12, step.PrefillTokens)
	sampled := []int32{model(b)}
	s.Advance(step, sampled)
	run(t, s, 100)
	assert.Equal(t, alone(t, Sequence{Prompt: b.Prompt, MaxTokens: 5}), b.Output)
	assert.True(t, refsZero(s))

	// The same prompt again: every whole block but the one holding its
	// last token is shared (the step must compute a token to sample).
	c := &Sequence{Prompt: slices.Clone(a.Prompt), MaxTokens: 5}
	require.NoError(t, s.Add(c))
	step = s.Schedule()
	assert.Equal(t, 8, step.Work[0].Start)
	s.Advance(step, []int32{model(c)})
	run(t, s, 100)
	assert.Equal(t, a.Output, c.Output)
	assert.True(t, refsZero(s))
}

// Under pressure, cached blocks no sequence holds are taken back, the
// least recently released first, and outputs do not change.
func TestPrefixCachingEviction(t *testing.T) {
	s := newScheduler(t, Options{Blocks: 12, BlockSize: 4, MaxNumSeqs: 3, MaxModelLen: 48, MaxBatchTokens: 16, PrefixCaching: true})
	var qs []*Sequence
	for i := range 12 {
		p := make([]int32, 9+i%5)
		for j := range p {
			p[j] = int32(100*(i%4) + j) // four prefixes, shared three times each
		}
		q := &Sequence{Prompt: p, MaxTokens: 6}
		qs = append(qs, q)
		require.NoError(t, s.Add(q))
	}
	run(t, s, 1000)
	for _, q := range qs {
		assert.Equal(t, alone(t, Sequence{Prompt: q.Prompt, MaxTokens: 6}), q.Output)
	}
	assert.True(t, refsZero(s))
	assert.LessOrEqual(t, s.pool.Cached(), s.pool.Total())
}

// A later choice of a prompt waits until the first has computed it, then
// shares its whole blocks; a sequence behind it is not held up meanwhile.
func TestFollowerWaitsForItsLeaderAndLetsOthersPass(t *testing.T) {
	s, err := New(Options{Blocks: 64, BlockSize: 4, MaxNumSeqs: 4, MaxModelLen: 64, MaxBatchTokens: 8, PrefixCaching: true})
	require.NoError(t, err)
	prompt := make([]int32, 12)
	for i := range prompt {
		prompt[i] = int32(i + 1)
	}
	leader := &Sequence{Prompt: prompt, MaxTokens: 4}
	follower := &Sequence{Prompt: prompt, MaxTokens: 4, leader: leader}
	other := &Sequence{Prompt: []int32{50, 51}, MaxTokens: 4}
	for _, q := range []*Sequence{leader, follower, other} {
		require.NoError(t, s.Add(q))
	}
	seqs := func(step *Step) map[*Sequence]Work {
		m := map[*Sequence]Work{}
		for _, w := range step.Work {
			m[w.Seq] = w
		}
		return m
	}
	step := s.Schedule() // the leader's first chunk: 8 of its 12 tokens
	require.Len(t, step.Work, 1)
	assert.Equal(t, Work{Seq: leader, Start: 0, End: 8}, Work{Seq: step.Work[0].Seq, Start: step.Work[0].Start, End: step.Work[0].End})
	s.Advance(step, make([]int32, len(step.Work)))
	step = s.Schedule() // its last 4; the follower waits, the other passes it
	got := seqs(step)
	assert.Contains(t, got, other)
	assert.NotContains(t, got, follower)
	s.Advance(step, make([]int32, len(step.Work)))
	step = s.Schedule() // the leader's prompt is computed: the follower starts on its blocks
	w, ok := seqs(step)[follower]
	require.True(t, ok, "the follower starts once its leader's prompt is computed")
	assert.GreaterOrEqual(t, w.Start, 8, "it shares the leader's whole blocks")
}
