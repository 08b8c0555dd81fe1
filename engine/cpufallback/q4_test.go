package cpufallback

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/internal/half"
	"github.com/stepserve/stepserve/models/gguf"
)

// TestQ4WeightKeepsQ4Blocks: values that are a Q4_0 block's (any signed
// float16 scale, any values from -8 to 7, as an importance-matrix
// quantizer leaves them, not only the reference's) are kept exactly;
// other values are quantized as llama.cpp's quantize_row_q4_0_ref does.
func TestQ4WeightKeepsQ4Blocks(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	const out, in = 20, 96 // 3 blocks a row, 2 panels
	w := make([]float32, out*in)
	kinds := make([]int, out*in/32)
	for b := range kinds {
		blk := w[b*32 : (b+1)*32]
		kinds[b] = b % 4
		switch kinds[b] {
		case 0, 1: // a Q4_0 block of any scale and values
			d := half.ToFloat32(half.FromFloat32(float32(rng.NormFloat64() * 0.01)))
			if kinds[b] == 1 {
				d = -d
			}
			for c := range blk {
				k := rng.IntN(16) - 8
				if c == 5 {
					k = 3 // the largest magnitude need not be -8
				}
				if kinds[b] == 0 && c != 5 {
					k = max(-3, min(3, k))
				}
				blk[c] = float32(k) * d
			}
		case 2: // random values
			for c := range blk {
				blk[c] = float32(rng.NormFloat64())
			}
		case 3: // all zero
		}
	}
	qw := newQ4Weight(out, in, w)
	for o := range out {
		for b := range in / 32 {
			blk := w[o*in+b*32 : o*in+(b+1)*32]
			kind := kinds[(o*in+b*32)/32]
			row := make([]float32, in)
			qw.dequantizeRow(o, row)
			if kind == 2 {
				d, q := gguf.QuantizeQ4_0(blk)
				for c := range 32 {
					v, scale := qw.value(o, b*32+c)
					nib := q[c%16] & 0xF
					if c >= 16 {
						nib = q[c%16] >> 4
					}
					require.Equal(t, int32(nib)-8, v, "row %d block %d value %d: the reference's", o, b, c)
					require.Equal(t, half.ToFloat32(d), scale)
				}
				continue
			}
			assert.Equal(t, blk, row[b*32:(b+1)*32], "row %d block %d (kind %d) kept exactly", o, b, kind)
		}
	}
}
