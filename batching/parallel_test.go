package batching

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/steps"
)

// parallelRunner is a fakeRunner that takes n batches at once (a model of
// n replicas), and records how many ran at once and, per request id, the
// first row each of its steps held.
type parallelRunner struct {
	*fakeRunner
	n int
	// fail makes the batches holding this request id fail.
	fail byte

	mu       sync.Mutex
	running  int
	most     int
	parts    map[byte][]int // request id -> the first row of each of its steps, in order
	together map[byte]int   // request id -> most steps of it at once
	inStep   map[byte]int
}

func newParallel(n, max int, stepTime time.Duration) *parallelRunner {
	return &parallelRunner{fakeRunner: &fakeRunner{max: max, stepTime: stepTime}, n: n,
		parts: map[byte][]int{}, together: map[byte]int{}, inStep: map[byte]int{}}
}

func (p *parallelRunner) Parallelism() int { return p.n }

func (p *parallelRunner) Run(ctx context.Context, reqs []*steps.Request) error {
	p.mu.Lock()
	p.running++
	p.most = max(p.most, p.running)
	fail := false
	for _, r := range reqs {
		id := r.Inputs[0][0] >> 4 // a large request's rows are id<<4 | row
		p.parts[id] = append(p.parts[id], int(r.Inputs[0][0]&15))
		p.inStep[id]++
		p.together[id] = max(p.together[id], p.inStep[id])
		fail = fail || (p.fail != 0 && id == p.fail)
	}
	p.mu.Unlock()
	err := p.fakeRunner.Run(ctx, reqs)
	p.mu.Lock()
	p.running--
	for _, r := range reqs {
		p.inStep[r.Inputs[0][0]>>4]--
	}
	p.mu.Unlock()
	if fail {
		return errors.New("this batch failed")
	}
	return err
}

// rowsReq is a request of rows rows whose row i holds id<<4 | i, so that a
// step's first row says which part of it ran.
func rowsReq(id byte, rows int) *steps.Request {
	in := make([]byte, rows)
	for i := range in {
		in[i] = id<<4 | byte(i)
	}
	return &steps.Request{Rows: rows, Inputs: [][]byte{in}, Outputs: [][]byte{make([]byte, rows)}}
}

// With a runner of two replicas, two batches run at once: four one-row
// requests in steps of 100ms, one per step, are all answered after two
// steps' time, not four.
func TestParallelRunnerRunsBatchesSideBySide(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newParallel(2, 1, 100*time.Millisecond)
		b, err := New(p, Options{})
		require.NoError(t, err)
		start := time.Now()
		out := make(chan result, 4)
		for i := range 4 {
			submit(context.Background(), b, req(byte(i+1), 1), Params{}, start, out)
		}
		var last time.Duration
		for range 4 {
			r := <-out
			require.NoError(t, r.err)
			last = max(last, r.at)
		}
		assert.Equal(t, 200*time.Millisecond, last, "two steps at a time")
		assert.Equal(t, 2, p.most, "never more batches at once than replicas")
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

// A request larger than a step runs its parts in order and one at a
// time, even while other batches run beside them; every row is answered
// in place.
func TestParallelRunnerKeepsALargeRequestsPartsInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newParallel(3, 4, 100*time.Millisecond)
		b, err := New(p, Options{})
		require.NoError(t, err)
		out := make(chan error, 8)
		large := rowsReq(1, 14)
		go func() { out <- b.Submit(context.Background(), large, Params{}) }()
		synctest.Wait()
		for i := range 6 {
			go func() { out <- b.Submit(context.Background(), rowsReq(byte(2+i), 1), Params{}) }()
		}
		for range 7 {
			require.NoError(t, <-out)
		}
		for i, v := range large.Outputs[0] {
			assert.Equal(t, large.Inputs[0][i]+100, v, "row %d", i)
		}
		assert.Equal(t, []int{0, 4, 8, 12}, p.parts[1], "its four parts, in order")
		assert.Equal(t, 1, p.together[1], "never two of its parts at once")
		assert.Greater(t, p.most, 1, "other batches ran beside it")
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

// A batch that fails answers its own requests with the error and no
// other: the batches beside it succeed, and every request is answered
// exactly once.
func TestParallelRunnerFailsOnlyTheFailedBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newParallel(2, 1, 100*time.Millisecond)
		p.fail = 3
		b, err := New(p, Options{})
		require.NoError(t, err)
		start := time.Now()
		out := make(chan result, 6)
		for i := range 6 {
			submit(context.Background(), b, rowsReq(byte(i+1), 1), Params{}, start, out)
		}
		answered := map[byte]error{}
		for range 6 {
			r := <-out
			_, twice := answered[r.id>>4]
			require.False(t, twice, "request %d answered twice", r.id>>4)
			answered[r.id>>4] = r.err
		}
		for id, err := range answered {
			if id == 3 {
				assert.ErrorContains(t, err, "this batch failed")
			} else {
				assert.NoError(t, err, "request %d", id)
			}
		}
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

// Shutdown returns once every batch in flight has ended, not only the
// last one handed over.
func TestParallelShutdownWaitsForEveryStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newParallel(2, 1, 100*time.Millisecond)
		b, err := New(p, Options{})
		require.NoError(t, err)
		start := time.Now()
		out := make(chan result, 3)
		for i := range 3 {
			submit(context.Background(), b, req(byte(i+1), 1), Params{}, start, out)
		}
		synctest.Wait()
		require.NoError(t, b.Shutdown(context.Background()))
		assert.Equal(t, 200*time.Millisecond, time.Since(start), "the queued one ran, and both of the last steps ended")
		p.mu.Lock()
		assert.Zero(t, p.running)
		p.mu.Unlock()
		for range 3 {
			require.NoError(t, (<-out).err)
		}
	})
}
