package cpufallback

import (
	"math"

	"github.com/stepserve/stepserve/internal/half"
	"github.com/stepserve/stepserve/models/gguf"
)

// Q4_0 weights (model.yaml's quantization: q4_0, and GGUF files whose
// projections are Q4_0): 4-bit values with a float16 scale per block of
// 32 along a row, GGUF's Q4_0, a weight (q-8)*d for q from 0 to 15, so
// that a decode step reads 18 bytes per 32 weights (Q8_0 reads 34).
// Activations are quantized to Q8_0 blocks as for Q8_0 weights, and each
// block's integer dot product is scaled by both scales, as llama.cpp's
// vec_dot_q4_0_q8_0 computes it.
//
// Layout (a quantWeight of bits 4): panels of 16 output rows as Q8_0's; a
// panel keeps, for each block of 32 inputs, 4 vectors of 64 bytes, byte
// 4j+c of vector t holding row j's input 4t+c in its low nibble and input
// 16+4t+c in its high one (the pairing of a GGUF Q4_0 block's bytes),
// then the block's 16 scales. The kernels take the nibbles as unsigned
// bytes against x's signed ones and take 8 times the sum of x's block
// off each block's sum.

// at4 is where weight (o, i)'s nibble is in w.q: the byte, and whether it
// is the high nibble; and its block's scale in w.d.
func (w *quantWeight) at4(o, i int) (q int, high bool, d int) {
	p, j, b, c := o/q8Panel, o%q8Panel, i/q8Block, i%q8Block
	return (p*w.blocks+b)*256 + (c%16/4)*64 + j*4 + c%4, c >= 16, (p*w.blocks+b)*16 + j
}

// nibble is weight (o, i)'s stored value, 0 to 15 (the weight over its
// scale, plus 8).
func (w *quantWeight) nibble(o, i int) int32 {
	q, high, _ := w.at4(o, i)
	v := uint8(w.q[q])
	if high {
		v >>= 4
	}
	return int32(v & 15)
}

// newQ4Weight quantizes w, [out, in] row-major: a block that some Q4_0
// scale and values reproduce exactly (one read from a Q4_0 GGUF file,
// whichever quantizer wrote it) keeps them; any other as llama.cpp's
// quantize_row_q4_0_ref does. A row's last block is padded with zeros.
func newQ4Weight(out, in int, w []float32) *quantWeight {
	kb := q8Blocks(in)
	panels := (out + q8Panel - 1) / q8Panel
	qw := &quantWeight{bits: 4, blocks: kb, q: hugeMake[int8](panels * kb * 256), d: hugeMake[uint16](panels * kb * 16)}
	var blk [q8Block]float32
	for o := range out {
		row := w[o*in : (o+1)*in]
		for b := range kb {
			clear(blk[:])
			copy(blk[:], row[b*q8Block:min((b+1)*q8Block, in)])
			d, q, ok := exactQ4_0(blk[:])
			if !ok {
				d, q = gguf.QuantizeQ4_0(blk[:])
			}
			for c := range 16 {
				at, _, _ := qw.at4(o, b*q8Block+c)
				qw.q[at] = int8(q[c])
			}
			_, _, at := qw.at4(o, b*q8Block)
			qw.d[at] = d
		}
	}
	return qw
}

// newQuantWeight is w quantized to f, formatQ8 or formatQ4.
func newQuantWeight(f format, out, in int, w []float32) *quantWeight {
	if f == formatQ4 {
		return newQ4Weight(out, in, w)
	}
	return newQ8Weight(out, in, w)
}

// exactQ4_0 finds a Q4_0 scale d (a float16) and values k from -8 to 7
// with float32(k)*d equal to each of the 32 values of blk, if there are
// any. A Q4_0 block's values are such products, whatever chose its
// scale: llama.cpp's reference quantizer puts the largest magnitude at
// -8, but its importance-matrix quantizer (most published Q4_0 files)
// searches for the scale, so quantizing such values again with the
// reference would move them. The largest magnitude m is |k|*|d| for
// some |k| from 1 to 8, so d is among ±m/8 .. ±m/1; most blocks of
// another origin fail at their first value.
func exactQ4_0(blk []float32) (d uint16, q [16]byte, ok bool) {
	var m float32
	for _, v := range blk[:32] {
		m = max(m, float32(math.Abs(float64(v))))
	}
	if m == 0 {
		for j := range q {
			q[j] = 8 | 8<<4
		}
		return 0, q, true
	}
	var k [32]int
	for t := range 16 {
		// The scale is signed: the reference's is negative where the
		// largest magnitude is positive, which it stores as -8.
		scale := m / float32(8-t/2)
		if t%2 == 1 {
			scale = -scale
		}
		h := half.FromFloat32(scale)
		if half.ToFloat32(h) != scale {
			continue
		}
		ok = true
		for c, v := range blk[:32] {
			r := math.Round(float64(v / scale))
			if r < -8 || r > 7 || float32(r)*scale != v {
				ok = false
				break
			}
			k[c] = int(r)
		}
		if ok {
			for c := range 16 {
				q[c] = byte(k[c]+8) | byte(k[c+16]+8)<<4
			}
			return h, q, true
		}
	}
	return 0, q, false
}
