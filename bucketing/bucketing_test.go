package bucketing

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestChooseSmallestBucketThatHolds(t *testing.T) {
	g, err := NewGrid([]int{1, 4, 16, 32}, nil)
	require.NoError(t, err)
	for rows, want := range map[int]int{1: 0, 2: 1, 4: 1, 5: 2, 16: 2, 17: 3, 32: 3} {
		got, ok := g.Choose(rows, 0)
		assert.True(t, ok, "rows %d", rows)
		assert.Equal(t, want, got, "rows %d", rows)
	}
	for _, rows := range []int{0, 33, -1} {
		_, ok := g.Choose(rows, 0)
		assert.False(t, ok, "rows %d", rows)
	}
}

func TestChooseInTwoDimensions(t *testing.T) {
	g, err := NewGrid([]int{1, 4}, []int{32, 64, 128})
	require.NoError(t, err)
	assert.Equal(t, []Shape{{Batch: 1, Seq: 32}, {Batch: 1, Seq: 64}, {Batch: 1, Seq: 128}, {Batch: 4, Seq: 32}, {Batch: 4, Seq: 64}, {Batch: 4, Seq: 128}}, g.Shapes())
	assert.Equal(t, 128, g.MaxSeq())
	for _, tc := range []struct {
		rows, seq int
		want      Shape
	}{
		{1, 1, Shape{Batch: 1, Seq: 32}}, {1, 33, Shape{Batch: 1, Seq: 64}}, {2, 64, Shape{Batch: 4, Seq: 64}}, {4, 128, Shape{Batch: 4, Seq: 128}},
	} {
		i, ok := g.Choose(tc.rows, tc.seq)
		require.True(t, ok)
		assert.Equal(t, tc.want, g.Shapes()[i], "%d rows of %d", tc.rows, tc.seq)
	}
	_, ok := g.Choose(1, 129)
	assert.False(t, ok)
	_, ok = g.Choose(1, 0)
	assert.False(t, ok)
	assert.InDelta(t, 1-float64(3*20)/float64(4*32), PaddingRatio(3*20, Shape{Batch: 4, Seq: 32}), 1e-12)
}

func TestNextSplitsAcrossSteps(t *testing.T) {
	g, err := NewGrid([]int{1, 4, 16}, nil)
	require.NoError(t, err)
	var steps []Shape
	for remaining := 37; remaining > 0; {
		rows := g.Next(remaining)
		b, _ := g.Choose(rows, 0)
		steps = append(steps, g.Shapes()[b])
		remaining -= rows
	}
	// 37 = 16 + 16 + 5, and 5 rows pad to the 16 bucket.
	assert.Equal(t, []Shape{{Batch: 16}, {Batch: 16}, {Batch: 16}}, steps)

	assert.Equal(t, 3, g.Next(3))
}

func TestNewGridRejectsBadSizes(t *testing.T) {
	for _, bad := range [][]int{nil, {0}, {4, 2}, {2, 2}, {-1, 4}, {1, 65537}} {
		_, err := NewGrid(bad, nil)
		assert.Error(t, err, "%v", bad)
	}
	_, err := NewGrid([]int{1}, []int{64, 32})
	assert.EqualError(t, err, "bucketing: buckets.seq: [64 32] must be strictly increasing")
	_, err = NewGrid([]int{1}, []int{48})
	assert.ErrorContains(t, err, "bucketing: buckets.seq: 48 is not a multiple of 32")
}

// The rules model.yaml's buckets are checked by, and the messages a user
// reads.
func TestValidateBucketLists(t *testing.T) {
	for _, tc := range []struct {
		batch, seq []int
		want       string // "" for valid
	}{
		{[]int{1, 4, 16}, nil, ""},
		{[]int{1, 65536}, []int{32, 64, 512}, ""},
		{nil, nil, "buckets.batch: is required; list the batch sizes to compile, e.g. [1, 4, 16, 32]"},
		{[]int{0, 2}, nil, "buckets.batch: 0 is not a valid batch size; want 1..65536"},
		{[]int{1, 65537}, nil, "buckets.batch: 65537 is not a valid batch size; want 1..65536"},
		{[]int{1, 8, 2}, nil, "buckets.batch: [1 8 2] must be strictly increasing"},
		{[]int{2, 2}, nil, "buckets.batch: [2 2] must be strictly increasing"},
		{[]int{1}, []int{32, 48}, "buckets.seq: 48 is not a multiple of 32: the NPU's fused attention kernel needs query lengths in multiples of 32 (execution semantics, alignment rules); use e.g. [32, 64, 128]"},
		{[]int{1}, []int{0}, "buckets.seq: 0 is not a multiple of 32"},
		{[]int{1}, []int{-32}, "buckets.seq: -32 is not a multiple of 32"},
		{[]int{1}, []int{64, 32}, "buckets.seq: [64 32] must be strictly increasing"},
		{[]int{1}, []int{32, 32}, "buckets.seq: [32 32] must be strictly increasing"},
	} {
		err := errors.Join(ValidateBatch(tc.batch), ValidateSeq(tc.seq))
		if tc.want == "" {
			assert.NoError(t, err, "%v %v", tc.batch, tc.seq)
			continue
		}
		assert.ErrorContains(t, err, tc.want, "%v %v", tc.batch, tc.seq)
	}
}

func TestLabelsAndPadding(t *testing.T) {
	assert.Equal(t, "b16", Shape{Batch: 16}.Label())
	assert.Equal(t, "b16xs128", Shape{Batch: 16, Seq: 128}.Label())
	assert.InDelta(t, 0.75, PaddingRatio(4, Shape{Batch: 16}), 1e-12)
	assert.Zero(t, PaddingRatio(16, Shape{Batch: 16}))
}
