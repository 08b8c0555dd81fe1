package bucketing

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// The bucket advisor: every bucket is a compiled program (seconds to
// compile, device memory to hold) and every padded row or token is device
// work wasted, so the right buckets are the ones that fit the traffic. A
// [Traffic] records the steps a model ran, as the sizes they were before
// padding; [Advise] picks, for that record, the bucket lists of at most K
// programs that minimize the padded work, and says what the current ones
// cost on the same record.
//
// Work is counted as the device does it: a step of bucket b x s costs b*s
// elements (b for a model without a sequence) whatever it holds. The real
// work is the rows times the length of each request in it.

// ErrNoTraffic is Advise's error for a record without steps.
var ErrNoTraffic = errors.New("no traffic recorded yet: advice needs steps served since the model loaded")

// Advice is the bucket lists [Advise] recommends for a record, beside what
// the current lists cost on it.
type Advice struct {
	// Batch and Seq are the advised lists (Seq empty for a model without
	// a sequence); Programs is how many buckets they make.
	Batch    []int `json:"batch"`
	Seq      []int `json:"seq,omitempty"`
	Programs int   `json:"programs"`
	// CurrentBatch, CurrentSeq and CurrentPrograms are the lists the
	// model runs with now.
	CurrentBatch    []int `json:"current_batch"`
	CurrentSeq      []int `json:"current_seq,omitempty"`
	CurrentPrograms int   `json:"current_programs"`
	// PaddingNow and PaddingAdvised are the fractions of the padded work
	// that is padding, on the recorded traffic, with the current and the
	// advised lists; WorkRatio is the advised padded work over the
	// current (below 1: less device work for the same requests).
	PaddingNow     float64 `json:"padding_ratio_current"`
	PaddingAdvised float64 `json:"padding_ratio_advised"`
	WorkRatio      float64 `json:"work_ratio"`
	// Steps is how many steps the record holds; Exact says whether the
	// advised lists are a proven optimum (one dimension) or the best of a
	// search (two).
	Steps int64 `json:"steps"`
	Exact bool  `json:"exact"`
	// Context and CurrentContext are a decoder's context partitions,
	// advised and now, for the advice of its decode steps
	// ([AdviseContexts]): Batch is then the current batch list, kept.
	Context        []int `json:"context,omitempty"`
	CurrentContext []int `json:"current_context,omitempty"`
	// YAML is the buckets block to paste into model.yaml.
	YAML string `json:"model_yaml"`

	ops int64 // the search's cost, for tests
}

// Advise returns the bucket lists of at most maxBuckets programs (the
// batch list's length times the seq list's) that minimize the padded work
// of the recorded traffic, for a model now compiled for the lists batch
// and seq (seq empty for a model without a sequence).
//
// The largest batch bucket is the largest batch seen: the batcher never
// made a larger one, so no step is split that was not. The largest seq
// bucket stays the current one: it is the longest text the model accepts,
// and advice must not change what is refused. With one dimension to choose
// (no sequence, or one batch size) the answer is exact: dynamic
// programming over the histogram's sizes. With two, the cost of a step is
// the product of its batch and seq buckets, and the search alternates: the
// best batch list for the seq list (exact, by the same program with each
// batch size weighed by the seq buckets of its steps), then the best seq
// list for that batch list, until neither improves, from the current lists
// and for every split of maxBuckets between the two; the best of these is
// returned. It is a local optimum, never worse than the current lists.
func Advise(h Histogram, batch, seq []int, maxBuckets int) (Advice, error) {
	a := Advice{CurrentBatch: slices.Clone(batch), CurrentSeq: slices.Clone(seq),
		CurrentPrograms: len(batch) * max(len(seq), 1), Steps: h.Steps}
	if maxBuckets < 1 {
		return a, fmt.Errorf("max_buckets: %d; want at least 1", maxBuckets)
	}
	if h.Steps == 0 || h.Used <= 0 {
		return a, ErrNoTraffic
	}
	// Only sizes that occur can be the smallest bucket that holds
	// something: the lists are chosen among them.
	rowW := make([]float64, len(h.Rows))
	seqW := make([]float64, len(h.Seq))
	for i := range h.Rows {
		for j := range h.Seq {
			rowW[i] += h.Weight[i][j]
			seqW[j] += h.Weight[i][j]
		}
	}
	rows := occurring(h.Rows, rowW)
	seqs := occurring(h.Seq, seqW)
	if len(seq) > 0 {
		maxSeq := seq[len(seq)-1]
		// The longest accepted stays, whatever was seen.
		if seqs[len(seqs)-1] < maxSeq {
			seqs = append(seqs, maxSeq)
		}
	}

	cost := func(b, s []int) float64 { return work(h, b, s) }
	now := cost(batch, seq)
	bestB, bestS, best := []int(nil), []int(nil), math.Inf(1)
	var ops int64 // dynamic-programming cells evaluated: the search's cost
	if len(seq) == 0 {
		cand := thin(rows, rowW, h.Rows, maxCandidates1D)
		bestB, best = oneDim(h.Rows, rowW, cand, maxBuckets, &ops)
		a.Exact = len(cand) == len(rows)
	} else {
		// The candidates are thinned to a bound, and of the splits of
		// maxBuckets between the two lists only those that give the seq
		// list a different length are tried (for one seq length, more
		// batch sizes never cost more): the search's cost is bounded
		// whatever the grid and max_buckets.
		cr := thin(rows, rowW, h.Rows, maxCandidates2D)
		cs := thin(seqs, seqW, h.Seq, maxCandidates2D)
		lastKs := -1
		for kb := min(maxBuckets, len(cr)); kb >= 1; kb-- {
			ks := min(maxBuckets/kb, len(cs))
			if ks < 1 || ks == lastKs {
				continue
			}
			lastKs = ks
			b, s := fit(batch, cr, kb), fit(seq, cs, ks)
			c := cost(b, s)
			for range maxAlternations {
				nb, _ := oneDim(h.Rows, weighBatch(h, s), cr, kb, &ops)
				ns, _ := oneDim(h.Seq, weighSeq(h, nb), cs, ks, &ops)
				nc := cost(nb, ns)
				if nc >= c*(1-1e-12) {
					break
				}
				b, s, c = nb, ns, nc
			}
			if c < best {
				bestB, bestS, best = b, s, c
			}
		}
		a.Exact = (len(rows) == 1 || maxBuckets == 1) && len(cr) == len(rows) && len(cs) == len(seqs)
	}
	a.ops = ops
	if len(batch)*max(len(seq), 1) <= maxBuckets && now <= best {
		// The current lists fit and are at least as good: keep them.
		bestB, bestS, best = slices.Clone(batch), slices.Clone(seq), now
	}
	a.Batch, a.Seq = bestB, bestS
	a.Programs = len(bestB) * max(len(bestS), 1)
	a.PaddingNow = max(0, 1-h.Used/now)
	a.PaddingAdvised = max(0, 1-h.Used/best)
	a.WorkRatio = best / now
	a.YAML = bucketsYAML(a.Batch, a.Seq)
	return a, nil
}

// The bounds of the search (see Advise): candidates per dimension, and
// alternations of the two-dimensional search.
const (
	maxCandidates1D = 256
	maxCandidates2D = 48
	maxAlternations = 8
)

// thin is cand (ascending sizes that occur, with weights w over sizes) cut
// to at most n: its largest always, and the others where the weight's
// running total crosses each n-th of the whole, so that where traffic is
// dense, buckets may be too. With no more than n, cand is returned.
func thin(cand []int, w []float64, sizes []int, n int) []int {
	if len(cand) <= n {
		return cand
	}
	total := 0.0
	for _, x := range w {
		total += x
	}
	out := make([]int, 0, n)
	run, next := 0.0, total/float64(n)
	for i, s := range sizes {
		if w[i] == 0 || s >= cand[len(cand)-1] {
			continue
		}
		run += w[i]
		if run >= next && len(out) < n-1 {
			out = append(out, s)
			for next <= run {
				next += total / float64(n)
			}
		}
	}
	return append(out, cand[len(cand)-1])
}

// occurring is the sizes whose weight is not zero.
func occurring(sizes []int, w []float64) []int {
	var out []int
	for i, s := range sizes {
		if w[i] > 0 {
			out = append(out, s)
		}
	}
	return out
}

// work is the padded work of the record run with the lists b and s: each
// cell's steps times the smallest buckets that hold them.
func work(h Histogram, b, s []int) float64 {
	total := 0.0
	for i, r := range h.Rows {
		bb, ok := smallest(b, r)
		for j, q := range h.Seq {
			w := h.Weight[i][j]
			if w == 0 {
				continue
			}
			if !ok {
				return math.Inf(1)
			}
			ss := 1
			if len(s) > 0 {
				si, ok := smallest(s, q)
				if !ok {
					return math.Inf(1)
				}
				ss = s[si]
			}
			total += w * float64(b[bb]*ss)
		}
	}
	return total
}

// weighBatch is each batch size's weight when its steps run in the seq
// buckets s: the seq elements a step of it costs, summed.
func weighBatch(h Histogram, s []int) []float64 {
	out := make([]float64, len(h.Rows))
	for i := range h.Rows {
		for j, q := range h.Seq {
			si, _ := smallest(s, q)
			out[i] += h.Weight[i][j] * float64(s[si])
		}
	}
	return out
}

// weighSeq is each seq length's weight when its steps run in the batch
// buckets b.
func weighSeq(h Histogram, b []int) []float64 {
	out := make([]float64, len(h.Seq))
	for i, r := range h.Rows {
		bi, _ := smallest(b, r)
		for j := range h.Seq {
			out[j] += h.Weight[i][j] * float64(b[bi])
		}
	}
	return out
}

// fit is a starting list of at most k buckets from cur, within the
// candidates: cur's sizes that are candidates, the largest candidate
// always; thinned from the small end, filled from the candidates.
func fit(cur, cand []int, k int) []int {
	last := cand[len(cand)-1]
	var out []int
	for _, c := range cur {
		if c < last && slices.Contains(cand, c) {
			out = append(out, c)
		}
	}
	for len(out) > k-1 {
		out = out[1:]
	}
	for _, c := range cand[:len(cand)-1] {
		if len(out) >= k-1 {
			break
		}
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	out = append(out, last)
	slices.Sort(out)
	return out
}

// oneDim is the exact optimum of one dimension: of the lists of at most k
// sizes from cand (ascending; its largest always in the list), the one
// that minimizes sum over sizes v of w(v) x the smallest listed size >= v,
// where w is given for every size of sizes. Dynamic programming over the
// candidates: best[j][n] is the least cost of covering every size up to
// cand[n] with j buckets, the last of them cand[n]; O(k x len(cand)^2).
func oneDim(sizes []int, w []float64, cand []int, k int, ops *int64) ([]int, float64) {
	n := len(cand)
	// mass[i] is the weight of the sizes in (cand[i-1], cand[i]].
	mass := make([]float64, n)
	ci := 0
	for i, s := range sizes {
		for ci < n && cand[ci] < s {
			ci++
		}
		if ci < n {
			mass[ci] += w[i]
		}
	}
	prefix := make([]float64, n+1)
	for i, m := range mass {
		prefix[i+1] = prefix[i] + m
	}
	k = min(k, n)
	inf := math.Inf(1)
	best := make([][]float64, k+1)
	from := make([][]int, k+1)
	for j := range best {
		best[j] = make([]float64, n)
		from[j] = make([]int, n)
		for i := range best[j] {
			best[j][i] = inf
		}
	}
	for i := range n {
		best[1][i] = float64(cand[i]) * prefix[i+1]
		from[1][i] = -1
	}
	for j := 2; j <= k; j++ {
		*ops += int64(n) * int64(n-1) / 2
		for i := range n {
			for p := range i {
				if best[j-1][p] == inf {
					continue
				}
				c := best[j-1][p] + float64(cand[i])*(prefix[i+1]-prefix[p+1])
				if c < best[j][i] {
					best[j][i], from[j][i] = c, p
				}
			}
		}
	}
	bj := 1
	for j := 2; j <= k; j++ {
		if best[j][n-1] < best[bj][n-1] {
			bj = j
		}
	}
	var out []int
	for j, i := bj, n-1; i >= 0 && j >= 1; j-- {
		out = append(out, cand[i])
		i = from[j][i]
	}
	slices.Reverse(out)
	return out, best[bj][n-1]
}

// MaxContexts bounds a decoder's context partitions (buckets.context).
const MaxContexts = 16

// AdviseContexts is [Advise] for a decoder's decode steps, recorded as
// (rows, longest context) with a step's real elements the contexts of its
// rows: the context partitions (multiples of blockSize, the last the
// current last, max_model_len's) of at most maxBuckets decode programs,
// len(batch) per partition, that make the recorded steps read the fewest
// key positions. The batch list stays as it is, since prefill buckets
// share it: each step weighs as the batch bucket that holds its rows, and
// the partitions are chosen exactly, in one dimension.
func AdviseContexts(h Histogram, batch, contexts []int, blockSize, maxBuckets int) (Advice, error) {
	a := Advice{CurrentBatch: slices.Clone(batch), CurrentContext: slices.Clone(contexts),
		CurrentPrograms: len(batch) * len(contexts), Steps: h.Steps}
	if len(batch) == 0 || len(contexts) == 0 || blockSize < 1 {
		return a, fmt.Errorf("no decode buckets to advise on")
	}
	per := min(maxBuckets/len(batch), MaxContexts)
	if per < 1 {
		return a, fmt.Errorf("max_buckets: %d; want at least %d, a context partition for each of the %d batch sizes", maxBuckets, len(batch), len(batch))
	}
	if h.Steps == 0 || h.Used <= 0 {
		return a, ErrNoTraffic
	}
	one := Histogram{Rows: []int{1}, Seq: h.Seq, Weight: [][]float64{make([]float64, len(h.Seq))}, Used: h.Used,
		Steps: h.Steps, MaxRows: 1, MaxSeq: h.MaxSeq}
	for i, r := range h.Rows {
		b := batch[len(batch)-1]
		if j, ok := slices.BinarySearch(batch, r); ok || j < len(batch) {
			b = batch[j]
		}
		for j := range h.Seq {
			one.Weight[0][j] += h.Weight[i][j] * float64(b)
		}
	}
	// The record's bins (NewContextTraffic's: block multiples) are the
	// unit: a current partition stands for the bin that holds it, and an
	// advised bin that is one stands for the partition itself.
	unit := max(h.Seq[0], 1)
	up := func(n, m int) int { return (n + m - 1) / m * m }
	var cur []int
	exact := map[int]int{}
	for _, c := range contexts {
		if u := up(c, unit); len(cur) == 0 || u > cur[len(cur)-1] {
			cur = append(cur, u)
			exact[u] = c
		}
	}
	d, err := Advise(one, []int{1}, cur, per)
	if err != nil {
		return a, err
	}
	full := contexts[len(contexts)-1]
	for _, c := range d.Seq {
		if was, ok := exact[c]; ok {
			c = was
		}
		if c = min(up(c, blockSize), full); len(a.Context) == 0 || c > a.Context[len(a.Context)-1] {
			a.Context = append(a.Context, c)
		}
	}
	if a.Context[len(a.Context)-1] != full {
		a.Context = append(a.Context, full)
	}
	a.Batch, a.Programs = slices.Clone(batch), len(batch)*len(a.Context)
	a.PaddingNow, a.PaddingAdvised, a.WorkRatio, a.Exact = d.PaddingNow, d.PaddingAdvised, d.WorkRatio, true
	a.YAML = "buckets:\n  context: " + intList(a.Context) + "\n"
	return a, nil
}

// bucketsYAML is the model.yaml block for the lists.
func bucketsYAML(batch, seq []int) string {
	var b strings.Builder
	b.WriteString("buckets:\n  batch: " + intList(batch) + "\n")
	if len(seq) > 0 {
		b.WriteString("  seq: " + intList(seq) + "\n")
	}
	return b.String()
}

func intList(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return "[" + strings.Join(s, ", ") + "]"
}
