package batching

import "time"

// form is the goroutine that forms batches: it waits until the queued rows
// fill the largest bucket or the oldest request has waited MaxQueueDelay,
// then takes requests in priority, then arrival, order. It forms the next
// batch while the previous one runs.
func (b *Batcher) form() {
	defer close(b.batches)
	maxRows := b.runner.MaxBatch()
	var timer *time.Timer
	for {
		b.mu.Lock()
		b.compact()
		oldest, rows, seq := b.scan()
		draining := b.draining
		resuming := b.resuming > 0 // the running step will queue rows again
		b.mu.Unlock()

		if oldest == nil {
			if draining && !resuming {
				return
			}
			<-b.wake
			continue
		}
		if wait := b.policy.MaxQueueDelay - time.Since(oldest.enqueued); rows < maxRows && !b.overBudget(rows, seq) && wait > 0 && !draining {
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			select {
			case <-b.wake:
				timer.Stop()
			case <-timer.C:
			}
			continue
		}
		if batch := b.take(nil, maxRows, &b.pending); len(batch) > 0 {
			b.handOff(batch, maxRows)
		}
	}
}

// handOff gives a formed batch to the runner. While the runner is busy the
// batch keeps taking requests that arrive, up to the largest bucket, so
// that the batch the runner gets is as full as the queue allows even when
// max_queue_delay is 0.
func (b *Batcher) handOff(batch []*item, maxRows int) {
	for {
		select {
		case b.batches <- batch:
			// The next batch is formed only once this one runs: while the
			// runner waits out a step a Submit runs itself, arrivals join
			// this batch in priority order rather than a later one.
			<-b.started
			return
		case <-b.wake:
			batch = b.take(batch, maxRows, &b.pending)
		}
	}
}

// compact drops abandoned items from the front of every level.
func (b *Batcher) compact() {
	for l, q := range b.levels {
		i := 0
		for i < len(q) && q[i].state == abandoned {
			q[i] = nil
			i++
		}
		b.levels[l] = q[i:]
	}
}

// overBudget reports whether queued rows whose longest sequence is seq
// would pass the token budget in one step: a batch is then as full as the
// budget lets it be, and forms without waiting for more.
func (b *Batcher) overBudget(rows, seq int) bool {
	return b.policy.MaxBatchTokens > 0 && b.opts.Padded != nil && seq > 0 &&
		b.opts.Padded(min(rows, b.maxRows), seq) > b.policy.MaxBatchTokens
}

// scan finds the oldest queued item, and the queued rows of the open
// levels and their longest sequence.
func (b *Batcher) scan() (oldest *item, rows, seq int) {
	for _, q := range b.levels[:b.open()] {
		for _, it := range q {
			if it.state != queued {
				continue
			}
			rows += it.req.Rows - it.ran
			seq = max(seq, it.req.Seq)
			if oldest == nil || it.enqueued.Before(oldest.enqueued) {
				oldest = it
			}
		}
	}
	return oldest, rows, seq
}

// take removes a batch from the queue, or adds to batch: items in priority
// then arrival order until the next would overflow maxRows (or
// MaxBatchElements). A request larger than maxRows is taken a part at a
// time (fits).
func (b *Batcher) take(batch []*item, maxRows int, slot *[]*item) []*item {
	b.mu.Lock()
	defer b.mu.Unlock()
	rows, elements, seq := 0, 0, 0
	for _, it := range batch {
		rows += it.rows
		elements += it.elements()
		seq = max(seq, it.req.Seq)
	}
	// closed: the token budget turned a request away, and the batch takes
	// nothing after it, so that it starts the next batch (FIFO order).
	closed := false
	for l, q := range b.levels[:b.open()] {
		kept := q[:0]
		for _, it := range q {
			if it.state != queued {
				continue
			}
			n := 0
			if rows < maxRows && !closed {
				n = b.fits(it, len(batch) == 0, maxRows-rows, elements)
				if n > 0 && b.tokenBound(it) {
					if n = b.fitsTokens(it, len(batch) == 0, rows, seq, n); n == 0 {
						closed = true
						if !it.deferred {
							it.deferred = true
							b.m.deferred()
						}
					}
				}
			}
			if n == 0 {
				kept = append(kept, it)
				continue
			}
			it.rows = n
			batch = append(batch, it)
			rows += n
			elements += it.elements()
			seq = max(seq, it.req.Seq)
		}
		clear(q[len(kept):])
		b.levels[l] = kept
	}
	*slot = batch
	return batch
}

// open is how many priority levels, from the highest, a batch may take
// from: all of them, except while a request with rows left runs: then none
// below its level, so that lower priorities do not fill the batch formed
// meanwhile and pass its next part over.
func (b *Batcher) open() int {
	if b.resuming > 0 {
		for l, n := range b.resumingAt {
			if n > 0 {
				return l + 1
			}
		}
	}
	return len(b.levels)
}

// fits is how many of it's rows left a batch takes, given the rows it has
// room for and the elements it holds: all of them or none for a request that
// fits a step, as many as there is room for (at most maxRows) for one that
// does not. An empty batch takes a request whatever MaxBatchElements says.
func (b *Batcher) fits(it *item, empty bool, room, elements int) int {
	left := it.req.Rows - it.ran
	if empty {
		return min(left, room)
	}
	limit := b.policy.MaxBatchElements
	if it.req.Rows <= b.maxRows {
		if left > room || (limit > 0 && elements+it.req.Elements > limit) {
			return 0
		}
		return left
	}
	n := min(left, room)
	if limit > 0 {
		perRow := max((it.req.Elements+it.req.Rows-1)/it.req.Rows, 1)
		n = min(n, (limit-elements)/perRow)
	}
	return max(n, 0)
}

// tokenBound reports whether the token budget applies to it: one is set,
// and it is a request with a sequence.
func (b *Batcher) tokenBound(it *item) bool {
	return b.policy.MaxBatchTokens > 0 && b.opts.Padded != nil && it.req.Seq > 0
}

// fitsTokens bounds n, the rows of it that the batch (rows rows, longest
// sequence seq) would take, by the token budget: a request that fits one
// step joins whole or not at all; one larger than a step is taken as many
// rows as keep the batch within the budget. An empty batch takes a whole
// request whatever its tokens, and at least a row of a larger one, so that
// every request runs.
func (b *Batcher) fitsTokens(it *item, empty bool, rows, seq, n int) int {
	budget := b.policy.MaxBatchTokens
	s := max(seq, it.req.Seq)
	if it.req.Rows <= b.maxRows {
		if !empty && b.opts.Padded(rows+n, s) > budget {
			return 0
		}
		return n
	}
	// The most rows within the budget: padded tokens only grow with rows.
	lo, hi := 0, n
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if b.opts.Padded(rows+mid, s) <= budget {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	if empty {
		return max(lo, 1)
	}
	return lo
}
