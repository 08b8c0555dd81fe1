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
// weight's product, so the two agree token for token but at near ties.
//
// Layout (a quantWeight of bits 8): panels of 16 output rows, the last padded with zero
// rows; a panel keeps, for each block of 32 inputs (the last padded with
// zeros), 8 vectors of 64 bytes, vector t holding inputs 4t..4t+3 of the
// block for each of the 16 rows (row j at bytes 4j..4j+3), and the
// block's 16 scales (float16, as Q8_0 stores them: a byte and a
// sixteenth a weight in all, not a byte and an eighth). The panels sit
// on 2 MiB pages where the kernel gives them (hugePages): a decode step
// streams them from memory, and 4 KiB pages' table walks cost a fifth of
// the read bandwidth measured on a 2-CPU EPYC. A row of x broadcasts 4 of its bytes against a vector, and one
// dot-product instruction adds them into 16 rows' sums (q8_native.c).
const (
	q8Block = 32
	q8Panel = 16 // output rows a panel holds: also the unit threads split
)

// quantWeight is a [out, in] weight in Q8_0 (bits 8) or Q4_0 (bits 4,
// q4.go). Q8_0 values are within ±127, never -128: the AVX2 kernel's sign
// trick (w with x's sign) would keep -128 negative. newQ8Weight's
// quantizer cannot write it; any path that takes stored blocks as they
// are must clamp it.
type quantWeight struct {
	bits   int      // 8: Q8_0; 4: Q4_0
	blocks int      // blocks of 32 a row holds
	q      []int8   // panels of blocks*512 bytes (Q4_0: blocks*256)
	d      []uint16 // panels of blocks*16 scales, float16 bits
}

// bytes is what a product with w reads of it.
func (w *quantWeight) bytes() int { return len(w.q) + 2*len(w.d) }

// q8Blocks is how many blocks a row of k values takes.
func q8Blocks(k int) int { return (k + q8Block - 1) / q8Block }

// at is where Q8_0 weight (o, i) is in w.q, and its block's scale in w.d.
func (w *quantWeight) at(o, i int) (q, d int) {
	p, j, b, c := o/q8Panel, o%q8Panel, i/q8Block, i%q8Block
	return (p*w.blocks+b)*512 + (c/4)*64 + j*4 + c%4, (p*w.blocks+b)*16 + j
}

// quantizeQ8Block quantizes one block (up to 32 values) as llama.cpp's
// quantize_row_q8_0 does: the scale is the largest magnitude over 127,
// stored in float16, and each value the nearest integer to value times
// the float32 scale's inverse, so never -128. put takes each value's
// quantized form; the scale is returned in float16.
func quantizeQ8Block(blk []float32, put func(c int, q int8)) uint16 {
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
		put(c, int8(math.Round(float64(v*inv))))
	}
	return half.FromFloat32(scale)
}

// newQ8Weight quantizes w, [out, in] row-major (torch's Linear layout).
func newQ8Weight(out, in int, w []float32) *quantWeight {
	kb := q8Blocks(in)
	panels := (out + q8Panel - 1) / q8Panel
	qw := &quantWeight{bits: 8, blocks: kb, q: hugeMake[int8](panels * kb * 512), d: hugeMake[uint16](panels * kb * 16)}
	for o := range out {
		row := w[o*in : (o+1)*in]
		for b := range kb {
			blk := row[b*q8Block : min((b+1)*q8Block, in)]
			scale := quantizeQ8Block(blk, func(c int, q int8) {
				at, _ := qw.at(o, b*q8Block+c)
				qw.q[at] = q
			})
			_, at := qw.at(o, b*q8Block)
			qw.d[at] = scale
		}
	}
	return qw
}

// q8Acts are a product's activations quantized: m rows of blocks*32
// values, a scale and the values' sum per block (the VNNI kernel takes
// 128 times it off each block, having added 128 to the weights).
type q8Acts struct {
	m, blocks int
	q         []int8
	d         []float32
	s         []int32
}

var q8ActsPool = sync.Pool{New: func() any { return &q8Acts{} }}

// quantizeActs quantizes x [m, k] for products with Q8_0 weights of k
// inputs, as quantizeQ8Block does (llama.cpp's reference quantizer), without
// its callback: this runs on every product's input. Give it back with
// release. (llama.cpp's x86 build quantizes activations with 127 over the
// largest magnitude, rounded half to even; measured against node-llama-cpp
// 3.21.1's prebuilt build on random decoders, that agreed with it less
// often: 1 and 0 leading tokens of 64 after a 128-token prompt on the
// SmolLM and Llama-3.2-1B shapes, against 62 and 0 with the reference.)
func quantizeActs(m, k int, x []float32) *q8Acts {
	a := q8ActsPool.Get().(*q8Acts)
	a.m, a.blocks = m, q8Blocks(k)
	nq, nd := m*a.blocks*q8Block, m*a.blocks
	if cap(a.q) < nq || cap(a.d) < nd {
		a.q, a.d, a.s = make([]int8, nq), make([]float32, nd), make([]int32, nd)
	}
	a.q, a.d, a.s = a.q[:nq], a.d[:nd], a.s[:nd]
	for i := range m {
		for b := range a.blocks {
			blk := x[i*k+b*q8Block : i*k+min((b+1)*q8Block, k)]
			q := a.q[(i*a.blocks+b)*q8Block : (i*a.blocks+b+1)*q8Block]
			var amax float32
			for _, v := range blk {
				amax = max(amax, math.Float32frombits(math.Float32bits(v)&0x7fffffff))
			}
			scale := amax / 127
			var inv float32
			if scale != 0 {
				inv = 1 / scale
			}
			var sum int32
			for c, v := range blk {
				r := int8(math.Round(float64(v * inv)))
				q[c] = r
				sum += int32(r)
			}
			clear(q[len(blk):])
			a.d[i*a.blocks+b] = half.ToFloat32(half.FromFloat32(scale))
			a.s[i*a.blocks+b] = sum
		}
	}
	return a
}

func (a *q8Acts) release() { q8ActsPool.Put(a) }

// q8Kernel runs the products of panels p0 up to p1 of a Q8_0 weight: the
// native kernels where the CPU has them (nil here otherwise), else
// goLinearQ8.
var q8Kernel func(m, n int, a *q8Acts, w *quantWeight, y, bias []float32, act activation, p0, p1 int)

// linearQ8 is linearPanels for a Q8_0 weight, on activations quantized.
func linearQ8(m int, a *q8Acts, w *weight, y, bias []float32, act activation, p0, p1 int) {
	if a.m < m || a.blocks != w.q8.blocks || len(y) < m*w.out || (bias != nil && len(bias) < w.out) || p0 < 0 || p1 > w.panels() {
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
func goLinearQ8(m, n int, a *q8Acts, w *quantWeight, y, bias []float32, act activation, p0, p1 int) {
	for o := p0 * q8Panel; o < min(p1*q8Panel, n); o++ {
		for i := range m {
			var sum float32
			for b := range w.blocks {
				xq := a.q[(i*w.blocks+b)*q8Block:]
				base, at := w.at(o, b*q8Block)
				var dot int32
				if w.bits == 4 {
					for c := range q8Block {
						dot += int32(xq[c]) * (w.nibble(o, b*q8Block+c) - 8)
					}
				} else {
					for c := range q8Block {
						dot += int32(xq[c]) * int32(w.q[base+(c/4)*64+c%4])
					}
				}
				sum += float32(dot) * (half.ToFloat32(w.d[at]) * a.d[i*w.blocks+b])
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

// value is weight (o, i) over its scale, and the scale.
func (w *quantWeight) value(o, i int) (int32, float32) {
	if w.bits == 4 {
		_, _, d := w.at4(o, i)
		return w.nibble(o, i) - 8, half.ToFloat32(w.d[d])
	}
	q, d := w.at(o, i)
	return int32(w.q[q]), half.ToFloat32(w.d[d])
}

// dequantizeRow writes row o's values (len(dst) of them) to dst.
func (w *quantWeight) dequantizeRow(o int, dst []float32) {
	for i := range dst {
		v, d := w.value(o, i)
		dst[i] = float32(v) * d
	}
}
