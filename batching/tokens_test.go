package batching

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/steps"
)

// seqReq is a request of rows rows of sequences seq long.
func seqReq(id byte, rows, seq int) *steps.Request {
	r := req(id, rows)
	r.Seq = seq
	return r
}

// gridPadded is the padded tokens of a step on a grid of batch buckets 1,
// 4, 16, 64 and seq buckets 32, 64, 128, as serving counts them.
func gridPadded(t *testing.T) func(rows, seq int) int {
	g, err := bucketing.NewGrid([]int{1, 4, 16, 64}, []int{32, 64, 128})
	require.NoError(t, err)
	return g.Padded
}

// submitAll queues the requests in order, each after the one before it,
// and waits for every answer.
func submitAll(t *testing.T, b *Batcher, reqs ...*steps.Request) {
	start := time.Now()
	out := make(chan result, len(reqs))
	for _, r := range reqs {
		submit(context.Background(), b, r, Params{}, start, out)
		synctest.Wait()
	}
	for range reqs {
		require.NoError(t, (<-out).err)
	}
}

// One long sequence among short ones: without a budget all ride in one
// batch padded to the long one's bucket; with max_batch_tokens the batch
// closes before the long one, which starts the next, and the short ones
// behind it wait for that one (FIFO).
func TestMaxBatchTokensClosesTheBatchBeforeALongRequest(t *testing.T) {
	for _, tc := range []struct {
		budget   int
		want     [][]byte
		deferred float64
	}{
		{0, [][]byte{{0, 1, 2, 9, 3, 4}}, 0},
		// 3 short rows: a 4x32 bucket (128 tokens); with the long one a
		// 4x128 bucket (512) would pass 256, and so would a short one
		// beside it: the long one runs alone (1x128), and the two short
		// ones behind it next (4x32).
		{256, [][]byte{{0, 1, 2}, {9}, {3, 4}}, 2},
	} {
		synctest.Test(t, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m, err := NewMetrics(reg)
			require.NoError(t, err)
			f := &fakeRunner{max: 64}
			b := newBatcher(t, f, Options{Model: "enc", Metrics: m, Padded: gridPadded(t),
				Policy: Policy{MaxQueueDelay: 10 * time.Millisecond, MaxBatchTokens: tc.budget}})
			submitAll(t, b, seqReq(0, 1, 10), seqReq(1, 1, 12), seqReq(2, 1, 9), seqReq(9, 1, 120), seqReq(3, 1, 8), seqReq(4, 1, 7))
			assert.Equal(t, tc.want, f.seen(), "budget %d", tc.budget)
			assert.Equal(t, tc.deferred, testutil.ToFloat64(m.deferrals.WithLabelValues("enc")), "each deferred request counted once")
			require.NoError(t, b.Shutdown(context.Background()))
		})
	}
}

// A request larger than the budget on its own still runs, alone.
func TestMaxBatchTokensRunsALargerRequestAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 64}
		b := newBatcher(t, f, Options{Padded: gridPadded(t), Policy: Policy{MaxQueueDelay: 10 * time.Millisecond, MaxBatchTokens: 128}})
		submitAll(t, b, seqReq(1, 4, 100), seqReq(2, 1, 5), seqReq(3, 1, 5))
		assert.Equal(t, [][]byte{{1}, {2, 3}}, f.seen(), "4x128 is over 128 tokens but runs; then two short rows in 4x32")
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

// A request larger than a step is taken as many rows a step as the budget
// allows.
func TestMaxBatchTokensBoundsTheParts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 64}
		b := newBatcher(t, f, Options{Padded: gridPadded(t), Policy: Policy{MaxQueueDelay: 10 * time.Millisecond, MaxBatchTokens: 16 * 128}})
		submitAll(t, b, seqReq(1, 100, 128))
		assert.Equal(t, []int{16, 16, 16, 16, 16, 16, 4}, f.rows, "16 rows of 128 tokens a step")
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

// Without sequences (seq 0) or without Padded the budget does not apply.
func TestMaxBatchTokensIgnoredWithoutSequences(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 8}
		b := newBatcher(t, f, Options{Padded: func(rows, seq int) int { return 1 << 30 },
			Policy: Policy{MaxQueueDelay: 10 * time.Millisecond, MaxBatchTokens: 1}})
		submitAll(t, b, req(1, 1), req(2, 1), req(3, 1))
		assert.Equal(t, [][]byte{{1, 2, 3}}, f.seen())
		require.NoError(t, b.Shutdown(context.Background()))
	})
}

func TestMaxBatchTokensPolicy(t *testing.T) {
	var p Policy
	require.NoError(t, p.Set("batching.max_batch_tokens", "8192"))
	assert.Equal(t, 8192, p.MaxBatchTokens)
	assert.EqualError(t, p.Set("batching.max_batch_tokens", "lots"), `batching.max_batch_tokens: "lots"; want an integer, 0 (no limit) or more, e.g. 8192`)
	p.MaxBatchTokens = -1
	assert.ErrorContains(t, p.WithDefaults().Validate(), `batching.max_batch_tokens: "-1"`)
}

// Queued requests that would pass the budget together form a batch at
// once: the budget makes it as full as it may be, and it does not wait out
// max_queue_delay.
func TestMaxBatchTokensFormsWithoutWaitingWhenOverBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeRunner{max: 64}
		b := newBatcher(t, f, Options{Padded: gridPadded(t), Policy: Policy{MaxQueueDelay: time.Hour, MaxBatchTokens: 256}})
		start := time.Now()
		out := make(chan result, 2)
		submit(context.Background(), b, seqReq(1, 1, 10), Params{}, start, out)
		synctest.Wait()
		submit(context.Background(), b, seqReq(2, 1, 120), Params{}, start, out)
		r := <-out
		require.NoError(t, r.err)
		assert.Equal(t, byte(1), r.id)
		assert.Zero(t, r.at, "formed as the long one arrived, not an hour later")
		assert.Equal(t, [][]byte{{1}}, f.seen())
		require.NoError(t, b.Shutdown(context.Background()))
		require.NoError(t, (<-out).err)
	})
}
