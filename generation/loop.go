package generation

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Model runs a step of a decoder: for every Work it computes the tokens
// [Start, End) of its sequence into the KV cache and, where the work
// samples, the sequence's next token as its Sampling says, returned at
// the work's index (what is returned at other indexes is ignored). The
// slice and the Top lists in it are the model's until its next Step.
type Model interface {
	Step(ctx context.Context, step *Step) ([]Sampled, error)
}

// Sampling is how a sequence's next token is drawn from the model's
// distribution, in the step (logits never leave it): temperature, then
// top-k, then top-p, as transformers orders them.
type Sampling struct {
	// Temperature divides the logits; 0 is greedy (the most likely
	// token, the lowest id of equals).
	Temperature float32
	TopK        int     // only the k most likely tokens; 0 for all
	TopP        float32 // only the most likely tokens up to this mass; 0 or 1 for all
	// Seed keys the counter-based generator the draw uses with the
	// token's position: a seeded sequence's tokens do not depend on what
	// it is batched with.
	Seed uint64
	// Logprobs asks for the sampled token's log-probability (0), and the
	// Logprobs most likely tokens' too (above 0); -1 for none.
	Logprobs int
	// Penalties change the logits from the tokens the sequence has seen
	// before the draw (penalty.go); the zero value is none.
	Penalties Penalties
}

// TopLogprob is one of the most likely tokens at a position.
type TopLogprob struct {
	Token   int32
	Logprob float32
}

// PromptLogprob is a prompt token's log-probability given the tokens
// before it, with the most likely tokens at its place.
type PromptLogprob struct {
	Token   int32
	Logprob float32
	Top     []TopLogprob
}

// Sampled is one sequence's result of a step.
type Sampled struct {
	Token   int32
	Logprob float32      // log-probability under the model (Sampling.Logprobs >= 0)
	Top     []TopLogprob // the most likely tokens, most likely first (Sampling.Logprobs > 0)
	// Prompt are the prompt tokens the work scored (Work.Scores), in
	// order, for a sequence that asks (Request.ScorePrompt).
	Prompt []PromptLogprob
	// Next, for a work with a draft (Drafter), are the tokens sampled at
	// the draft's places: Next[j] is drawn at the place after Draft[j],
	// following the sequence and Draft[:j+1], at its own position as plain
	// decoding would draw it.
	Next []Sampled
}

// Request is a generation as a client asks for it.
type Request struct {
	Prompt    []int32
	MaxTokens int
	Priority  int     // lower runs first
	EOS       []int32 // tokens that end it
	MinTokens int     // tokens generated before an EOS token may end it
	Sampling  Sampling
	// Constraint, when set, limits the tokens it may sample (structured
	// output): the loop's own from here, until the generation ends.
	Constraint Constraint
	// Ended, when set, is called in the loop (it must not block) once
	// the generation's last event is on its stream: the loop holds
	// nothing of it any more, whether or not its events are read.
	Ended func()
	// ScorePrompt asks for the prompt's tokens' log-probabilities (each
	// given those before it, from the first token on), with PromptTop
	// most likely tokens at each place: computed by the steps that
	// compute the prompt (the sequence shares no cached block), and
	// carried by the stream's first event (Event.Prompt).
	ScorePrompt bool
	PromptTop   int
	// After, when set, is the stream of a generation of the same prompt
	// submitted before (n choices of one prompt): this one starts once
	// that one's prompt is computed, so that it shares the prompt's
	// cached blocks (prefix caching) instead of computing them again.
	After *Stream
	// NoDraft keeps the generation out of speculative decoding
	// (Options.PromptLookup).
	NoDraft bool
}

// Event is what a generation's stream carries: a token, or, last, how it
// ended (Finish, or Err when a step failed).
type Event struct {
	Token   int32
	Logprob float32
	Top     []TopLogprob
	Finish  FinishReason
	Err     error
	// Prompt, on a scored sequence's first event, are its prompt tokens'
	// log-probabilities, the second token's first (Request.ScorePrompt).
	Prompt []PromptLogprob
	// EOS marks a last event whose Token (with its Logprob and Top) is
	// the end-of-sequence token that ended the generation: not output,
	// but reported (TGI lists it; best_of counts its log-probability).
	EOS bool
}

// Last reports whether ev ends its stream.
func (ev Event) Last() bool { return ev.Finish != NotFinished || ev.Err != nil }

// A Stream is one generation's events, as the loop produces them. The
// loop never waits on it: events wait here until read, and they are only
// the tokens generated (max_tokens bounds them), so a client that reads
// slowly holds memory in proportion to what it was sent, never the loop.
type Stream struct {
	mu     sync.Mutex
	events []Event
	ended  bool          // the last event has been pushed
	ready  chan struct{} // holds a signal while events wait
	stop   func() bool   // unregisters the context's cancellation
	onEnd  func()        // Request.Ended
	seq    *Sequence     // its sequence (Request.After names it by its stream)
}

func newStream() *Stream { return &Stream{ready: make(chan struct{}, 1)} }

func (st *Stream) push(ev Event) {
	st.mu.Lock()
	st.events = append(st.events, ev)
	st.ended = st.ended || ev.Last()
	st.mu.Unlock()
	select {
	case st.ready <- struct{}{}:
	default:
	}
}

// Next returns the next event, waiting for it until ctx ends. After the
// last event (Event.Last) it returns false.
func (st *Stream) Next(ctx context.Context) (Event, bool) {
	for {
		st.mu.Lock()
		if len(st.events) > 0 {
			ev := st.events[0]
			st.events = st.events[1:]
			if len(st.events) == 0 {
				st.events = nil // let the array go
			}
			st.mu.Unlock()
			return ev, true
		}
		ended := st.ended
		st.mu.Unlock()
		if ended {
			return Event{}, false
		}
		select {
		case <-st.ready:
		case <-ctx.Done():
			return Event{Err: ctx.Err()}, false
		}
	}
}

// ErrStopped is the error of the generations still running when their
// loop stops.
var ErrStopped = errors.New("generation: the model's loop stopped")

// Loop runs a model's steps continuously: it owns the model's scheduler
// and its steps, takes requests from any goroutine (Generate), and streams
// each one's tokens back as they are sampled. One Loop per model replica.
type Loop struct {
	sched *Scheduler
	model Model
	adds  chan add
	drops chan *Sequence
	done  chan struct{} // closed when Run returns
	// streams are the live generations'.
	streams  map[*Sequence]*Stream
	tokens   []int32 // the step's sampled tokens, for Advance
	verified []int32 // and those at its drafts' places
	// Observe, when set, is called in the loop (it must not block) after
	// every step the model ran, with how long it took, once its results
	// are recorded (Advance), and with an empty step when the loop goes
	// idle: the scheduler's state then.
	Observe func(step *Step, took time.Duration, st State)
}

// State is the scheduler's state between two steps.
type State struct {
	Running, Waiting        int
	BlocksFree, BlocksTotal int
}

func (l *Loop) state() State {
	return State{Running: l.sched.Running(), Waiting: l.sched.Waiting(), BlocksFree: l.sched.pool.Free(), BlocksTotal: l.sched.pool.Total()}
}

type add struct {
	q     *Sequence
	st    *Stream
	reply chan error
}

// NewLoop is a loop of model under the scheduler's opts; Run runs it.
func NewLoop(opts Options, model Model) (*Loop, error) {
	s, err := New(opts)
	if err != nil {
		return nil, err
	}
	if d, ok := model.(Drafter); opts.PromptLookup.Tokens > 0 && (!ok || !d.VerifiesDrafts()) {
		return nil, errors.New("generation: speculative decoding (num_speculative_tokens above 0) needs an engine whose steps verify drafts; the cpu engine's do, the worker engines' do not yet")
	}
	return &Loop{sched: s, model: model, adds: make(chan add), drops: make(chan *Sequence, 64),
		done: make(chan struct{}), streams: map[*Sequence]*Stream{}}, nil
}

// Generate submits r and returns its stream. A request that could never
// run is refused here, with ErrTooLong. When ctx ends, the generation
// stops at the next step (its stream's last event says FinishCancelled)
// and its KV cache blocks are freed.
func (l *Loop) Generate(ctx context.Context, r Request) (*Stream, error) {
	q := &Sequence{Prompt: r.Prompt, MaxTokens: r.MaxTokens, Priority: r.Priority, EOS: r.EOS, MinTokens: r.MinTokens, Sampling: r.Sampling,
		Constraint: r.Constraint, NoDraft: r.NoDraft}
	if wp, ok := l.model.(WholePrompter); ok && r.Sampling.Penalties.Active() && wp.CountsTokens() {
		q.whole = true
	}
	if r.After != nil {
		q.leader = r.After.seq
	}
	if r.ScorePrompt {
		q.scoring, q.promptTop, q.whole = true, r.PromptTop, true
	}
	st := newStream()
	st.seq = q
	st.onEnd = r.Ended
	reply := make(chan error, 1)
	select {
	case l.adds <- add{q, st, reply}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.done:
		return nil, ErrStopped
	}
	if err := <-reply; err != nil {
		return nil, err
	}
	st.mu.Lock()
	st.stop = context.AfterFunc(ctx, func() {
		select {
		case l.drops <- q:
		case <-l.done:
		}
	})
	st.mu.Unlock()
	return st, nil
}

// Run runs steps until ctx ends, then ends every live generation with
// ErrStopped.
func (l *Loop) Run(ctx context.Context) {
	defer close(l.done)
	defer func() {
		for q := range l.streams {
			l.end(q, Event{Err: ErrStopped})
		}
	}()
	for {
		// Take what arrived, then schedule; with nothing to do, wait.
		if !l.intake(ctx, false) {
			return
		}
		step := l.sched.Schedule()
		for _, q := range step.Finished {
			l.end(q, Event{Finish: q.Finish})
		}
		if len(step.Work) == 0 {
			if l.Observe != nil {
				l.Observe(step, 0, l.state())
			}
			if !l.intake(ctx, true) {
				return
			}
			continue
		}
		// A constrained sequence's step samples under its mask.
		for _, w := range step.Work {
			if q := w.Seq; q.Constraint != nil && w.Samples() {
				q.mask = q.Constraint.Mask()
			}
		}
		began := time.Now()
		sampled, err := l.step(ctx, step)
		took := time.Since(began)
		if err == nil && len(sampled) < len(step.Work) {
			err = fmt.Errorf("generation: the model returned %d tokens for a step of %d sequences", len(sampled), len(step.Work))
		}
		if err != nil {
			if l.Observe != nil {
				l.Observe(step, took, l.state())
			}
			if ctx.Err() != nil {
				return
			}
			// The step's sequences fail; their blocks go at the next
			// schedule.
			for _, w := range step.Work {
				if _, live := l.streams[w.Seq]; live {
					l.sched.Cancel(w.Seq)
					l.end(w.Seq, Event{Err: err})
				}
			}
			continue
		}
		l.tokens, l.verified = l.tokens[:0], l.verified[:0]
		for i, s := range sampled[:len(step.Work)] {
			l.tokens = append(l.tokens, s.Token)
			if len(step.Work[i].Draft) > 0 {
				from := len(l.verified)
				for _, n := range s.Next {
					l.verified = append(l.verified, n.Token)
				}
				step.SetVerified(i, l.verified[from:])
			}
			if q := step.Work[i].Seq; q.scoring {
				// A recomputed prompt is scored again: what was kept
				// stays.
				from, _ := step.Work[i].Scores()
				for j, p := range s.Prompt {
					if from+j == len(q.prompted)+1 {
						q.prompted = append(q.prompted, PromptLogprob{Token: p.Token, Logprob: p.Logprob, Top: slices.Clone(p.Top)})
					}
				}
			}
		}
		l.sched.Advance(step, l.tokens)
		if l.Observe != nil {
			l.Observe(step, took, l.state())
		}
		for i, w := range step.Work {
			q := w.Seq
			st, live := l.streams[q]
			if !live || !w.Samples() {
				continue
			}
			if q.err != nil {
				l.end(q, Event{Err: q.err})
				continue
			}
			var prompt []PromptLogprob
			if q.scoring && !q.promptSent {
				prompt, q.promptSent = q.prompted, true
				if prompt == nil {
					prompt = []PromptLogprob{} // a one-token prompt: nothing scored, its token still listed
				}
			}
			// One event a token the sequence took: the sampled one, then
			// those after each draft token kept. An end-of-sequence token
			// is the last event's.
			s := sampled[i]
			for j := range w.Took() {
				if j > 0 {
					s = sampled[i].Next[j-1]
				}
				if j == w.Took()-1 && q.Finish == FinishStop {
					break
				}
				st.push(Event{Token: s.Token, Logprob: s.Logprob, Top: slices.Clone(s.Top), Prompt: prompt})
				prompt = nil
			}
			if q.Finish != NotFinished {
				last := Event{Finish: q.Finish, Prompt: prompt}
				if q.Finish == FinishStop {
					last.Token, last.Logprob, last.Top, last.EOS = s.Token, s.Logprob, slices.Clone(s.Top), true
				}
				l.end(q, last)
			}
		}
	}
}

// step runs the model's step; a panic in it (an engine's bug) fails the
// step's sequences as an error would, rather than the process.
func (l *Loop) step(ctx context.Context, step *Step) (sampled []Sampled, err error) {
	defer func() {
		if p := recover(); p != nil {
			sampled, err = nil, fmt.Errorf("generation: the model's step panicked: %v", p)
		}
	}()
	return l.model.Step(ctx, step)
}

// intake takes the adds and cancellations waiting; with wait, it blocks
// for one first. It reports false when ctx has ended.
func (l *Loop) intake(ctx context.Context, wait bool) bool {
	for {
		var a add
		var q *Sequence
		if wait {
			select {
			case a = <-l.adds:
			case q = <-l.drops:
			case <-ctx.Done():
				return false
			}
			wait = false
		} else {
			select {
			case a = <-l.adds:
			case q = <-l.drops:
			case <-ctx.Done():
				return false
			default:
				return true
			}
		}
		switch {
		case a.q != nil:
			if err := l.sched.Add(a.q); err != nil {
				a.reply <- err
				continue
			}
			l.streams[a.q] = a.st
			a.reply <- nil
		case q != nil:
			if _, live := l.streams[q]; live {
				l.sched.Cancel(q) // ended at the next schedule, which frees its blocks
			}
		}
	}
}

// end sends q's last event; its context no longer matters.
func (l *Loop) end(q *Sequence, last Event) {
	st, live := l.streams[q]
	if !live {
		return
	}
	st.push(last)
	delete(l.streams, q)
	if st.onEnd != nil {
		st.onEnd()
	}
	st.mu.Lock()
	stop := st.stop
	st.mu.Unlock()
	if stop != nil {
		stop()
	}
}
