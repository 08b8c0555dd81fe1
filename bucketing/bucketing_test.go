package bucketing

import (
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
	assert.Equal(t, []Shape{{1, 32}, {1, 64}, {1, 128}, {4, 32}, {4, 64}, {4, 128}}, g.Shapes())
	assert.Equal(t, 128, g.MaxSeq())
	for _, tc := range []struct {
		rows, seq int
		want      Shape
	}{
		{1, 1, Shape{1, 32}}, {1, 33, Shape{1, 64}}, {2, 64, Shape{4, 64}}, {4, 128, Shape{4, 128}},
	} {
		i, ok := g.Choose(tc.rows, tc.seq)
		require.True(t, ok)
		assert.Equal(t, tc.want, g.Shapes()[i], "%d rows of %d", tc.rows, tc.seq)
	}
	_, ok := g.Choose(1, 129)
	assert.False(t, ok)
	_, ok = g.Choose(1, 0)
	assert.False(t, ok)
	assert.InDelta(t, 1-float64(3*20)/float64(4*32), PaddingRatio(3*20, Shape{4, 32}), 1e-12)
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
	for _, bad := range [][]int{nil, {0}, {4, 2}, {2, 2}, {-1, 4}} {
		_, err := NewGrid(bad, nil)
		assert.Error(t, err, "%v", bad)
	}
	_, err := NewGrid([]int{1}, []int{64, 32})
	assert.ErrorContains(t, err, "sequence lengths [64 32] must be strictly increasing")
}

func TestLabelsAndPadding(t *testing.T) {
	assert.Equal(t, "b16", Shape{Batch: 16}.Label())
	assert.Equal(t, "b16xs128", Shape{Batch: 16, Seq: 128}.Label())
	assert.InDelta(t, 0.75, PaddingRatio(4, Shape{Batch: 16}), 1e-12)
	assert.Zero(t, PaddingRatio(16, Shape{Batch: 16}))
}
