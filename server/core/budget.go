package core

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stepserve/stepserve/internal/bytesize"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/wire"
)

// DefaultBudgetWait is how long a request waits for in-flight memory that others
// hold before it is answered 503: long enough to ride out a burst, short
// enough that a client retries rather than times out.
const DefaultBudgetWait = time.Second

// A Budget is the memory all requests in flight may hold together. A
// request takes its bytes before it allocates them (its body as it grows,
// then, from its declared shapes, its tensors, outputs and response) and
// gives them back once its response is written, so that concurrency cannot
// multiply one request's bound into more memory than the process has.
//
// Taking and giving are an atomic add each; only a request that finds the
// Budget spent waits, on a channel closed whenever bytes are given back.
// It is safe for concurrent use.
type Budget struct {
	limit   int64
	used    atomic.Int64
	waiting atomic.Int32
	mu      sync.Mutex
	freed   chan struct{} // closed, and replaced, when bytes are given back to a waiter
}

func NewBudget(limit int64) *Budget {
	return &Budget{limit: limit, freed: make(chan struct{})}
}

// InUse is what requests in flight hold now.
func (b *Budget) InUse() int64 { return b.used.Load() }

// Limit is the most the budget holds.
func (b *Budget) Limit() int64 { return b.limit }

// Take takes n bytes, waiting up to wait for others to give them back:
// an error wrapping [ErrBusy] if they do not in time, ctx's if it ends
// first.
func (b *Budget) Take(ctx context.Context, n int64, wait time.Duration) error {
	if n <= 0 {
		return nil // nothing to take; a negative n would give room back
	}
	if b.TryTake(n) {
		return nil
	}
	if err := b.wait(ctx, n, wait); err != nil {
		if err == errBudgetBusy {
			return fmt.Errorf("%w", ErrBusy)
		}
		return err
	}
	return nil
}

// TryTake takes n bytes if they are free.
func (b *Budget) TryTake(n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// wait takes n bytes, waiting up to wait for others to give them back:
// errBudgetBusy if they do not in time.
func (b *Budget) wait(ctx context.Context, n int64, wait time.Duration) error {
	b.waiting.Add(1)
	defer b.waiting.Add(-1)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		b.mu.Lock()
		freed := b.freed
		b.mu.Unlock()
		// Tried after freed is read: bytes given back since then are
		// either seen here or close the channel read.
		if b.TryTake(n) {
			return nil
		}
		select {
		case <-freed:
		case <-timer.C:
			return errBudgetBusy
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Give gives back n bytes taken before.
func (b *Budget) Give(n int64) {
	b.used.Add(-n)
	if b.waiting.Load() > 0 {
		b.mu.Lock()
		close(b.freed)
		b.freed = make(chan struct{})
		b.mu.Unlock()
	}
}

var errBudgetBusy = errors.New("server: the in-flight budget stayed spent")

// ErrBusy is wrapped by the error of a request that found the in-flight
// budget held by others for longer than it may wait: 503 with Retry-After
// over HTTP, RESOURCE_EXHAUSTED with a retry pushback over gRPC.
var ErrBusy = errors.New("server: the in-flight budget is spent; retry")

// busyError is a 503 that is also [ErrBusy].
type busyError struct{ err *apierr.Error }

func (e busyError) Error() string   { return e.err.Msg }
func (e busyError) Unwrap() []error { return []error{e.err, ErrBusy} }

// A Charge is what one request holds of the budget; release gives it all
// back. It is used by one request's goroutine.
type Charge struct {
	Budget *Budget
	Wait   time.Duration // how long a take waits for others to give back
	held   int64
}

// Take adds n bytes to the charge, waiting briefly when others hold the
// budget. Its errors are the answers: 413 when the request alone would
// need more than the whole budget, 503 (with Retry-After) when others hold
// it. what names the request's part that needs the bytes.
func (c *Charge) Take(ctx context.Context, n int64, what string) error {
	if n <= 0 {
		return nil
	}
	if c.held+n > c.Budget.limit {
		return &apierr.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf(
			"%s would take about %s of memory, more than the server's whole in-flight budget of %s (server.max_inflight_bytes); send a smaller request",
			what, bytesize.Format(c.held+n), bytesize.Format(c.Budget.limit))}
	}
	if !c.Budget.TryTake(n) {
		if err := c.Budget.wait(ctx, n, c.Wait); err != nil {
			if err != errBudgetBusy {
				return err
			}
			return busyError{err: &apierr.Error{Status: http.StatusServiceUnavailable, Msg: fmt.Sprintf(
				"the server is busy: requests in flight hold %s of its %s in-flight budget (server.max_inflight_bytes), and %s needs %s more; retry",
				bytesize.Format(c.Budget.used.Load()), bytesize.Format(c.Budget.limit), what, bytesize.Format(n))}}
		}
	}
	c.held += n
	return nil
}

// Shrink gives back what the charge holds beyond n bytes: what was taken
// for the most a part could need, once its size is known.
func (c *Charge) Shrink(n int64) {
	if c.held > n {
		c.Budget.Give(c.held - max(n, 0))
		c.held = max(n, 0)
	}
}

// Release gives back the whole charge.
func (c *Charge) Release() {
	if c.held != 0 {
		c.Budget.Give(c.held)
		c.held = 0
	}
}

// admit checks a parsed request's footprint against the response limit
// and takes its memory from the in-flight budget, on top of its body's.
func (c *Core) admit(ctx context.Context, ch *Charge, f wire.Footprint) error {
	if f.Response() > c.Opts.MaxResponseBytes {
		perRow, of, advice := f.Response()/int64(max(f.Rows, 1)), "", "send fewer rows"
		if f.JSON > f.Binary && !f.Protobuf {
			of, advice = " of JSON", "send fewer rows or ask for binary outputs"
		}
		return &apierr.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf(
			"the response would be about %s (%d rows x %s%s), above server.max_response_bytes (%s); %s",
			bytesize.Format(f.Response()), f.Rows, bytesize.Format(perRow), of, bytesize.Format(c.Opts.MaxResponseBytes), advice)}
	}
	return ch.Take(ctx, f.Memory(), "the request")
}

// Charge is a new, empty charge against c's budget, waiting c.BudgetWait
// for bytes others hold.
func (c *Core) Charge() Charge { return Charge{Budget: c.Budget, Wait: c.BudgetWait} }

// Hold adds n bytes held already, whatever the budget has left: memory
// that exists and must be counted (a response gRPC has queued for a client
// that has not read it), so that new requests find the budget as spent as
// memory is. Give gives it back.
func (b *Budget) Hold(n int64) {
	if n > 0 {
		b.used.Add(n)
	}
}
