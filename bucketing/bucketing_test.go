package bucketing

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestChooseSmallestBucketThatHolds(t *testing.T) {
	g, err := NewGrid([]int{1, 4, 16, 32})
	require.NoError(t, err)
	for rows, want := range map[int]int{1: 0, 2: 1, 4: 1, 5: 2, 16: 2, 17: 3, 32: 3} {
		got, ok := g.Choose(rows)
		assert.True(t, ok, "rows %d", rows)
		assert.Equal(t, want, got, "rows %d", rows)
	}
	for _, rows := range []int{0, 33, -1} {
		_, ok := g.Choose(rows)
		assert.False(t, ok, "rows %d", rows)
	}
}

func TestNextSplitsAcrossSteps(t *testing.T) {
	g, err := NewGrid([]int{1, 4, 16})
	require.NoError(t, err)
	var steps []Shape
	for remaining := 37; remaining > 0; {
		rows, b := g.Next(remaining)
		steps = append(steps, g.Shapes()[b])
		remaining -= rows
	}
	// 37 = 16 + 16 + 5, and 5 rows pad to the 16 bucket.
	assert.Equal(t, []Shape{{Batch: 16}, {Batch: 16}, {Batch: 16}}, steps)

	rows, b := g.Next(3)
	assert.Equal(t, 3, rows)
	assert.Equal(t, Shape{Batch: 4}, g.Shapes()[b])
}

func TestNewGridRejectsBadSizes(t *testing.T) {
	for _, bad := range [][]int{nil, {0}, {4, 2}, {2, 2}, {-1, 4}} {
		_, err := NewGrid(bad)
		assert.Error(t, err, "%v", bad)
	}
}

func TestLabelsAndPadding(t *testing.T) {
	assert.Equal(t, "b16", Shape{Batch: 16}.Label())
	assert.Equal(t, "b16xs128", Shape{Batch: 16, Seq: 128}.Label())
	assert.InDelta(t, 0.75, PaddingRatio(4, Shape{Batch: 16}), 1e-12)
	assert.Zero(t, PaddingRatio(16, Shape{Batch: 16}))
}
