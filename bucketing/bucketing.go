// Package bucketing owns shape buckets: the rules of a model's bucket lists
// ([ValidateBatch], [ValidateSeq]), the grid of fixed shapes a model is
// compiled for, the choice of the smallest bucket that holds a batch, the
// split of a batch too large for any bucket into steps, and the fraction of
// a bucket that is padding ([PaddingRatio]).
//
// Every distinct shape is a separately compiled program on the device, so no
// request shape reaches an engine unbucketed. The package deals in counts of
// rows and sequence positions only: it knows nothing of bytes, tensors,
// requests, HTTP or engines. Padding rows in packed buffers is the step's
// work (package steps).
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
	// Ctx is a decoder's decode step's context partition: the key
	// positions it reads (0: all of max_model_len's).
	Ctx int
	// Mask marks a decoder's decode step whose rows may carry a token
	// mask (structured output): a graph of its own beside the bucket's
	// unmasked one, so that steps with no constrained row upload no mask.
	Mask bool
}

// Label is the bucket's metric label: "b16", or "b16xs128" for sequence
// models, "b16xs1xc256" for a decoder's decode step in a context
// partition, and "b16xs1xc256m" for its masked twin.
func (s Shape) Label() string {
	m := ""
	if s.Mask {
		m = "m"
	}
	switch {
	case s.Seq == 0:
		return fmt.Sprintf("b%d", s.Batch)
	case s.Ctx > 0:
		return fmt.Sprintf("b%dxs%dxc%d%s", s.Batch, s.Seq, s.Ctx, m)
	}
	return fmt.Sprintf("b%dxs%d%s", s.Batch, s.Seq, m)
}

func (s Shape) String() string { return s.Label() }

// Grid is the set of buckets of one model: every batch size, crossed with
// every sequence length when there are any.
type Grid struct {
	batch  []int
	seq    []int
	shapes []Shape
}

// NewGrid checks the batch sizes and the sequence lengths with
// [ValidateBatch] and [ValidateSeq] (seq may be empty for models without a
// sequence) and builds the grid, batch-major.
func NewGrid(batch, seq []int) (*Grid, error) {
	if err := ValidateBatch(batch); err != nil {
		return nil, fmt.Errorf("bucketing: %w", err)
	}
	if err := ValidateSeq(seq); err != nil {
		return nil, fmt.Errorf("bucketing: %w", err)
	}
	g := &Grid{batch: slices.Clone(batch), seq: slices.Clone(seq)}
	for _, b := range batch {
		if len(seq) == 0 {
			g.shapes = append(g.shapes, Shape{Batch: b})
		}
		for _, s := range seq {
			g.shapes = append(g.shapes, Shape{Batch: b, Seq: s})
		}
	}
	return g, nil
}

// Shapes lists the buckets; a bucket's index in this list is how engines and
// steps refer to it. The caller must not modify the result.
func (g *Grid) Shapes() []Shape { return g.shapes }

// Batch is the grid's batch sizes, ascending.
func (g *Grid) Batch() []int { return slices.Clone(g.batch) }

// Seq is the grid's sequence lengths, ascending; empty for a model without
// a sequence.
func (g *Grid) Seq() []int { return slices.Clone(g.seq) }

// MaxBatch is the largest batch one step can hold.
func (g *Grid) MaxBatch() int { return g.batch[len(g.batch)-1] }

// MaxSeq is the longest sequence a step can hold, 0 for a grid without
// sequence lengths.
func (g *Grid) MaxSeq() int {
	if len(g.seq) == 0 {
		return 0
	}
	return g.seq[len(g.seq)-1]
}

// Choose returns the index of the smallest bucket that holds rows rows of
// sequences up to seq long (seq is ignored by a grid without sequence
// lengths). rows must be in 1..MaxBatch and seq in 1..MaxSeq.
func (g *Grid) Choose(rows, seq int) (int, bool) {
	bi, ok := smallest(g.batch, rows)
	if !ok {
		return 0, false
	}
	if len(g.seq) == 0 {
		return bi, true
	}
	si, ok := smallest(g.seq, seq)
	if !ok {
		return 0, false
	}
	return bi*len(g.seq) + si, true
}

func smallest(sizes []int, n int) (int, bool) {
	if n <= 0 {
		return 0, false
	}
	for i, s := range sizes {
		if n <= s {
			return i, true
		}
	}
	return 0, false
}

// Next splits a batch across steps: of the rows still to run, it returns how
// many the next step takes. A batch no larger than the largest bucket runs in
// one step; a larger one fills the largest bucket until the remainder fits a
// smaller one.
func (g *Grid) Next(remaining int) int { return min(remaining, g.MaxBatch()) }

// PaddingRatio is the fraction of a bucket's elements that are padding,
// given the elements (rows, or tokens for sequence buckets) really used.
func PaddingRatio(used int, s Shape) float64 {
	total := s.Batch * max(s.Seq, 1)
	return float64(total-used) / float64(total)
}

// Padded is the tokens a step of rows rows whose longest sequence is seq
// computes, padding included: the rows of the batch bucket that holds rows
// times the seq bucket that holds seq (rows alone for a grid without
// sequence lengths). Past the largest buckets it counts rows and seq as
// they are.
func (g *Grid) Padded(rows, seq int) int {
	if i, ok := smallest(g.batch, rows); ok {
		rows = g.batch[i]
	}
	if len(g.seq) == 0 {
		return rows
	}
	if i, ok := smallest(g.seq, seq); ok {
		seq = g.seq[i]
	}
	return rows * seq
}
