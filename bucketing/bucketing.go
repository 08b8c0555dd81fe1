// Package bucketing owns shape buckets: the grid of fixed shapes a model is
// compiled for, the choice of the smallest bucket that holds a batch, the
// split of a batch too large for any bucket into steps, and the padding and
// unpadding of rows in packed buffers.
//
// Every distinct shape is a separately compiled program on the device, so no
// request shape reaches an engine unbucketed. The package knows nothing of
// requests, HTTP or engines.
package bucketing

import (
	"fmt"
	"slices"
)

// Shape is one bucket: a batch size and, for sequence models, a sequence
// length (0 for models without one).
type Shape struct {
	Batch int
	Seq   int
}

// Label is the bucket's metric label: "b16", or "b16xs128" for sequence
// models.
func (s Shape) Label() string {
	if s.Seq == 0 {
		return fmt.Sprintf("b%d", s.Batch)
	}
	return fmt.Sprintf("b%dxs%d", s.Batch, s.Seq)
}

func (s Shape) String() string { return s.Label() }

// Grid is the set of buckets of one model: every batch size, crossed with
// every sequence length when there are any.
type Grid struct {
	batch  []int
	shapes []Shape
}

// NewGrid checks the batch sizes (positive, strictly increasing) and builds
// the grid.
func NewGrid(batch []int) (*Grid, error) {
	if len(batch) == 0 {
		return nil, fmt.Errorf("bucketing: no batch sizes; want at least one, e.g. [1, 4, 16]")
	}
	for i, b := range batch {
		if b <= 0 {
			return nil, fmt.Errorf("bucketing: batch size %d must be positive", b)
		}
		if i > 0 && b <= batch[i-1] {
			return nil, fmt.Errorf("bucketing: batch sizes %v must be strictly increasing", batch)
		}
	}
	g := &Grid{batch: slices.Clone(batch)}
	for _, b := range batch {
		g.shapes = append(g.shapes, Shape{Batch: b})
	}
	return g, nil
}

// Shapes lists the buckets; a bucket's index in this list is how engines and
// steps refer to it. The caller must not modify the result.
func (g *Grid) Shapes() []Shape { return g.shapes }

// MaxBatch is the largest batch one step can hold.
func (g *Grid) MaxBatch() int { return g.batch[len(g.batch)-1] }

// Choose returns the index of the smallest bucket that holds rows, which must
// be in 1..MaxBatch.
func (g *Grid) Choose(rows int) (int, bool) {
	for i, s := range g.shapes {
		if rows <= s.Batch {
			return i, rows > 0
		}
	}
	return 0, false
}

// Next splits a batch across steps: of the rows still to run, it returns how
// many the next step takes and that step's bucket. A batch no larger than
// the largest bucket runs in one step; a larger one fills the largest bucket
// until the remainder fits a smaller one.
func (g *Grid) Next(remaining int) (rows, bucket int) {
	rows = min(remaining, g.MaxBatch())
	bucket, _ = g.Choose(rows)
	return rows, bucket
}

// PaddingRatio is the fraction of a bucket's rows that are padding.
func PaddingRatio(rows int, s Shape) float64 {
	return float64(s.Batch-rows) / float64(s.Batch)
}
