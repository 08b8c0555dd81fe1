// The advisor's record of traffic: a bounded, decayed histogram of the
// steps a model ran.

package bucketing

import (
	"math"
	"sync"
	"time"
)

// DefaultHalfLife is how fast a [Traffic] forgets: a step an hour old
// weighs half what a step now does.
const DefaultHalfLife = time.Hour

// maxRowBins bounds a Traffic's memory: rows are kept exactly up to this
// many distinct batch sizes, and in ranges of equal width above.
const maxRowBins = 1024

// Traffic is a bounded, decayed record of the steps one model ran: a
// histogram over (rows, sequence length) before padding, with sequence
// lengths in units of 32 (the step of every sequence bucket, so the record
// is exact for any bucket list the rules allow) and every step's weight
// halving each half-life. Its memory is fixed at creation by the model's
// largest buckets: at most 1024 row bins x its largest seq bucket / 32. It
// is safe for concurrent use.
type Traffic struct {
	mu       sync.Mutex
	rowWidth int // rows per row bin: 1 unless the largest bucket is above maxRowBins
	rowBins  int
	seqBins  int // 1 for a model without a sequence
	seqUnit  int // positions per sequence bin
	seq      bool
	w        []float64 // [rowBin*seqBins + seqBin], in units of scale
	used     float64   // real elements, in units of scale
	steps    int64
	maxRows  int
	maxSeq   int
	// Weights are stored multiplied by exp((t-t0)/tau), so that a new
	// step adds and nothing old is touched; rescaled when large.
	tau  float64 // seconds
	t0   time.Time
	last time.Time
}

// NewTraffic returns an empty record for a model whose largest buckets are
// maxBatch rows and maxSeq positions (0 for a model without a sequence).
// halfLife 0 takes [DefaultHalfLife].
func NewTraffic(maxBatch, maxSeq int, halfLife time.Duration) *Traffic {
	return newTraffic(maxBatch, maxSeq, seqMultiple, halfLife)
}

// maxContextBins bounds a context record's bins (its memory with
// maxRowBins: 4 MiB at most).
const maxContextBins = 512

// NewContextTraffic returns an empty record of a decoder's decode steps,
// as (rows, longest context): contexts in bins of blockSize positions (a
// multiple of it past 512 bins), so that the partitions advised from it
// are block multiples exactly.
func NewContextTraffic(maxBatch, maxContext, blockSize int, halfLife time.Duration) *Traffic {
	blockSize = max(blockSize, 1)
	blocks := (maxContext + blockSize - 1) / blockSize
	return newTraffic(maxBatch, maxContext, blockSize*((blocks+maxContextBins-1)/maxContextBins), halfLife)
}

func newTraffic(maxBatch, maxSeq, unit int, halfLife time.Duration) *Traffic {
	if halfLife <= 0 {
		halfLife = DefaultHalfLife
	}
	t := &Traffic{rowWidth: 1, seqBins: 1, seqUnit: max(unit, 1), tau: halfLife.Seconds() / math.Ln2}
	if maxBatch > maxRowBins {
		t.rowWidth = (maxBatch + maxRowBins - 1) / maxRowBins
	}
	t.rowBins = (maxBatch + t.rowWidth - 1) / t.rowWidth
	if maxSeq > 0 {
		t.seq = true
		t.seqBins = (maxSeq + t.seqUnit - 1) / t.seqUnit
	}
	t.w = make([]float64, t.rowBins*t.seqBins)
	return t
}

// Record counts one step of rows rows whose longest sequence is seq
// positions (0 for a model without a sequence), used of its elements real
// (the rows times each request's length). A step outside the record's
// bounds is clamped to them.
func (t *Traffic) Record(rows, seq, used int, now time.Time) {
	if rows <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.t0.IsZero() {
		t.t0 = now
	}
	if now.Before(t.last) {
		now = t.last // a clock that steps back does not reweigh the past
	}
	t.last = now
	x := now.Sub(t.t0).Seconds() / t.tau
	if x > 500 { // exp(500) is near float64's end: rescale to now
		f := math.Exp(-x)
		for i := range t.w {
			t.w[i] *= f
		}
		t.used *= f
		t.t0, x = now, 0
	}
	weight := math.Exp(x)
	rb := min((rows-1)/t.rowWidth, t.rowBins-1)
	sb := 0
	if t.seq {
		sb = min(max(seq-1, 0)/t.seqUnit, t.seqBins-1)
	}
	t.w[rb*t.seqBins+sb] += weight
	t.used += weight * float64(used)
	t.steps++
	t.maxRows = max(t.maxRows, rows)
	t.maxSeq = max(t.maxSeq, seq)
}

// Histogram is a snapshot of a [Traffic]: step weights as decayed counts
// (a step now counts 1).
type Histogram struct {
	// Rows are the batch sizes the cells stand for (the upper end of a
	// row bin), ascending; Seq the sequence lengths (multiples of 32),
	// ascending, or [0] for a model without a sequence.
	Rows, Seq []int
	// Weight[i][j] is the decayed count of steps of Rows[i] rows (at
	// most) and sequences of Seq[j] positions (at most).
	Weight [][]float64
	// Used is the decayed sum of the steps' real elements.
	Used float64
	// Steps is how many steps were recorded (not decayed); MaxRows and
	// MaxSeq the largest seen.
	Steps           int64
	MaxRows, MaxSeq int
}

// Snapshot returns the record as of its latest step.
func (t *Traffic) Snapshot() Histogram {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := Histogram{Steps: t.steps, MaxRows: t.maxRows, MaxSeq: t.maxSeq}
	if t.steps == 0 {
		return h
	}
	norm := math.Exp(-t.last.Sub(t.t0).Seconds() / t.tau)
	h.Used = t.used * norm
	for rb := range t.rowBins {
		h.Rows = append(h.Rows, (rb+1)*t.rowWidth)
	}
	if t.seq {
		for sb := range t.seqBins {
			h.Seq = append(h.Seq, (sb+1)*t.seqUnit)
		}
	} else {
		h.Seq = []int{0}
	}
	h.Weight = make([][]float64, t.rowBins)
	for rb := range h.Weight {
		h.Weight[rb] = make([]float64, t.seqBins)
		for sb := range h.Weight[rb] {
			h.Weight[rb][sb] = t.w[rb*t.seqBins+sb] * norm
		}
	}
	return h
}
