package generation

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// ErrTooLong is wrapped by Add's refusal of a sequence that could never
// run: its prompt and max_tokens exceed the model's length, or the whole
// KV cache.
var ErrTooLong = errors.New("generation: the sequence does not fit")

// FinishReason says why a sequence ended.
type FinishReason int

const (
	NotFinished     FinishReason = iota
	FinishStop                   // an end-of-sequence token
	FinishLength                 // max_tokens, or the model's length
	FinishCancelled              // its client went away
	// FinishComplete is a constrained sequence whose output is complete
	// (its last token is output; "stop" to clients, as FinishStop).
	FinishComplete
)

func (r FinishReason) String() string {
	switch r {
	case FinishStop, FinishComplete:
		return "stop"
	case FinishLength:
		return "length"
	case FinishCancelled:
		return "cancelled"
	}
	return ""
}

// A Sequence is one request's generation: its prompt's tokens, then those
// it generates (Output). The caller fills the exported fields before
// [Scheduler.Add]; the scheduler owns the rest.
type Sequence struct {
	Prompt    []int32
	MaxTokens int     // the most tokens to generate
	Priority  int     // lower runs first; equal priorities in arrival order
	EOS       []int32 // tokens that end it (not counted in Output)
	// MinTokens is how many tokens it generates before an EOS token ends
	// it: EOS tokens before then are output like any other.
	MinTokens int
	Sampling  Sampling
	// Constraint, when set, limits the tokens it may sample (structured
	// output); nil samples from the whole vocabulary.
	Constraint Constraint
	// NoDraft keeps the sequence out of speculative decoding
	// (Options.PromptLookup): one token a step, as without it.
	NoDraft bool

	Output []int32      // the tokens generated so far
	Finish FinishReason // why it ended, once it has

	arrival uint64
	lane    int       // its place among the running, plus one; 0 while it waits
	whole   bool      // it computes its whole prompt, sharing no cached block
	leader  *Sequence // a sequence of the same prompt it starts after (Request.After)
	// Prompt scoring (Request.ScorePrompt): the log-probabilities kept
	// so far, of tokens 1.., and whether the stream has them.
	scoring    bool
	promptTop  int
	prompted   []PromptLogprob
	promptSent bool
	mask       []uint32 // Constraint's mask for the step being run
	draft      []int32  // the draft of the step being run (PromptLookup.lookup)
	err        error    // why the loop ends it with an error (a broken constraint)
	table      []int32  // its KV cache blocks, in token order
	hashes     []uint64 // the chain hashes of its whole computed blocks (prefix caching)
	computed   int      // its tokens whose keys and values are in the cache
	running    bool
	cancelled  bool
}

// Lane is the sequence's place among the running sequences, from 0 to
// max_num_seqs-1, its own while it runs (an engine keeps per-sequence
// state on its device by it: penalty.go); -1 while it waits. A sequence
// preempted and run again may have another, and computes from its first
// token again.
func (q *Sequence) Lane() int { return q.lane - 1 }

// Len is the sequence's length: prompt and output.
func (q *Sequence) Len() int { return len(q.Prompt) + len(q.Output) }

// Token is the sequence's i'th token, prompt then output.
func (q *Sequence) Token(i int) int32 {
	if i < len(q.Prompt) {
		return q.Prompt[i]
	}
	return q.Output[i-len(q.Prompt)]
}

// BlockTable is the KV cache blocks the sequence holds, in token order:
// token i's keys and values are in block BlockTable()[i/BlockSize], at
// i%BlockSize: cache slot [Geometry.Slot].
func (q *Sequence) BlockTable() []int32 { return q.table }

// Work is what one step computes for one sequence: its tokens
// [Start, End), whose keys and values it writes to the cache. When End is
// the sequence's length, the step also samples its next token.
//
// A decode with a Draft (speculative decoding: PromptLookup) computes the
// sequence's last token and then the draft's tokens, at the places after
// the sequence's end: End is the sequence's length plus the draft's, and
// the step samples at each of those places (Drafter).
type Work struct {
	Seq        *Sequence
	Start, End int
	Draft      []int32 // the scheduler's until Advance
	samples    bool    // End was the sequence's length when it was scheduled
	// Advance's: the tokens the model sampled at the draft's places, and
	// how many of the work's sampled tokens the sequence took (its
	// stream's events).
	verified []int32
	took     int
}

// Token is the token the work computes at place pos: the sequence's, or
// the draft's past its end.
func (w Work) Token(pos int) int32 {
	if n := w.Seq.Len(); pos >= n {
		return w.Draft[pos-n]
	}
	return w.Seq.Token(pos)
}

// Mask is the tokens the sequence may sample in the step being run (see
// [Constraint.Mask]); nil when any may be, or the step does not sample it.
func (q *Sequence) Mask() []uint32 { return q.mask }

// ScoresPrompt reports whether the sequence asks for its prompt tokens'
// log-probabilities, and how many most likely tokens at each place.
func (q *Sequence) ScoresPrompt() (bool, int) { return q.scoring, q.promptTop }

// Scores is the prompt tokens the work scores, positions [from, to): the
// logits at each of its positions predict the next token, which is
// scored while it is a prompt token (the first token has none); from ==
// to when the sequence does not ask (ScoresPrompt).
func (w Work) Scores() (from, to int) {
	q := w.Seq
	if !q.scoring {
		return 0, 0
	}
	from, to = w.Start+1, min(w.End, len(q.Prompt)-1)+1
	if from >= to {
		return from, from
	}
	return from, to
}

// Samples reports whether the step samples the sequence's next token.
// It is fixed when the step is scheduled: Advance, which lengthens the
// sequence, does not change it.
func (w Work) Samples() bool { return w.samples }

// work is q's work for [start, end).
func work(q *Sequence, start, end int) Work {
	return Work{Seq: q, Start: start, End: end, samples: end == q.Len()}
}

// A Step is the work of one step of the model: decodes (one token each)
// first, then prefill chunks.
type Step struct {
	Work []Work
	// Preempted are the running sequences this step's schedule sent back
	// to wait: their blocks are free, their output kept.
	Preempted []*Sequence
	// Finished are the sequences cancelled since the last step, their
	// blocks given back.
	Finished []*Sequence
	// PrefillTokens are the tokens of the sequences this step admitted
	// (prompt, and output for one preempted before); CachedTokens those
	// of them the prefix cache held, which no step computes.
	PrefillTokens, CachedTokens int
	// DraftTokens are the tokens its works drafted (PromptLookup), and
	// AcceptedTokens those of them Advance found the model had sampled
	// too: kept without a step of their own.
	DraftTokens, AcceptedTokens int
}

// Tokens is how many tokens the step computes.
func (s *Step) Tokens() int {
	n := 0
	for _, w := range s.Work {
		n += w.End - w.Start
	}
	return n
}

// Options bound the scheduler.
type Options struct {
	Blocks, BlockSize int // the KV cache
	MaxNumSeqs        int // sequences running at once
	MaxModelLen       int // a sequence's most tokens, prompt and output
	MaxBatchTokens    int // the most tokens a step computes
	// PrefixCaching keeps whole computed blocks by the tokens up to them,
	// shared by later sequences that start with the same tokens.
	PrefixCaching bool
	// PromptLookup drafts tokens for decoding sequences (speculative
	// decoding), for a model that verifies them (Drafter).
	PromptLookup PromptLookup
}

// Scheduler decides each step's work (package doc). It is not safe for
// concurrent use: one loop owns it.
type Scheduler struct {
	opts    Options
	pool    *BlockPool
	waiting []*Sequence // by priority, then arrival
	running []*Sequence // in the order they were admitted
	lanes   []bool      // the lanes in use (Sequence.Lane)
	next    uint64
}

// New is a scheduler over a KV cache of opts.Blocks blocks.
func New(opts Options) (*Scheduler, error) {
	pool, err := newBlockPool(opts.Geometry())
	if err != nil {
		return nil, err
	}
	if opts.MaxNumSeqs < 1 || opts.MaxModelLen < 1 || opts.MaxBatchTokens < opts.MaxNumSeqs {
		return nil, fmt.Errorf("generation: max_num_seqs %d, max_model_len %d, max_batch_tokens %d; want each at least 1, and max_batch_tokens at least max_num_seqs (every running sequence decodes in every step)",
			opts.MaxNumSeqs, opts.MaxModelLen, opts.MaxBatchTokens)
	}
	if err := opts.PromptLookup.Check(); err != nil {
		return nil, err
	}
	if opts.PrefixCaching {
		pool.enableCaching()
	}
	return &Scheduler{opts: opts, pool: pool, lanes: make([]bool, opts.MaxNumSeqs)}, nil
}

// takeLane gives q a free lane: one is free while fewer than max_num_seqs
// run.
func (s *Scheduler) takeLane(q *Sequence) {
	i := slices.Index(s.lanes, false)
	s.lanes[i], q.lane = true, i+1
}

// freeLane gives q's lane back.
func (s *Scheduler) freeLane(q *Sequence) {
	if q.lane > 0 {
		s.lanes[q.lane-1], q.lane = false, 0
	}
}

// Pool is the scheduler's KV cache blocks.
func (s *Scheduler) Pool() *BlockPool { return s.pool }

// Waiting and Running count the sequences in each state.
func (s *Scheduler) Waiting() int { return len(s.waiting) }
func (s *Scheduler) Running() int { return len(s.running) }

// Add queues q. It refuses, before anything is taken, a sequence that
// could never run.
func (s *Scheduler) Add(q *Sequence) error {
	switch {
	case len(q.Prompt) == 0:
		return fmt.Errorf("%w: the prompt is empty; want at least one token", ErrTooLong)
	case q.MaxTokens < 1:
		return fmt.Errorf("%w: max_tokens %d; want at least 1", ErrTooLong, q.MaxTokens)
	case len(q.Prompt) > s.opts.MaxModelLen || q.MaxTokens > s.opts.MaxModelLen-len(q.Prompt): // no sum to overflow
		return fmt.Errorf("%w: a prompt of %d tokens and max_tokens %d make %d; the model's length (max_model_len) is %d",
			ErrTooLong, len(q.Prompt), q.MaxTokens, len(q.Prompt)+q.MaxTokens, s.opts.MaxModelLen)
	case s.pool.geo.BlocksFor(len(q.Prompt)+q.MaxTokens) > s.pool.Total():
		return fmt.Errorf("%w: %d tokens need %d KV cache blocks; the cache has %d",
			ErrTooLong, len(q.Prompt)+q.MaxTokens, s.pool.geo.BlocksFor(len(q.Prompt)+q.MaxTokens), s.pool.Total())
	}
	q.arrival, s.next = s.next, s.next+1
	s.enqueue(q)
	return nil
}

// enqueue puts q among the waiting by priority, then arrival (a
// preempted sequence keeps its place: ahead of those that came after).
func (s *Scheduler) enqueue(q *Sequence) {
	i, _ := slices.BinarySearchFunc(s.waiting, q, func(a, b *Sequence) int {
		if c := cmp.Compare(a.Priority, b.Priority); c != 0 {
			return c
		}
		return cmp.Compare(a.arrival, b.arrival)
	})
	s.waiting = slices.Insert(s.waiting, i, q)
}

// Cancel ends q at the next Schedule, which gives its blocks back.
func (s *Scheduler) Cancel(q *Sequence) { q.cancelled = true }

// Schedule decides the next step's work (package doc). A step with no
// work means there is none to do.
func (s *Scheduler) Schedule() *Step {
	step := &Step{}
	s.dropCancelled(step)
	for {
		s.schedule(step)
		// Prompts being prefilled a chunk at a time can hold every block
		// between them, none able to take its next chunk: the newest
		// goes back to wait, so that the others can go on.
		if len(step.Work) > 0 || len(s.running) < 2 {
			return step
		}
		s.preempt(s.running[len(s.running)-1], step)
	}
}

func (s *Scheduler) schedule(step *Step) {
	budget := s.opts.MaxBatchTokens

	// Decodes first: the streams already running keep their pace.
	for i := 0; i < len(s.running) && budget > 0; i++ {
		q := s.running[i]
		if q.computed != q.Len()-1 {
			continue // mid-prefill
		}
		for {
			var ok bool
			if q.table, ok = s.pool.grow(q.table, q.Len()); ok {
				break
			}
			victim := s.running[len(s.running)-1]
			s.preempt(victim, step)
			if victim == q {
				break
			}
		}
		if !q.running {
			break // q itself went: every one after it did before
		}
		step.Work = append(step.Work, work(q, q.Len()-1, q.Len()))
		budget--
	}
	// Drafts, from what is left of the budget: every decode has its
	// token first. Their blocks come last, from what the prompts leave.
	if s.opts.PromptLookup.Tokens > 0 {
		decodes := len(step.Work)
		for i := range decodes {
			if budget == 0 {
				break
			}
			s.drafts(&step.Work[i], &budget)
		}
		defer s.draftBlocks(step, decodes)
	}
	// Then prompts: the running ones' next chunks, then new sequences, as
	// the budget and the free blocks allow.
	for _, q := range s.running {
		if budget == 0 {
			break
		}
		if q.computed >= q.Len()-1 && q.computed > 0 {
			continue // decoding
		}
		if !s.prefill(q, &budget, step) {
			return
		}
	}
	// A later choice of a prompt being computed waits for its blocks,
	// and lets the sequences behind it pass; the others go first come,
	// first served.
	for i := 0; i < len(s.waiting) && len(s.running) < s.opts.MaxNumSeqs && budget > 0; {
		q := s.waiting[i]
		if slices.Contains(step.Preempted, q) {
			break // not back in the step it was sent out of
		}
		if l := q.leader; l != nil && !q.whole && !l.whole && l.Finish == NotFinished && l.computed < len(l.Prompt) {
			i++ // its prompt's blocks are being computed: it shares them once they are
			continue
		}
		shared := 0
		if q.computed == 0 && len(q.table) == 0 && !q.whole {
			shared = s.pool.share(q)
			q.computed = shared
		}
		if !s.prefill(q, &budget, step) {
			if shared > 0 { // it waits on: what it shares is given back
				s.pool.release(q.table)
				q.table, q.hashes, q.computed = q.table[:0], q.hashes[:0], 0
			}
			break // first come, first served: nothing overtakes it
		}
		step.PrefillTokens += q.Len()
		step.CachedTokens += shared
		s.waiting = slices.Delete(s.waiting, i, i+1)
		q.running = true
		s.takeLane(q)
		s.running = append(s.running, q)
	}
}

// drafts gives decode w a draft by prompt lookup, within budget, where
// its sequence may have one; its blocks come after the prompts'
// (draftBlocks).
func (s *Scheduler) drafts(w *Work, budget *int) {
	q := w.Seq
	if q.NoDraft || q.Constraint != nil || q.Sampling.Penalties.Active() || q.scoring {
		return // each token's mask or penalties need the one before it
	}
	// The draft's tokens and the one after them are output: within
	// max_tokens and the model's length.
	k := min(s.opts.PromptLookup.Tokens, *budget, q.MaxTokens-len(q.Output)-1, s.opts.MaxModelLen-q.Len())
	if k <= 0 {
		return
	}
	draft := s.opts.PromptLookup.lookup(q, k)
	if len(draft) == 0 {
		return
	}
	w.Draft, w.End = draft, w.End+len(draft)
	*budget -= len(draft)
}

// draftBlocks gives the drafts of the step's first decodes works their
// blocks from what the prompts left, a draft cut to what fits: a draft
// never keeps a prompt waiting, nor preempts.
func (s *Scheduler) draftBlocks(step *Step, decodes int) {
	bs := s.pool.BlockSize()
	for i := range decodes {
		w := &step.Work[i]
		if len(w.Draft) == 0 {
			continue
		}
		q := w.Seq
		room := (len(q.table)+s.pool.Free())*bs - q.Len()
		if w.Draft = w.Draft[:max(0, min(len(w.Draft), room))]; len(w.Draft) == 0 {
			w.Draft = nil
		}
		w.End = q.Len() + len(w.Draft)
		q.table, _ = s.pool.grow(q.table, w.End)
		step.DraftTokens += len(w.Draft)
	}
}

// prefill schedules q's next prompt chunk within budget; false when the
// pool has no room for it.
func (s *Scheduler) prefill(q *Sequence, budget *int, step *Step) bool {
	end := min(q.Len(), q.computed+*budget)
	table, ok := s.pool.grow(q.table, end)
	if !ok {
		return false
	}
	q.table = table
	step.Work = append(step.Work, work(q, q.computed, end))
	*budget -= end - q.computed
	return true
}

// preempt sends running q back to wait, its blocks freed and its output
// kept: it is prefilled again, output included, when it runs next.
func (s *Scheduler) preempt(q *Sequence, step *Step) {
	s.pool.release(q.table)
	q.table, q.hashes, q.computed, q.running = q.table[:0], q.hashes[:0], 0, false
	s.freeLane(q)
	s.running = slices.DeleteFunc(s.running, func(r *Sequence) bool { return r == q })
	s.enqueue(q)
	step.Preempted = append(step.Preempted, q)
}

// dropCancelled ends the cancelled sequences, their blocks given back.
func (s *Scheduler) dropCancelled(step *Step) {
	drop := func(q *Sequence) bool {
		if !q.cancelled || q.Finish != NotFinished {
			return false
		}
		s.finish(q, FinishCancelled)
		step.Finished = append(step.Finished, q)
		return true
	}
	s.running = slices.DeleteFunc(s.running, drop)
	s.waiting = slices.DeleteFunc(s.waiting, drop)
}

func (s *Scheduler) finish(q *Sequence, why FinishReason) {
	s.freeLane(q)
	s.pool.release(q.table)
	q.table, q.hashes, q.running, q.Finish = nil, nil, false, why
}

// Advance records a step's results: sampled[i] is the token the step
// sampled for step.Work[i] where that work samples one (and is ignored
// where it does not). A work with a draft takes the tokens sampled at
// the draft's places too, from SetVerified, while the draft's tokens
// equal them. It returns the sequences that finished.
func (s *Scheduler) Advance(step *Step, sampled []int32) []*Sequence {
	var done []*Sequence
	for i := range step.Work {
		w := &step.Work[i]
		q := w.Seq
		if q.Finish != NotFinished {
			continue
		}
		if !w.Samples() {
			q.computed = w.End
			s.pool.register(q)
			continue
		}
		// The work's last token, then each draft token kept, is in the
		// cache (registered before a finish gives the blocks back); the
		// token sampled after each is the sequence's next.
		n := q.Len()
		w.took = 0
		for j := 0; ; j++ {
			q.computed = n + j
			s.pool.register(q)
			tok := sampled[i]
			if j > 0 {
				tok = w.verified[j-1]
			}
			w.took++
			live := s.accept(q, tok)
			matched := j < len(w.Draft) && w.Draft[j] == tok
			if matched {
				step.AcceptedTokens++ // counted as vLLM does, if it ends the sequence too
			}
			if !live || !matched || j == len(w.verified) {
				break
			}
		}
		switch {
		case q.Finish != NotFinished:
			done = append(done, q)
		case len(w.Draft) > 0: // the blocks only the rejected draft used go back
			if keep := s.pool.geo.BlocksFor(q.Len()); keep < len(q.table) {
				s.pool.release(q.table[keep:])
				q.table = q.table[:keep]
			}
		}
	}
	if len(done) > 0 {
		s.running = slices.DeleteFunc(s.running, func(q *Sequence) bool { return q.Finish != NotFinished })
	}
	return done
}

// SetVerified gives step.Work[i] the tokens the model sampled at its
// draft's places (Sampled.Next), for Advance.
func (s *Step) SetVerified(i int, tokens []int32) { s.Work[i].verified = tokens }

// Took is how many tokens Advance took from the work's sampled ones:
// the first, and one more for each draft token kept, up to where the
// sequence finished (an end-of-sequence token among them); 0 where the
// work samples none.
func (w Work) Took() int { return w.took }

// accept takes tok as q's next token; false when q is finished by it (or
// was refused it), and takes no more.
func (s *Scheduler) accept(q *Sequence, tok int32) bool {
	if c := q.Constraint; c != nil {
		q.mask = nil
		if err := c.Accept(tok); err != nil {
			q.err = fmt.Errorf("generation: the step sampled token %d, which the sequence's constraint does not allow: %w", tok, err)
			s.finish(q, FinishCancelled)
			return false
		}
	}
	switch {
	case slices.Contains(q.EOS, tok) && len(q.Output) >= q.MinTokens:
		s.finish(q, FinishStop)
	default:
		q.Output = append(q.Output, tok)
		switch {
		case q.Constraint != nil && q.Constraint.Done():
			// Complete, and nothing may follow: the end is the
			// constraint's, as an end-of-sequence token's.
			s.finish(q, FinishComplete)
		case len(q.Output) >= q.MaxTokens || q.Len() >= s.opts.MaxModelLen:
			s.finish(q, FinishLength)
		}
	}
	return q.Finish == NotFinished
}
