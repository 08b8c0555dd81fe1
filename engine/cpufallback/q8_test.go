package cpufallback

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/internal/half"
)

// TestQuantizeQ8MatchesLlamaCpp: a block's scale is its largest magnitude
// over 127 in float16, each value round(v / scale) with the float32
// scale's inverse (llama.cpp's quantize_row_q8_0), within ±127, and the
// dequantized value within half a step of the original.
func TestQuantizeQ8MatchesLlamaCpp(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, k := range []int{1, 31, 32, 33, 100, 512, 513, 2048} {
		src := randMatrix(rng, k)
		src[0] = 0
		if k > 40 {
			clear(src[32:64]) // an all-zero block: scale 0, values 0
		}
		g := q8Groups(k)
		q, d := make([]int8, g*q8Group), make([]float32, g*16)
		quantizeQ8Row(src, q, d)
		for b0 := 0; b0 < k; b0 += q8Block {
			blk := src[b0:min(b0+q8Block, k)]
			var amax float32
			for _, v := range blk {
				amax = max(amax, float32(math.Abs(float64(v))))
			}
			scale := amax / 127
			assert.Equal(t, half.ToFloat32(half.FromFloat32(scale)), d[b0/q8Block], "k %d block %d", k, b0/q8Block)
			for c, v := range blk {
				got := q[q8Offset(b0+c)]
				want := int8(0)
				if scale != 0 {
					want = int8(math.Round(float64(v * (1 / scale))))
				}
				require.Equal(t, want, got, "k %d value %d", k, b0+c)
				require.GreaterOrEqual(t, got, int8(-127))
				assert.LessOrEqual(t, math.Abs(float64(float32(got)*scale-v)), float64(scale)/2+1e-7)
			}
		}
		// Past the row's end, zeros: the kernels read whole groups.
		for i := k; i < g*q8Group; i++ {
			c := i % q8Block
			if i-c >= (k+q8Block-1)/q8Block*q8Block {
				require.Zero(t, q[q8Offset(i)], "padding at %d", i)
			}
		}
	}
}

// q8Reference is y = x · Wᵀ from the quantized values in float64: each
// block's integer dot product times both scales, summed exactly.
func q8Reference(m, n, k int, a *q8Acts, w *q8Weight) []float64 {
	y := make([]float64, m*n)
	ld, ldd := w.groups*q8Group, w.groups*16
	for i := range m {
		for o := range n {
			var sum float64
			for b := 0; b < (k+q8Block-1)/q8Block; b++ {
				var dot int64
				for c := range q8Block {
					at := q8Offset(b*q8Block + c)
					dot += int64(a.q[i*ld+at]) * int64(w.q[o*ld+at])
				}
				sum += float64(dot) * float64(w.d[o*ldd+b]) * float64(a.d[i*ldd+b])
			}
			y[i*n+o] = sum
		}
	}
	return y
}

// TestLinearQ8OnEveryKernelSet: the Q8_0 products of every kernel set this
// CPU runs (AVX-512 VNNI, AVX2, the portable Go) equal the exact sum of
// the blocks' products to float32 rounding, through shapes that leave
// partial blocks, groups and panels, 1 to 9 rows, a bias and an
// activation, and panel ranges.
func TestLinearQ8OnEveryKernelSet(t *testing.T) {
	defer SetKernels("")
	rng := rand.New(rand.NewPCG(3, 4))
	for _, set := range KernelNames() {
		require.NoError(t, SetKernels(set))
		for _, s := range []struct{ m, n, k int }{{1, 16, 32}, {1, 17, 33}, {2, 40, 100}, {3, 64, 512}, {4, 33, 1000}, {5, 48, 2048}, {9, 20, 600}, {1, 5, 7}} {
			name := fmt.Sprintf("%s m%d n%d k%d", set, s.m, s.n, s.k)
			x, wf := randMatrix(rng, s.m*s.k), randMatrix(rng, s.n*s.k)
			w := &weight{in: s.k, out: s.n, q8: newQ8Weight(s.n, s.k, wf)}
			a := quantizeActs(s.m, s.k, x)
			want := q8Reference(s.m, s.n, s.k, a, w.q8)
			bias := randMatrix(rng, s.n)
			for _, act := range []activation{actNone, actGELU} {
				y := make([]float32, s.m*s.n)
				linearQ8(s.m, a, w, y, bias, act, 0, w.panels())
				for i, v := range y {
					ref := want[i] + float64(bias[i%s.n])
					if act == actGELU {
						ref = 0.5 * ref * (1 + math.Erf(ref/math.Sqrt2))
					}
					require.InDelta(t, ref, float64(v), 1e-4*(1+math.Abs(ref)), "%s act %d: y[%d]", name, act, i)
				}
			}
			// Panels one at a time write only their rows, and the same
			// values as the whole.
			whole := make([]float32, s.m*s.n)
			linearQ8(s.m, a, w, whole, nil, actNone, 0, w.panels())
			parts := make([]float32, s.m*s.n)
			for p := range w.panels() {
				linearQ8(s.m, a, w, parts, nil, actNone, p, p+1)
			}
			assert.Equal(t, whole, parts, name)
			a.release()
		}
	}
}

// TestLinearQ8ThroughLinear: linear (which quantizes x itself) and the
// parallel split answer the same, with no allocation once warm.
func TestLinearQ8ThroughLinear(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	m, n, k := 3, 200, 700
	x := randMatrix(rng, m*k)
	w := resident(linearOf(randMatrix(rng, n*k), n, k), formatQ8)
	want := make([]float32, m*n)
	linear(m, n, k, x, w, want)
	got := make([]float32, m*n)
	linearPar(nil, 2, m, x, w, got, nil, actNone)
	assert.Equal(t, want, got)
	run := func() { linear(m, n, k, x, w, got) }
	run()
	assert.Zero(t, testing.AllocsPerRun(10, run))
}

// TestDecoderQ8: a decoder with quantization: q8_0 picks the float32
// model's first greedy token after each prompt (their logits differ by the
// quantization only; later tokens of random weights part at near ties),
// and generates the same tokens alone and batched: a row's quantization
// and sums do not depend on the rows beside it.
func TestDecoderQ8(t *testing.T) {
	for name, shape := range enginetest.DecoderShapes {
		t.Run(name, func(t *testing.T) {
			keys := "generation:\n  max_model_len: 256\n  max_num_seqs: 8\n  max_batch_tokens: 64\n"
			f32Loop, _ := startDecoder(t, writeDecoder(t, shape, keys))
			q8Loop, m := startDecoder(t, writeDecoder(t, shape, "quantization: q8_0\n"+keys))
			require.Equal(t, "q8_0", m.Config.Quantization)
			prompts := testPrompts()
			want := enginetest.Generate(t, f32Loop, prompts, 16, nil)
			got := enginetest.Generate(t, q8Loop, prompts, 16, nil)
			for i := range prompts {
				assert.Equal(t, want[i][0], got[i][0], "prompt %d: the first token", i)
			}
			for i, p := range prompts {
				assert.Equal(t, got[i], enginetest.Generate(t, q8Loop, [][]int32{p}, 16, nil)[0], "prompt %d alone and batched", i)
			}
		})
	}
}
