package batching

import (
	"context"
	"time"

	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/steps"
)

// run is the goroutine that runs formed batches: one at a time on its own
// goroutine, or, for a [Parallel] runner, each on a goroutine of its own,
// up to Parallelism at once. It returns, closing stopped, once the former
// has closed batches; steps it started may still run then (WaitIdle).
func (b *Batcher) run() {
	defer close(b.stopped)
	maxRows := b.runner.MaxBatch()
	parallel := cap(b.stepping) > 1
	reqs := make([]*steps.Request, 0, 64)
	for batch := range b.batches {
		// Wait out a step a Submit runs itself, then take in what queued
		// behind it.
		b.mu.Lock()
		b.pending, b.next = nil, batch
		b.mu.Unlock()
		b.stepping <- struct{}{}
		batch = b.take(batch, maxRows, &b.next)
		b.started <- struct{}{}
		// Requests answered at their deadline or cancelled while the batch
		// waited never reach the device.
		b.mu.Lock()
		b.next = nil
		live := batch[:0]
		resuming := 0
		for _, it := range batch {
			if it.state != queued {
				continue
			}
			if it.ctx.Err() != nil { // the client went away
				it.state = abandoned
				b.live--
				it.done <- it.ctx.Err()
				continue
			}
			it.state = running
			b.live--
			if it.ran+it.rows < it.req.Rows {
				resuming++
				b.resumingAt[it.level]++
			}
			live = append(live, it)
		}
		b.resuming += resuming
		b.m.depth(b.live)
		b.mu.Unlock()
		if len(live) == 0 {
			<-b.stepping
			continue
		}

		start := time.Now()
		if parallel {
			reqs = make([]*steps.Request, 0, len(live))
		}
		reqs = reqs[:0]
		for _, it := range live {
			r := it.req
			if it.ran == 0 {
				r.Queued = max(start.Sub(it.enqueued), time.Nanosecond) // nonzero: it was queued
				r.Trace.StampAt(trace.Batched, start)
				b.m.queued(r.Queued)
			}
			if it.split() {
				it.part = r.Part(it.ran, it.ran+it.rows, it.part)
				if it.ran > 0 {
					it.part.Queued = 0 // counted with its first part
				}
				r = it.part
			}
			reqs = append(reqs, r)
		}
		if parallel {
			go b.step(live, reqs, resuming)
			continue
		}
		b.step(live, reqs, resuming)
	}
}

// step runs one formed batch, which holds a step token, releases the token
// and answers its requests (or queues again those with rows left).
func (b *Batcher) step(live []*item, reqs []*steps.Request, resuming int) {
	// The step runs to completion whatever its clients do: its results
	// are shared, and it cannot be interrupted.
	err := b.runner.Run(context.Background(), reqs)
	if err != nil {
		b.opts.Logger.Error("batch failed", "model", b.opts.Model, "requests", len(live), "err", err)
	}
	<-b.stepping
	if resuming == 0 {
		for _, it := range live {
			it.done <- err
		}
		return
	}
	b.afterPartialStep(live, err)
}

// afterPartialStep answers the requests of a step that held parts of
// requests, and queues again those with rows left, at the end of their
// level: behind what arrived while they ran.
func (b *Batcher) afterPartialStep(live []*item, err error) {
	b.mu.Lock()
	for _, it := range live {
		it.ran += it.rows
		left := it.ran < it.req.Rows
		if left {
			b.resuming--
			b.resumingAt[it.level]--
		}
		if !left || err != nil {
			it.done <- err
			continue
		}
		stop := it.stop
		if stop == nil {
			stop = it.ctx.Err() // gone, and its Submit has not marked it yet
		}
		if stop == nil && b.dropped {
			stop = ErrDraining
		}
		if stop != nil {
			it.state = abandoned
			it.done <- stop
			b.opts.Logger.Debug("request stopped between its steps", "model", b.opts.Model,
				"rows_run", it.ran, "rows", it.req.Rows, "err", stop)
			continue
		}
		it.state = queued
		b.levels[it.level] = append(b.levels[it.level], it)
		b.live++
	}
	b.m.depth(b.live)
	b.mu.Unlock()
	b.nudge()
}
