package generation

import (
	"context"
	"errors"
	"fmt"
)

// Model runs a step of a decoder: for every Work it computes the tokens
// [Start, End) of its sequence into the KV cache and, where the work
// samples, the sequence's next token, returned at the work's index (what
// is returned at other indexes is ignored).
type Model interface {
	Step(ctx context.Context, step *Step) ([]int32, error)
}

// Request is a generation as a client asks for it.
type Request struct {
	Prompt    []int32
	MaxTokens int
	Priority  int     // lower runs first
	EOS       []int32 // tokens that end it
}

// Event is what a generation's stream carries: a token, or, last, how it
// ended (Finish, or Err when a step failed). The stream is closed after
// its last event.
type Event struct {
	Token  int32
	Finish FinishReason
	Err    error
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
	// streams are the live generations' event channels.
	streams map[*Sequence]chan Event
}

type add struct {
	q     *Sequence
	reply chan error
}

// NewLoop is a loop of model under the scheduler's opts; Run runs it.
func NewLoop(opts Options, model Model) (*Loop, error) {
	s, err := New(opts)
	if err != nil {
		return nil, err
	}
	return &Loop{sched: s, model: model, adds: make(chan add), drops: make(chan *Sequence, 64),
		done: make(chan struct{}), streams: map[*Sequence]chan Event{}}, nil
}

// Generate submits r and returns its stream. A request that could never
// run is refused here, with ErrTooLong. When ctx ends, the generation
// stops at the next step (its stream's last event says FinishCancelled)
// and its KV cache blocks are freed.
func (l *Loop) Generate(ctx context.Context, r Request) (<-chan Event, error) {
	q := &Sequence{Prompt: r.Prompt, MaxTokens: r.MaxTokens, Priority: r.Priority, EOS: r.EOS}
	reply := make(chan error, 1)
	select {
	case l.adds <- add{q, reply}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.done:
		return nil, ErrStopped
	}
	if err := <-reply; err != nil {
		return nil, err
	}
	l.watch(ctx, q)
	return l.stream(q), nil
}

// stream is q's channel; it is made when q is added, before Generate
// returns, and only the loop writes it.
func (l *Loop) stream(q *Sequence) <-chan Event { return q.events }

// watch cancels q when ctx ends.
func (l *Loop) watch(ctx context.Context, q *Sequence) {
	if ctx.Done() == nil {
		return
	}
	context.AfterFunc(ctx, func() {
		select {
		case l.drops <- q:
		case <-l.done:
		}
	})
}

// Run runs steps until ctx ends, then ends every live generation with
// ErrStopped.
func (l *Loop) Run(ctx context.Context) {
	defer close(l.done)
	defer func() {
		for q, ch := range l.streams {
			ch <- Event{Err: ErrStopped}
			close(ch)
			delete(l.streams, q)
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
			if !l.intake(ctx, true) {
				return
			}
			continue
		}
		sampled, err := l.model.Step(ctx, step)
		if err == nil && len(sampled) < len(step.Work) {
			err = fmt.Errorf("generation: the model returned %d tokens for a step of %d sequences", len(sampled), len(step.Work))
		}
		if err != nil {
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
		samples := make([]bool, len(step.Work)) // before Advance lengthens the sequences
		for i, w := range step.Work {
			samples[i] = w.Samples()
		}
		l.sched.Advance(step, sampled)
		for i, w := range step.Work {
			q := w.Seq
			ch, live := l.streams[q]
			if !live || !samples[i] {
				continue
			}
			if q.Finish != FinishStop {
				ch <- Event{Token: sampled[i]}
			}
			if q.Finish != NotFinished {
				l.end(q, Event{Finish: q.Finish})
			}
		}
	}
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
			// Room for every event: a stream whose client reads slowly
			// never holds up the loop (max_tokens bounds it).
			a.q.events = make(chan Event, a.q.MaxTokens+1)
			l.streams[a.q] = a.q.events
			a.reply <- nil
		case q != nil:
			if _, live := l.streams[q]; live {
				l.sched.Cancel(q) // ended at the next schedule, which frees its blocks
			}
		}
	}
}

// end sends q's last event and closes its stream.
func (l *Loop) end(q *Sequence, last Event) {
	ch, live := l.streams[q]
	if !live {
		return
	}
	ch <- last
	close(ch)
	delete(l.streams, q)
}
