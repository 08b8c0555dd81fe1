// Package batching owns the dynamic batcher: one [Batcher] per model that
// queues requests, forms batches of up to the largest bucket's rows, and
// runs them one at a time (or, for a model loaded several times, one per
// replica at a time: [Parallel]), with Triton's semantics: a bounded queue
// that rejects at once when full, a maximum queue delay, priority levels,
// and per-request timeouts that are answered at their deadline.
//
// It also owns the batching [Policy] and its rules: the server's
// configuration and a model's model.yaml both give a Policy, and
// [Policy.Validate] is the one place either is checked.
//
// It knows requests only as [steps.Request] rows; it knows nothing of HTTP,
// of buckets beyond the runner's MaxBatch, or of where a policy was read
// from.
//
// # Lifetime of a request
//
// Submit enqueues and waits. The request is answered exactly once: with its
// outputs after its last step ran, with [ErrDeadline] at its deadline if it
// was still queued then, with the context's error if its client went away
// while it was queued, or with [ErrDraining] if shutdown's grace ran out
// before its batch could run. A request whose last step has started is
// always answered with that step's outcome.
//
// # Requests larger than a step
//
// A request with more rows than the largest bucket (MaxBatch) runs a part
// at a time, so that it cannot hold the model for its whole run: each part
// fills what room a batch has left, up to MaxBatch rows, and after each
// step the rest of the request goes back to the end of its priority level's
// queue, behind the requests that arrived meanwhile, which therefore get a
// step before its next one. Its parts never run at the same time, even
// with several batches in flight ([Parallel]): its rest is queued again
// only once its part's step has ended. Between its steps it is checked
// like a queued request: if its client went away or its deadline passed,
// it stops there, its remaining rows never run, and it is answered with
// the context's error or [ErrDeadline]; the other requests of the steps it
// shared are unaffected. A request that fits one step is never split.
package batching

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/steps"
)

// Errors Submit returns; the server maps them to status codes.
var (
	ErrQueueFull    = errors.New("batching: queue full")
	ErrDraining     = errors.New("batching: shutting down")
	ErrDeadline     = errors.New("batching: deadline passed")
	ErrBadParameter = errors.New("batching: bad request parameter")
)

// Runner runs batches; *steps.Runner is one. The batcher hands it at most
// MaxBatch rows at a time: one step.
type Runner interface {
	Run(ctx context.Context, reqs []*steps.Request) error
	MaxBatch() int
}

// Parallel is a Runner that runs several batches at once: a model loaded
// as several replicas. The batcher keeps up to Parallelism batches in
// flight, each handed to Run as soon as it is formed; Run must be safe for
// that many concurrent calls.
type Parallel interface {
	Runner
	Parallelism() int
}

// Options configure a [Batcher]. The zero value batches with no delay, a
// queue of 1024, one priority level and no timeout.
type Options struct {
	Model string // for metrics and logs
	// Policy is the model's batching policy; its zero fields take their
	// defaults ([Policy.WithDefaults]).
	Policy  Policy
	Metrics *Metrics // nil records nothing
	Logger  *slog.Logger
	// Padded is the padded tokens of a step of rows rows whose longest
	// sequence is seq: the rows of the batch bucket that holds them times
	// the seq bucket that holds seq. Policy.MaxBatchTokens bounds it; nil
	// (or a model without sequences, seq 0) leaves batches unbounded by
	// tokens.
	Padded func(rows, seq int) int
}

// Params are a request's own batching parameters, from its "parameters".
type Params struct {
	// Priority is the level, 1 the highest; 0, or a level the model does
	// not have, means the default.
	Priority int
	// Timeout lowers the model's default timeout; 0 means the default.
	Timeout time.Duration
}

type state int

const (
	queued    state = iota // waiting in the queue or in a formed batch
	running                // in the running step: it gets the step's outcome, or goes back to the queue
	abandoned              // answered at its deadline or dropped on cancel
)

type item struct {
	req      *steps.Request
	ctx      context.Context
	enqueued time.Time
	level    int // its priority level's index in Batcher.levels
	done     chan error

	// Guarded by Batcher.mu.
	state state
	ran   int   // rows that have run, for a request that spans steps
	rows  int   // rows in the batch it is in: all that are left, or a part
	stop  error // set while it runs when its deadline passes or its client goes
	part  *steps.Request
	// deferred says the token budget kept it out of a batch once
	// (counted once, however often the batch being formed is looked at).
	deferred bool
}

// split reports whether the batch it is in holds only a part of it.
func (it *item) split() bool { return it.rows != it.req.Rows }

// elements is the number of input elements of its rows in the batch.
func (it *item) elements() int {
	if !it.split() {
		return it.req.Elements
	}
	return (it.req.Elements*it.rows + it.req.Rows - 1) / it.req.Rows
}

// Batcher queues one model's requests and runs them in batches.
type Batcher struct {
	opts   Options
	policy Policy // opts.Policy with its defaults
	runner Runner
	m      *modelMetrics

	maxRows int // the runner's MaxBatch: the most rows of a step

	mu       sync.Mutex
	levels   [][]*item // FIFO per priority level; abandoned items are skipped
	pending  []*item   // the batch being formed, not yet handed to the runner
	next     []*item   // the batch the runner holds, waiting for the step token
	live     int       // queued items not abandoned
	resuming int       // running items with rows left, to be queued again
	// resumingAt counts them by priority level: while one runs, batches
	// take nothing of a lower priority (open).
	resumingAt []int
	draining   bool
	dropped    bool          // shutdown's grace ran out: nothing more runs
	wake       chan struct{} // nudges the former; capacity 1

	batches chan []*item
	stopped chan struct{}

	// stepping holds a token while a batch runs, on the run goroutine (or
	// one it started) or on a Submit that found the model idle and runs
	// its request itself: as many steps at a time as the runner's
	// Parallelism, one for a plain Runner. (A channel, not a mutex, so
	// that a wait on it is a durable block for synctest.)
	stepping chan struct{}
	started  chan struct{} // the runner took the token for the batch it was handed
}

// New starts a batcher in front of runner. Stop it with Shutdown.
func New(runner Runner, opts Options) (*Batcher, error) {
	p := opts.Policy.WithDefaults()
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("batching: model %s: %w", opts.Model, err)
	}
	inFlight := 1
	if par, ok := runner.(Parallel); ok {
		inFlight = max(par.Parallelism(), 1)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	b := &Batcher{
		opts:       opts,
		policy:     p,
		runner:     runner,
		maxRows:    runner.MaxBatch(),
		m:          opts.Metrics.forModel(opts.Model),
		levels:     make([][]*item, p.PriorityLevels),
		resumingAt: make([]int, p.PriorityLevels),
		wake:       make(chan struct{}, 1),
		batches:    make(chan []*item),
		stopped:    make(chan struct{}),
		stepping:   make(chan struct{}, inFlight),
		started:    make(chan struct{}),
	}
	go b.form()
	go b.run()
	return b, nil
}

// Submit queues r and waits for its answer. It returns at once with
// [ErrQueueFull] when the queue is full, [ErrDraining] after Shutdown began,
// and [ErrBadParameter] for a negative timeout. A priority out of range
// takes the default level, as Triton's does.
func (b *Batcher) Submit(ctx context.Context, r *steps.Request, p Params) error {
	prio := p.Priority
	if prio < 1 || prio > b.policy.PriorityLevels {
		// 0 asks for the default level; so does a level the model does
		// not have, as in Triton.
		prio = b.policy.DefaultPriority
	}
	if p.Timeout < 0 {
		return fmt.Errorf("%w: timeout must not be negative", ErrBadParameter)
	}
	timeout := b.policy.DefaultTimeout
	if p.Timeout > 0 && (timeout == 0 || p.Timeout < timeout) {
		timeout = p.Timeout
	}

	enqueued := time.Now()
	r.Trace.StampAt(trace.Enqueued, enqueued)
	b.mu.Lock()
	switch {
	case b.draining:
		b.mu.Unlock()
		return ErrDraining
	case b.policy.MaxQueueDelay == 0 && b.live == 0 && r.Rows <= b.maxRows && b.tryStep():
		// Nothing waits and a runner is free: there is no batch to join,
		// so run at once on this goroutine instead of handing the request
		// to the batcher's and back (two goroutine switches per request,
		// the larger part of a small model's step). A request that spans
		// steps queues, to run a part at a time.
		b.mu.Unlock()
		return b.runNow(ctx, r, enqueued)
	case b.live >= b.policy.MaxQueueSize:
		n := b.live
		b.mu.Unlock()
		return fmt.Errorf("%w: %d requests are waiting for model %s (max_queue_size)", ErrQueueFull, n, b.opts.Model)
	}
	it := &item{req: r, ctx: ctx, enqueued: enqueued, level: prio - 1, done: make(chan error, 1)}
	b.levels[prio-1] = append(b.levels[prio-1], it)
	b.live++
	b.m.depth(b.live)
	b.mu.Unlock()
	b.nudge()

	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	// While it runs, a deadline or a cancel only marks it (abandon), and
	// the wait goes on for the run goroutine's answer: the outcome of its
	// step, or this error at the step's end if rows of it are left.
	gone := ctx.Done()
	for {
		select {
		case err := <-it.done:
			return err
		case <-deadline:
			deadline = nil
			err := fmt.Errorf("%w after %v (timeout)", ErrDeadline, timeout)
			if b.abandon(it, err) {
				return err
			}
		case <-gone:
			gone = nil
			if b.abandon(it, ctx.Err()) {
				return ctx.Err()
			}
		}
	}
}

// tryStep takes a step token if fewer batches run than may.
func (b *Batcher) tryStep() bool {
	select {
	case b.stepping <- struct{}{}:
		return true
	default:
		return false
	}
}

// runNow runs one request as its own batch on the caller's goroutine; the
// caller holds the step token. Requests that arrive meanwhile queue, and the
// batch the run goroutine forms from them waits for this step, growing.
func (b *Batcher) runNow(ctx context.Context, r *steps.Request, enqueued time.Time) error {
	defer func() { <-b.stepping }()
	if err := ctx.Err(); err != nil {
		return err
	}
	r.Queued = max(time.Since(enqueued), time.Nanosecond)
	r.Trace.Stamp(trace.Batched)
	b.m.queued(r.Queued)
	reqs := [1]*steps.Request{r}
	err := b.runner.Run(context.Background(), reqs[:])
	if err != nil {
		b.opts.Logger.Error("batch failed", "model", b.opts.Model, "requests", 1, "err", err)
	}
	return err
}

// abandon takes a queued item out of the running. It reports false when the
// item is not queued: when it runs, err is kept for its next step boundary.
func (b *Batcher) abandon(it *item, err error) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch it.state {
	case running:
		if it.stop == nil {
			it.stop = err
		}
		return false
	case abandoned:
		return false
	}
	it.state = abandoned
	b.live--
	b.m.depth(b.live)
	return true
}

func (b *Batcher) nudge() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// Shutdown stops accepting (Submit returns ErrDraining), runs every queued
// batch without waiting for MaxQueueDelay, and returns when the queue is
// empty and the last batch has finished. If ctx ends first, every request
// still queued is answered with ErrDraining, the running batch is left to
// finish, and ctx's error is returned.
func (b *Batcher) Shutdown(ctx context.Context) error {
	b.mu.Lock()
	b.draining = true
	b.mu.Unlock()
	b.nudge()
	select {
	case <-b.stopped:
		// A request that found the model idle may still be running its own
		// step; it is answered with that step's outcome, whenever it ends.
		return b.WaitIdle(ctx)
	case <-ctx.Done():
	}
	b.mu.Lock()
	b.dropped = true
	dropped := 0
	drop := func(q []*item) {
		for _, it := range q {
			if it.state == queued {
				it.state = abandoned
				b.live--
				it.done <- ErrDraining
				dropped++
			}
		}
	}
	for _, q := range b.levels {
		drop(q)
	}
	drop(b.pending)
	drop(b.next)
	b.m.depth(b.live)
	b.mu.Unlock()
	b.opts.Logger.Warn("drain grace ran out", "model", b.opts.Model, "answered_503", dropped)
	return ctx.Err()
}

// WaitIdle waits, after Shutdown, until no step runs any more: the moment
// the runner's resources (a program's staging) may be released. It returns
// ctx's error if ctx ends first.
func (b *Batcher) WaitIdle(ctx context.Context) error {
	select {
	case <-b.stopped:
	case <-ctx.Done():
		return ctx.Err()
	}
	// Every token taken is every step ended.
	taken := 0
	defer func() {
		for range taken {
			<-b.stepping
		}
	}()
	for taken < cap(b.stepping) {
		select {
		case b.stepping <- struct{}{}:
			taken++
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Depth is the number of requests waiting.
func (b *Batcher) Depth() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.live
}

// Policy is the policy the batcher applies: its options' policy with the
// defaults filled in.
func (b *Batcher) Policy() Policy { return b.policy }
