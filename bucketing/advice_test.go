package bucketing

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// record returns a Traffic holding the given steps, all at one moment.
func record(maxBatch, maxSeq int, steps [][2]int) *Traffic {
	t := NewTraffic(maxBatch, maxSeq, time.Hour)
	now := time.Unix(1e9, 0)
	for _, s := range steps {
		t.Record(s[0], s[1], s[0]*max(s[1], 1), now)
	}
	return t
}

// subsets calls f with every ascending list of at most k sizes from cand
// that ends with last.
func subsets(cand []int, last, k int, f func([]int)) {
	var rest []int
	for _, c := range cand {
		if c < last {
			rest = append(rest, c)
		}
	}
	for mask := 0; mask < 1<<len(rest); mask++ {
		var l []int
		for i, c := range rest {
			if mask&(1<<i) != 0 {
				l = append(l, c)
			}
		}
		if len(l)+1 <= k {
			f(append(l, last))
		}
	}
}

// TestAdviseBatchIsTheOptimum feeds known distributions of batch sizes and
// checks the advice against the best of every allowed list, tried one by
// one.
func TestAdviseBatchIsTheOptimum(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		maxBatch := 2 + rng.IntN(15)
		var steps [][2]int
		for range 1 + rng.IntN(60) {
			// skewed: most steps small, a few large
			r := 1 + int(float64(maxBatch)*math.Pow(rng.Float64(), 2.5))
			steps = append(steps, [2]int{min(r, maxBatch), 0})
		}
		h := record(maxBatch, 0, steps).Snapshot()
		k := 1 + rng.IntN(5)
		a, err := Advise(h, []int{maxBatch}, nil, k)
		require.NoError(t, err)
		best := math.Inf(1)
		subsets(h.Rows, h.MaxRows, k, func(l []int) { best = min(best, work(h, l, nil)) })
		got := work(h, a.Batch, nil)
		assert.InDelta(t, best, got, 1e-9*best, "trial %d: advised %v", trial, a.Batch)
		assert.LessOrEqual(t, len(a.Batch), k)
		assert.Equal(t, h.MaxRows, a.Batch[len(a.Batch)-1], "the largest bucket is the largest batch seen")
		assert.True(t, a.Exact)
	}
}

func TestAdviseSkewedBatches(t *testing.T) {
	// Steps of 5 and 6 rows in a [1, 4, 16, 32] grid run in the 16
	// bucket: most of the work is padding. With three buckets, 5 and 6
	// each get one (the lone 1-row step rides in the 5), and 20 stays the
	// largest.
	var steps [][2]int
	for range 90 {
		steps = append(steps, [2]int{5, 0}, [2]int{6, 0})
	}
	steps = append(steps, [2]int{1, 0}, [2]int{20, 0})
	a, err := Advise(record(32, 0, steps).Snapshot(), []int{1, 4, 16, 32}, nil, 3)
	require.NoError(t, err)
	assert.Equal(t, []int{5, 6, 20}, a.Batch)
	assert.Greater(t, a.PaddingNow, 0.5)
	assert.Less(t, a.PaddingAdvised, 0.1)
	assert.Less(t, a.WorkRatio, 0.5)
	assert.Equal(t, "buckets:\n  batch: [5, 6, 20]\n", a.YAML)
}

// TestAdviseGridAgainstBruteForce checks the two-dimensional search against
// every grid of at most K programs on small records: never worse than the
// current grid, and at the optimum on most records (it is a local search).
func TestAdviseGridAgainstBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	optimal, trials := 0, 150
	worst := 1.0
	for trial := range trials {
		maxBatch, maxSeq := 2+rng.IntN(7), 32*(2+rng.IntN(5))
		var steps [][2]int
		for range 1 + rng.IntN(50) {
			r := 1 + int(float64(maxBatch)*math.Pow(rng.Float64(), 2))
			s := 1 + int(float64(maxSeq)*math.Pow(rng.Float64(), 1.5))
			steps = append(steps, [2]int{min(r, maxBatch), min(s, maxSeq)})
		}
		h := record(maxBatch, maxSeq, steps).Snapshot()
		curB, curS := []int{maxBatch}, []int{maxSeq}
		k := 1 + rng.IntN(8)
		a, err := Advise(h, curB, curS, k)
		require.NoError(t, err)
		got := work(h, a.Batch, a.Seq)
		assert.LessOrEqual(t, a.Programs, k)
		assert.LessOrEqual(t, got, work(h, curB, curS)*(1+1e-12))
		assert.Equal(t, maxSeq, a.Seq[len(a.Seq)-1], "the longest accepted text stays accepted")
		var rows, seqs []int
		for i, r := range h.Rows {
			if slices.ContainsFunc(h.Weight[i], func(w float64) bool { return w > 0 }) {
				rows = append(rows, r)
			}
		}
		seqs = append(seqs, h.Seq...)
		best := math.Inf(1)
		for kb := 1; kb <= k; kb++ {
			subsets(rows, h.MaxRows, kb, func(b []int) {
				subsets(seqs, maxSeq, k/len(b), func(s []int) { best = min(best, work(h, b, s)) })
			})
		}
		if got <= best*(1+1e-9) {
			optimal++
		}
		worst = max(worst, got/best)
		_ = trial
	}
	t.Logf("two-dimensional search: optimal on %d of %d records, at most %.3fx the optimum", optimal, trials, worst)
	assert.GreaterOrEqual(t, optimal, trials*8/10)
	assert.Less(t, worst, 1.25)
}

func TestTrafficDecays(t *testing.T) {
	tr := NewTraffic(8, 0, time.Minute)
	t0 := time.Unix(1e9, 0)
	for range 100 {
		tr.Record(8, 0, 8, t0)
	}
	// An hour later the 8-row steps weigh 2^-60: the new 2-row steps are
	// the traffic.
	for range 10 {
		tr.Record(2, 0, 2, t0.Add(time.Hour))
	}
	h := tr.Snapshot()
	assert.InDelta(t, 10, h.Weight[1][0], 1e-9)
	assert.InDelta(t, 100*math.Pow(2, -60), h.Weight[7][0], 1e-20)
	assert.Equal(t, int64(110), h.Steps)
	a, err := Advise(h, []int{8}, nil, 2)
	require.NoError(t, err)
	assert.Equal(t, []int{2, 8}, a.Batch)

	// Far later (many half-lives: the weights are rescaled, not overflowed).
	for i := range 5 {
		tr.Record(3, 0, 3, t0.Add(time.Duration(i+2)*1000*time.Hour))
	}
	h = tr.Snapshot()
	assert.InDelta(t, 1, h.Weight[2][0], 1e-9)
	assert.False(t, math.IsNaN(h.Used) || math.IsInf(h.Used, 0))
}

func TestTrafficMemoryIsBounded(t *testing.T) {
	tr := NewTraffic(1<<16, 8192, 0)
	assert.LessOrEqual(t, len(tr.w), maxRowBins*8192/32)
	tr.Record(1<<16, 8192, 1, time.Now())
	tr.Record(1<<20, 1<<20, 1, time.Now()) // clamped, not a panic
	h := tr.Snapshot()
	assert.Equal(t, 1<<16, h.Rows[len(h.Rows)-1])
}

func TestAdviseWithoutTraffic(t *testing.T) {
	_, err := Advise(NewTraffic(8, 0, 0).Snapshot(), []int{8}, nil, 2)
	assert.ErrorContains(t, err, "no traffic recorded yet")
	_, err = Advise(record(8, 0, [][2]int{{1, 0}}).Snapshot(), []int{8}, nil, 0)
	assert.ErrorContains(t, err, "max_buckets: 0; want at least 1")
}

func TestAdviseContexts(t *testing.T) {
	now := time.Now()
	tr := NewContextTraffic(16, 1024, 16, 0)
	for i := range 300 {
		tr.Record(1+i%4, 40+i%60, (1+i%4)*(40+i%60), now) // short conversations
	}
	for range 20 {
		tr.Record(2, 900, 1800, now) // a few long ones
	}
	batch, current := []int{4, 16}, []int{128, 512, 1024}
	a, err := AdviseContexts(tr.Snapshot(), batch, current, 16, 6)
	require.NoError(t, err)
	assert.Equal(t, batch, a.Batch, "the batch list stays: prefill buckets share it")
	assert.Equal(t, current, a.CurrentContext)
	assert.LessOrEqual(t, len(a.Context), 3)
	assert.Equal(t, 1024, a.Context[len(a.Context)-1], "max_model_len's partition stays")
	assert.Less(t, a.Context[0], 128, "the short conversations get a partition of their own size")
	for _, c := range a.Context {
		assert.Zero(t, c%16, "%d: a multiple of the block size", c)
	}
	assert.Less(t, a.PaddingAdvised, a.PaddingNow)
	assert.Less(t, a.WorkRatio, 1.0)
	assert.Equal(t, 2*len(a.Context), a.Programs)
	assert.Contains(t, a.YAML, "context: [")

	// One partition a batch size: max_model_len's alone.
	a, err = AdviseContexts(tr.Snapshot(), batch, current, 16, 2)
	require.NoError(t, err)
	assert.Equal(t, []int{1024}, a.Context)

	_, err = AdviseContexts(tr.Snapshot(), batch, current, 16, 1)
	assert.ErrorContains(t, err, "want at least 2")
	_, err = AdviseContexts(NewContextTraffic(16, 1024, 16, 0).Snapshot(), batch, current, 16, 6)
	assert.ErrorIs(t, err, ErrNoTraffic)

	// A budget past 16 partitions a batch size advises 16 at most.
	wide := NewContextTraffic(1, 4096, 16, 0)
	for c := 16; c <= 4096; c += 16 {
		wide.Record(1, c, c, now)
	}
	a, err = AdviseContexts(wide.Snapshot(), []int{1}, []int{4096}, 16, 4096)
	require.NoError(t, err)
	assert.Len(t, a.Context, MaxContexts)
}

// Partitions that are the best already come back as they are, whatever
// the block size: not rounded to another unit.
func TestAdviseContextsKeepsExactPartitions(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		block   int
		current []int
		seen    [2]int // contexts recorded, from and to
	}{
		{16, []int{144, 1024}, [2]int{130, 144}},
		{16, []int{48, 1024}, [2]int{33, 48}},
		{48, []int{144, 576, 1008}, [2]int{100, 140}},
	} {
		full := tc.current[len(tc.current)-1]
		tr := NewContextTraffic(4, full, tc.block, 0)
		for c := tc.seen[0]; c <= tc.seen[1]; c++ {
			tr.Record(4, c, 4*c, now)
		}
		tr.Record(4, full, 4*full, now)
		a, err := AdviseContexts(tr.Snapshot(), []int{4}, tc.current, tc.block, 2)
		require.NoError(t, err)
		assert.Equal(t, []int{tc.current[0], full}, a.Context, "block %d, %v", tc.block, tc.current)
		for _, c := range a.Context {
			assert.Zero(t, c%tc.block, "%d: a multiple of the block size", c)
		}
	}
}
