package batching

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// firstBatchWith is the index of the first batch that held request id.
func firstBatchWith(seen [][]byte, id byte) int {
	return slices.IndexFunc(seen, func(ids []byte) bool { return slices.Contains(ids, id) })
}

// A request of 20 steps yields after each of them: a small request sent
// while its first step runs runs in the next step, and it completes, every
// row in place.
func TestLargeRequestYieldsBetweenSteps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 4, stepTime: 100 * time.Millisecond}
		b := newBatcher(t, f, Options{})
		start := time.Now()
		out := make(chan result, 2)
		submit(context.Background(), b, req(1, 80), Params{}, start, out)
		synctest.Wait()
		submit(context.Background(), b, req(2, 1), Params{}, start, out)

		r := <-out
		require.NoError(t, r.err)
		assert.Equal(t, byte(2), r.id, "the small request is answered first")
		assert.Equal(t, 200*time.Millisecond, r.at, "after one step of the large one")
		r = <-out
		require.NoError(t, r.err, "every row of the large request was answered in place")
		assert.Equal(t, byte(1), r.id)
		assert.Equal(t, 2100*time.Millisecond, r.at, "21 steps: 81 rows of 4")

		seen := f.seen()
		assert.Equal(t, 1, firstBatchWith(seen, 2))
		assert.Equal(t, []byte{2, 1}, seen[1], "the large request fills the step's room")
		for i, rows := range f.rows {
			assert.LessOrEqual(t, rows, 4, "batch %d", i)
		}
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

// Two large requests take turns; a higher priority still goes first.
func TestLargeRequestsTakeTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 4, stepTime: 100 * time.Millisecond}
		b := newBatcher(t, f, Options{Policy: Policy{PriorityLevels: 2, DefaultPriority: 2}})
		start := time.Now()
		out := make(chan result, 3)
		submit(context.Background(), b, req(1, 12), Params{}, start, out)
		synctest.Wait()
		submit(context.Background(), b, req(2, 12), Params{}, start, out)
		synctest.Wait()
		submit(context.Background(), b, req(3, 8), Params{Priority: 1}, start, out)
		for range 3 {
			require.NoError(t, (<-out).err)
		}
		// 2 was formed while 1's first step ran; then 3 outranks both.
		assert.Equal(t, [][]byte{{1}, {2}, {3}, {3}, {1}, {2}, {1}, {2}}, f.seen())
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

// A large request whose client goes away stops at its next step boundary:
// its other steps never run, and the request that shared its last step is
// answered.
func TestLargeRequestStopsWhenItsClientGoes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 4, stepTime: 100 * time.Millisecond}
		b := newBatcher(t, f, Options{})
		start := time.Now()
		out := make(chan result, 2)
		ctx, cancel := context.WithCancel(context.Background())
		submit(ctx, b, req(1, 80), Params{}, start, out)
		synctest.Wait()
		submit(context.Background(), b, req(2, 1), Params{}, start, out) // shares step 2
		time.Sleep(150 * time.Millisecond)
		cancel() // during step 2

		got := map[byte]result{}
		for range 2 {
			r := <-out
			got[r.id] = r
		}
		require.NoError(t, got[2].err, "the request that shared its step is answered")
		assert.ErrorIs(t, got[1].err, context.Canceled)
		assert.Equal(t, 200*time.Millisecond, got[1].at, "stopped at the end of the step it was in")
		time.Sleep(time.Second)
		assert.Equal(t, [][]byte{{1}, {2, 1}}, f.seen(), "its remaining 18 steps never ran")
		assert.Zero(t, b.Depth())
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

// A large request whose deadline passes stops at its next step boundary, or
// at once if it is queued between its steps then.
func TestLargeRequestStopsAtItsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 4, stepTime: 100 * time.Millisecond}
		b := newBatcher(t, f, Options{})
		start := time.Now()
		err := b.Submit(context.Background(), req(1, 80), Params{Timeout: 250 * time.Millisecond})
		assert.ErrorIs(t, err, ErrDeadline)
		assert.EqualError(t, err, "batching: deadline passed after 250ms (timeout)")
		assert.Equal(t, 300*time.Millisecond, time.Since(start), "at the end of its third step")
		assert.Len(t, f.seen(), 3)

		// Queued behind other requests' steps when its deadline passes.
		out := make(chan result, 4)
		start = time.Now()
		submit(context.Background(), b, req(2, 80), Params{Timeout: 150 * time.Millisecond}, start, out)
		synctest.Wait()
		for id := byte(3); id < 6; id++ { // a step each, ahead of 2's next part
			submit(context.Background(), b, req(id, 4), Params{}, start, out)
			synctest.Wait()
		}
		r := <-out
		assert.Equal(t, byte(2), r.id)
		assert.ErrorIs(t, r.err, ErrDeadline)
		assert.Equal(t, 150*time.Millisecond, r.at, "answered at its deadline while queued")
		for range 3 {
			require.NoError(t, (<-out).err)
		}
		assert.Equal(t, [][]byte{{1}, {1}, {1}, {2}, {3}, {4}, {5}}, f.seen(), "2 ran one step")
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

// Shutdown lets a large request finish its steps; when the grace runs out,
// it stops at its next step boundary.
func TestDrainAndLargeRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 4, stepTime: 100 * time.Millisecond}
		b := newBatcher(t, f, Options{})
		start := time.Now()
		out := make(chan result, 1)
		submit(context.Background(), b, req(1, 20), Params{}, start, out)
		synctest.Wait()
		require.NoError(t, b.Shutdown(context.Background()))
		r := <-out
		require.NoError(t, r.err, "drain ran its remaining steps")
		assert.Equal(t, 500*time.Millisecond, r.at)

		f = &fakeRunner{max: 4, stepTime: 100 * time.Millisecond}
		b = newBatcher(t, f, Options{})
		start = time.Now()
		submit(context.Background(), b, req(2, 20), Params{}, start, out)
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		defer cancel()
		assert.ErrorIs(t, b.Shutdown(ctx), context.DeadlineExceeded)
		r = <-out
		assert.ErrorIs(t, r.err, ErrDraining)
		assert.Equal(t, 200*time.Millisecond, r.at, "at the end of the step running when the grace ran out")
		time.Sleep(time.Second)
		assert.Len(t, f.seen(), 2, "nothing runs after the grace")
	})
}

// A part of a large request fills the room MaxBatchElements leaves.
func TestLargeRequestPartsRespectMaxBatchElements(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 8}
		b := newBatcher(t, f, Options{Policy: Policy{MaxQueueDelay: 10 * time.Millisecond, MaxBatchElements: 100}})
		start := time.Now()
		out := make(chan result, 2)
		small, large := req(1, 1), req(2, 20)
		small.Elements, large.Elements = 40, 200 // 10 a row
		submit(context.Background(), b, small, Params{}, start, out)
		synctest.Wait()
		submit(context.Background(), b, large, Params{}, start, out)
		for range 2 {
			require.NoError(t, (<-out).err)
		}
		assert.Equal(t, []int{7, 8, 6}, f.rows, "1 + 6 rows of 10 elements fit 100, then 8 rows a step")
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

// Requests of every size, some cancelled and some with deadlines, from many
// goroutines: each is answered once, correctly when it succeeds; no step
// holds more than MaxBatch rows; and the queue ends empty.
func TestMixedSizesUnderCancelsAndDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 4, stepTime: 10 * time.Millisecond}
		b := newBatcher(t, f, Options{Policy: Policy{PriorityLevels: 2, DefaultPriority: 2, MaxQueueDelay: time.Millisecond}})
		start := time.Now()
		const n = 60
		out := make(chan result, n)
		for i := range n {
			ctx, cancel := context.WithCancel(context.Background())
			p := Params{Priority: 1 + i%2}
			if i%5 == 0 {
				p.Timeout = time.Duration(i) * 3 * time.Millisecond
			}
			submit(ctx, b, req(byte(i), 1+(i*7)%23), p, start, out)
			if i%4 == 0 {
				time.AfterFunc(time.Duration(i)*2*time.Millisecond, cancel)
			} else {
				defer cancel()
			}
			time.Sleep(time.Millisecond)
		}
		answered := map[byte]bool{}
		var ok, cancelled, late int
		for range n {
			r := <-out
			assert.False(t, answered[r.id], "request %d answered twice", r.id)
			answered[r.id] = true
			switch {
			case r.err == nil:
				ok++
			case errors.Is(r.err, context.Canceled):
				cancelled++
			case errors.Is(r.err, ErrDeadline):
				late++
			default:
				t.Errorf("request %d: %v", r.id, r.err)
			}
		}
		t.Logf("%d answered, %d cancelled, %d past their deadline, in %d steps", ok, cancelled, late, len(f.rows))
		assert.Positive(t, ok*cancelled*late, "every outcome was exercised")
		for i, rows := range f.rows {
			assert.LessOrEqual(t, rows, 4, "batch %d", i)
		}
		assert.Zero(t, b.Depth())
		require.NoError(t, b.Shutdown(context.Background()))
	})
}
