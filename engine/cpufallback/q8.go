package cpufallback

import (
	"math"
	"sync"

	"github.com/stepserve/stepserve/internal/half"
)

// Q8_0 weights (model.yaml's quantization: q8_0): int8 values with a
// scale per block of 32 along a row, GGUF's Q8_0, so that a decode step
// reads a byte and a sixteenth per weight instead of four. Activations are
// quantized the same way before each product and the blocks' integer dot
// products scaled and summed in float32, as llama.cpp computes a Q8_0
// weight's product, so the two agree token for token.
//
// Layout (q8Weight): a row's blocks are grouped 16 to a group of 512
// bytes, blocks past the row's end zero; within a group, the 64-byte
// vector t (t < 8) holds bytes 4t..4t+3 of each of the 16 blocks, block j
// at bytes 4j..4j+3. The scales are float32 (rounded through float16, as
// Q8_0 stores them), 16 a group. Activations take the same layout, so the
// native kernels (q8_native.c) end a group with its 16 block sums in the
// lanes of one vector.
const (
	q8Block = 32
	q8Group = 16 * q8Block // values a group of blocks holds
	q8Panel = 16           // output rows a panel holds: the unit threads split
)

// q8Weight is a [out, in] weight in Q8_0.
type q8Weight struct {
	groups int       // groups of 16 blocks a row holds
	q      []int8    // out rows of groups*512 bytes
	d      []float32 // out rows of groups*16 scales
}

// q8Groups is how many groups a row of k values takes.
func q8Groups(k int) int { return (k + q8Group - 1) / q8Group }

// q8Offset is where value i of a row is in the layout (block b = i/32,
// byte c = i%32 of it).
func q8Offset(i int) int {
	g, b, c := i/q8Group, (i%q8Group)/q8Block, i%q8Block
	return g*q8Group + (c/4)*64 + b*4 + c%4
}

// quantizeQ8Row quantizes src (one row, k values) into q (groups*512) and
// d (groups*16) as llama.cpp's quantize_row_q8_0 does: a block's scale is
// its largest magnitude over 127, stored in float16, and each value the
// nearest integer to value / scale (the float32 scale's inverse), so
// never -128.
func quantizeQ8Row(src []float32, q []int8, d []float32) {
	for b0 := 0; b0 < len(src); b0 += q8Block {
		blk := src[b0:min(b0+q8Block, len(src))]
		var amax float32
		for _, v := range blk {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		scale := amax / 127
		var inv float32
		if scale != 0 {
			inv = 1 / scale
		}
		for c, v := range blk {
			q[q8Offset(b0+c)] = int8(math.Round(float64(v * inv)))
		}
		d[b0/q8Block] = half.ToFloat32(half.FromFloat32(scale))
	}
}

// newQ8Weight quantizes w, [out, in] row-major (torch's Linear layout).
func newQ8Weight(out, in int, w []float32) *q8Weight {
	g := q8Groups(in)
	qw := &q8Weight{groups: g, q: make([]int8, out*g*q8Group), d: make([]float32, out*g*16)}
	for o := range out {
		quantizeQ8Row(w[o*in:(o+1)*in], qw.q[o*g*q8Group:(o+1)*g*q8Group], qw.d[o*g*16:(o+1)*g*16])
	}
	return qw
}

// dequantizeRow writes row o's values (len(dst) of them) to dst.
func (w *q8Weight) dequantizeRow(o int, dst []float32) {
	q, d := w.q[o*w.groups*q8Group:], w.d[o*w.groups*16:]
	for i := range dst {
		dst[i] = float32(q[q8Offset(i)]) * d[i/q8Block]
	}
}

// q8Acts are a product's activations quantized: m rows in the weights'
// layout.
type q8Acts struct {
	m, groups int
	q         []int8
	d         []float32
}

var q8ActsPool = sync.Pool{New: func() any { return &q8Acts{} }}

// quantizeActs quantizes x [m, k] for products with Q8_0 weights of k
// inputs; give it back with release.
func quantizeActs(m, k int, x []float32) *q8Acts {
	a := q8ActsPool.Get().(*q8Acts)
	a.m, a.groups = m, q8Groups(k)
	nq, nd := m*a.groups*q8Group, m*a.groups*16
	if cap(a.q) < nq {
		a.q, a.d = make([]int8, nq), make([]float32, nd)
	}
	a.q, a.d = a.q[:nq], a.d[:nd]
	clear(a.q)
	clear(a.d)
	for i := range m {
		quantizeQ8Row(x[i*k:(i+1)*k], a.q[i*a.groups*q8Group:(i+1)*a.groups*q8Group], a.d[i*a.groups*16:(i+1)*a.groups*16])
	}
	return a
}

func (a *q8Acts) release() { q8ActsPool.Put(a) }

// q8Kernel runs the products of panels p0 up to p1 of a Q8_0 weight (16
// output rows a panel): the native kernels where the CPU has them (nil
// here otherwise), else goLinearQ8.
var q8Kernel func(m, n int, a *q8Acts, w *q8Weight, y, bias []float32, act activation, p0, p1 int)

// linearQ8 is linearPanels for a Q8_0 weight, on activations quantized.
func linearQ8(m int, a *q8Acts, w *weight, y, bias []float32, act activation, p0, p1 int) {
	if a.m < m || a.groups != w.q8.groups || len(y) < m*w.out || (bias != nil && len(bias) < w.out) || p0 < 0 || p1 > w.panels() {
		panic("cpufallback: linear: mismatched shapes")
	}
	if q8Kernel != nil && products != nil {
		q8Kernel(m, w.out, a, w.q8, y, bias, act, p0, p1)
		return
	}
	goLinearQ8(m, w.out, a, w.q8, y, bias, act, p0, p1)
}

// goLinearQ8 is the portable product and the kernels' reference: each
// block's integer dot product, times both scales, summed in float32 block
// after block.
func goLinearQ8(m, n int, a *q8Acts, w *q8Weight, y, bias []float32, act activation, p0, p1 int) {
	ld, ldd := w.groups*q8Group, w.groups*16
	for o := p0 * q8Panel; o < min(p1*q8Panel, n); o++ {
		wq, wd := w.q[o*ld:(o+1)*ld], w.d[o*ldd:(o+1)*ldd]
		for i := range m {
			xq, xd := a.q[i*ld:(i+1)*ld], a.d[i*ldd:(i+1)*ldd]
			var sum float32
			for g := range w.groups {
				var dots [16]int32
				for t := range 8 {
					base := g*q8Group + t*64
					for j := range 16 {
						for c := range 4 {
							dots[j] += int32(xq[base+j*4+c]) * int32(wq[base+j*4+c])
						}
					}
				}
				for j, dot := range dots {
					sum += float32(dot) * (wd[g*16+j] * xd[g*16+j])
				}
			}
			y[i*n+o] = sum
		}
	}
	if bias != nil || act != actNone {
		o0, o1 := p0*q8Panel, min(p1*q8Panel, n)
		b := zeros(o1 - o0)
		if bias != nil {
			b = bias[o0:o1]
		}
		for i := range m {
			goBiasAct(y[i*n+o0:i*n+o1], b, act)
		}
	}
}
