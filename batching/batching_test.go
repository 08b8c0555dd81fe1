package batching

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/steps"
)

// fakeRunner records which requests each batch held, its rows and when it
// started; each batch takes stepTime. It answers every row with its input
// plus 100.
type fakeRunner struct {
	max      int
	stepTime time.Duration
	err      error

	mu      sync.Mutex
	batches [][]byte // request ids per batch
	rows    []int    // rows per batch
	started []time.Time
	inline  []bool // whether the batch ran on a Submit's goroutine
}

func (f *fakeRunner) MaxBatch() int { return f.max }

func (f *fakeRunner) Run(ctx context.Context, reqs []*steps.Request) error {
	var ids []byte
	rows := 0
	for _, r := range reqs {
		ids = append(ids, r.Inputs[0][0])
		for i, v := range r.Inputs[0] {
			r.Outputs[0][i] = v + 100
		}
		rows += r.Rows
	}
	f.mu.Lock()
	f.batches = append(f.batches, ids)
	f.rows = append(f.rows, rows)
	f.started = append(f.started, time.Now())
	stack := make([]byte, 8<<10)
	stack = stack[:runtime.Stack(stack, false)]
	f.inline = append(f.inline, bytes.Contains(stack, []byte("batching.(*Batcher).Submit(")))
	f.mu.Unlock()
	time.Sleep(f.stepTime)
	return f.err
}

func (f *fakeRunner) seen() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]byte(nil), f.batches...)
}

// req is a request of rows rows, each one byte: id.
func req(id byte, rows int) *steps.Request {
	return &steps.Request{Rows: rows, Inputs: [][]byte{bytes.Repeat([]byte{id}, rows)}, Outputs: [][]byte{make([]byte, rows)}}
}

// result is one Submit's answer.
type result struct {
	id  byte
	err error
	at  time.Duration
}

// submit runs Submit in a goroutine and sends its answer to out.
func submit(ctx context.Context, b *Batcher, r *steps.Request, p Params, start time.Time, out chan<- result) {
	go func() {
		err := b.Submit(ctx, r, p)
		if err == nil && !bytes.Equal(r.Outputs[0], bytes.Repeat([]byte{r.Inputs[0][0] + 100}, r.Rows)) {
			err = errors.New("wrong output")
		}
		out <- result{r.Inputs[0][0], err, time.Since(start)}
	}()
}

func newBatcher(t *testing.T, f *fakeRunner, opts Options) *Batcher {
	b, err := New(f, opts)
	require.NoError(t, err)
	return b
}

func TestBatchFormedAtTheDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 8}
		b := newBatcher(t, f, Options{Policy: Policy{MaxQueueDelay: 10 * time.Millisecond}})
		start := time.Now()
		out := make(chan result, 3)
		for i := range 3 {
			submit(context.Background(), b, req(byte(i), 1), Params{}, start, out)
			time.Sleep(time.Millisecond)
		}
		for range 3 {
			r := <-out
			require.NoError(t, r.err)
			assert.Equal(t, 10*time.Millisecond, r.at, "answered when the oldest had waited max_queue_delay")
		}
		assert.Equal(t, [][]byte{{0, 1, 2}}, f.seen())
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

func TestBatchSentWhenItFillsTheLargestBucket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 4}
		b := newBatcher(t, f, Options{Policy: Policy{MaxQueueDelay: time.Second}})
		start := time.Now()
		out := make(chan result, 5)
		submit(context.Background(), b, req(1, 2), Params{}, start, out)
		synctest.Wait()
		submit(context.Background(), b, req(2, 2), Params{}, start, out)
		synctest.Wait()
		submit(context.Background(), b, req(3, 1), Params{}, start, out)
		for range 2 {
			r := <-out
			require.NoError(t, r.err)
			assert.Zero(t, r.at, "a full bucket runs at once")
		}
		r := <-out
		assert.Equal(t, byte(3), r.id)
		assert.Equal(t, time.Second, r.at)
		assert.Equal(t, [][]byte{{1, 2}, {3}}, f.seen())
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

func TestPriorityOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 1, stepTime: 100 * time.Millisecond}
		b := newBatcher(t, f, Options{Policy: Policy{PriorityLevels: 3, DefaultPriority: 2}})
		start := time.Now()
		out := make(chan result, 4)
		submit(context.Background(), b, req(1, 1), Params{}, start, out) // runs first
		synctest.Wait()
		submit(context.Background(), b, req(2, 1), Params{Priority: 3}, start, out)
		synctest.Wait()
		submit(context.Background(), b, req(3, 1), Params{}, start, out) // default level 2
		synctest.Wait()
		submit(context.Background(), b, req(4, 1), Params{Priority: 1}, start, out)
		for range 4 {
			require.NoError(t, (<-out).err)
		}
		// The next batch is formed while a step runs, so 2 is taken as soon
		// as it arrives; after that, priority decides.
		seen := f.seen()
		require.Len(t, seen, 4)
		assert.Equal(t, []byte{1}, seen[0])
		assert.Equal(t, []byte{2}, seen[1], "formed while 1 ran, before the others arrived")
		assert.Equal(t, []byte{4}, seen[2], "priority 1 before the default level")
		assert.Equal(t, []byte{3}, seen[3])

		require.NoError(t, b.Shutdown(context.Background()))
	})
}

// A level the model does not have is the default level, as in Triton:
// not an error.
func TestPriorityOutOfRangeTakesTheDefaultLevel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 1, stepTime: 100 * time.Millisecond}
		b := newBatcher(t, f, Options{Policy: Policy{PriorityLevels: 3, DefaultPriority: 2}})
		start := time.Now()
		out := make(chan result, 4)
		submit(context.Background(), b, req(1, 1), Params{}, start, out) // runs first
		synctest.Wait()
		submit(context.Background(), b, req(2, 1), Params{Priority: 3}, start, out) // formed while 1 runs
		synctest.Wait()
		submit(context.Background(), b, req(3, 1), Params{Priority: 3}, start, out)
		synctest.Wait()
		submit(context.Background(), b, req(4, 1), Params{Priority: 9}, start, out) // level 2, the default
		for range 4 {
			require.NoError(t, (<-out).err)
		}
		assert.Equal(t, [][]byte{{1}, {2}, {4}, {3}}, f.seen())
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

func TestTimeoutAnsweredAtTheDeadlineWhileAStepRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 1, stepTime: 100 * time.Millisecond}
		b := newBatcher(t, f, Options{Policy: Policy{DefaultTimeout: time.Second}})
		start := time.Now()
		out := make(chan result, 3)
		submit(context.Background(), b, req(1, 1), Params{}, start, out)
		synctest.Wait()
		submit(context.Background(), b, req(2, 1), Params{}, start, out) // formed, waits for the runner
		synctest.Wait()
		submit(context.Background(), b, req(3, 1), Params{Timeout: 20 * time.Millisecond}, start, out)
		r := <-out
		assert.Equal(t, byte(3), r.id)
		assert.ErrorIs(t, r.err, ErrDeadline)
		assert.Equal(t, 20*time.Millisecond, r.at, "answered at its deadline, not after the step")
		require.NoError(t, (<-out).err)
		require.NoError(t, (<-out).err)
		assert.Equal(t, [][]byte{{1}, {2}}, f.seen(), "the timed-out request never reached the runner")

		// A longer per-request timeout cannot raise the model's default.
		f.stepTime = 5 * time.Second
		submit(context.Background(), b, req(4, 1), Params{}, start, out)
		synctest.Wait()
		t0 := time.Now()
		err := b.Submit(context.Background(), req(5, 1), Params{Timeout: time.Hour})
		assert.ErrorIs(t, err, ErrDeadline)
		assert.Equal(t, time.Second, time.Since(t0))
		<-out
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

func TestCancelledRequestIsDroppedBeforeBatching(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 1, stepTime: 100 * time.Millisecond}
		b := newBatcher(t, f, Options{})
		start := time.Now()
		out := make(chan result, 3)
		submit(context.Background(), b, req(1, 1), Params{}, start, out)
		synctest.Wait()
		submit(context.Background(), b, req(2, 1), Params{}, start, out)
		synctest.Wait()
		ctx, cancel := context.WithCancel(context.Background())
		submit(ctx, b, req(3, 1), Params{}, start, out)
		time.Sleep(10 * time.Millisecond)
		cancel()
		r := <-out
		assert.Equal(t, byte(3), r.id)
		assert.ErrorIs(t, r.err, context.Canceled)
		assert.Equal(t, 10*time.Millisecond, r.at)
		<-out
		<-out
		assert.Equal(t, [][]byte{{1}, {2}}, f.seen())
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

func TestQueueFullRejectsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		m, err := NewMetrics(reg)
		require.NoError(t, err)
		f := &fakeRunner{max: 1, stepTime: time.Second}
		b := newBatcher(t, f, Options{Model: "m", Policy: Policy{MaxQueueSize: 2}, Metrics: m})
		start := time.Now()
		out := make(chan result, 4)
		submit(context.Background(), b, req(1, 1), Params{}, start, out) // running
		synctest.Wait()
		submit(context.Background(), b, req(2, 1), Params{}, start, out) // formed
		submit(context.Background(), b, req(3, 1), Params{}, start, out) // queued
		synctest.Wait()
		assert.Equal(t, 2.0, testutil.ToFloat64(m.queueDepth.WithLabelValues("m")))
		t0 := time.Now()
		err = b.Submit(context.Background(), req(4, 1), Params{})
		assert.ErrorIs(t, err, ErrQueueFull)
		assert.Zero(t, time.Since(t0), "a full queue answers at once")
		for range 3 {
			require.NoError(t, (<-out).err)
		}
		assert.Equal(t, 0.0, testutil.ToFloat64(m.queueDepth.WithLabelValues("m")))
		require.NoError(t, b.Shutdown(context.Background()))
		n, err := testutil.GatherAndCount(reg, "stepserve_queue_duration_seconds")
		require.NoError(t, err)
		assert.Equal(t, 1, n)
		m.Forget("m")
		n, _ = testutil.GatherAndCount(reg, "stepserve_queue_duration_seconds", "stepserve_queue_depth")
		assert.Zero(t, n, "unloading deletes the series")
	})
}

func TestDrainAnswersEveryRequestExactlyOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 2, stepTime: 10 * time.Millisecond}
		b := newBatcher(t, f, Options{Policy: Policy{MaxQueueDelay: time.Hour}})
		start := time.Now()
		out := make(chan result, 10)
		for i := range 7 {
			submit(context.Background(), b, req(byte(i), 1), Params{}, start, out)
		}
		synctest.Wait()
		require.NoError(t, b.Shutdown(context.Background()))
		assert.ErrorIs(t, b.Submit(context.Background(), req(99, 1), Params{}), ErrDraining)
		for range 7 {
			require.NoError(t, (<-out).err, "drain runs queued batches without waiting for the delay")
		}
		assert.Len(t, f.seen(), 4)
		select {
		case r := <-out:
			t.Fatalf("request %d answered twice", r.id)
		default:
		}
	})
}

func TestDrainGraceRunsOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 1, stepTime: 100 * time.Millisecond}
		b := newBatcher(t, f, Options{})
		start := time.Now()
		out := make(chan result, 5)
		for i := range 5 {
			submit(context.Background(), b, req(byte(i), 1), Params{}, start, out)
			synctest.Wait()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		defer cancel()
		assert.ErrorIs(t, b.Shutdown(ctx), context.DeadlineExceeded)

		var ok, draining int
		for range 5 {
			r := <-out
			switch {
			case r.err == nil:
				ok++
			case errors.Is(r.err, ErrDraining):
				draining++
				assert.Equal(t, 150*time.Millisecond, r.at, "left-overs are answered when the grace ends")
			default:
				t.Fatalf("request %d: %v", r.id, r.err)
			}
		}
		// Two batches ran in the grace; the one running at its end finishes.
		assert.Equal(t, 2, ok)
		assert.Equal(t, 3, draining)
		time.Sleep(time.Second)
		assert.Len(t, f.seen(), 2, "nothing runs after the grace")
	})
}

func TestBatchErrorReachesEveryRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 4, err: errors.New("engine failed")}
		b := newBatcher(t, f, Options{Policy: Policy{MaxQueueDelay: time.Millisecond}})
		start := time.Now()
		out := make(chan result, 2)
		submit(context.Background(), b, req(1, 1), Params{}, start, out)
		submit(context.Background(), b, req(2, 1), Params{}, start, out)
		assert.ErrorContains(t, (<-out).err, "engine failed")
		assert.ErrorContains(t, (<-out).err, "engine failed")
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

func TestMaxBatchElements(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 8}
		b := newBatcher(t, f, Options{Policy: Policy{MaxQueueDelay: 10 * time.Millisecond, MaxBatchElements: 100}})
		start := time.Now()
		out := make(chan result, 3)
		for i := range 3 {
			r := req(byte(i), 1)
			r.Elements = 40
			submit(context.Background(), b, r, Params{}, start, out)
			synctest.Wait()
		}
		for range 3 {
			require.NoError(t, (<-out).err)
		}
		assert.Equal(t, [][]byte{{0, 1}, {2}}, f.seen(), "the third request would pass 100 elements")
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

func TestNewValidatesThePolicy(t *testing.T) {
	f := &fakeRunner{max: 1}
	_, err := New(f, Options{Model: "m", Policy: Policy{PriorityLevels: 2, DefaultPriority: 3}})
	var pe *PolicyError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "batching.default_priority_level", pe.Key)
	assert.EqualError(t, err, `batching: model m: batching.default_priority_level: "3"; want an integer in 1..2 (batching.priority_levels), or 0 for the lowest level`)

	_, err = New(f, Options{Policy: Policy{MaxQueueSize: -1}})
	assert.ErrorContains(t, err, `batching.max_queue_size: "-1"`)
}

// A request that finds the model idle runs at once (on its own goroutine);
// what arrives during its step waits and runs next as one batch; Shutdown
// waits for such a step too.
func TestIdleModelRunsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 4, stepTime: 100 * time.Millisecond}
		b := newBatcher(t, f, Options{})
		start := time.Now()
		out := make(chan result, 8)
		submit(context.Background(), b, req(1, 1), Params{}, start, out)
		synctest.Wait()
		assert.Equal(t, [][]byte{{1}}, f.seen(), "running before anything else arrived")
		for id := byte(2); id <= 5; id++ {
			submit(context.Background(), b, req(id, 1), Params{}, start, out)
			synctest.Wait()
		}
		got := map[byte]time.Duration{}
		for range 5 {
			r := <-out
			require.NoError(t, r.err)
			got[r.id] = r.at
		}
		assert.Equal(t, map[byte]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond,
			3: 200 * time.Millisecond, 4: 200 * time.Millisecond, 5: 200 * time.Millisecond}, got)
		assert.Equal(t, [][]byte{{1}, {2, 3, 4, 5}}, f.seen())
		f.mu.Lock()
		assert.Equal(t, []bool{true, false}, f.inline, "the idle request ran on its own goroutine, the batch on the batcher's")
		f.mu.Unlock()

		submit(context.Background(), b, req(6, 1), Params{}, start, out)
		synctest.Wait()
		require.NoError(t, b.Shutdown(context.Background()))
		assert.Equal(t, 300*time.Millisecond, time.Since(start), "Shutdown waited for the running step")
		r := <-out
		require.NoError(t, r.err)
		assert.Equal(t, byte(6), r.id)
	})
}
