package cpufallback

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/internal/half"
	"github.com/stepserve/stepserve/models"
)

// TestQuantizeQ8MatchesLlamaCpp: a block's scale is its largest magnitude
// over 127 in float16, each value round(v / scale) with the float32
// scale's inverse (llama.cpp's quantize_row_q8_0), within ±127, the
// dequantized value within half a step of the original, and the padding
// of partial blocks and panels zero.
func TestQuantizeQ8MatchesLlamaCpp(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, s := range []struct{ n, k int }{{1, 1}, {3, 31}, {16, 32}, {17, 33}, {5, 100}, {2, 513}, {20, 2048}} {
		src := randMatrix(rng, s.n*s.k)
		src[0] = 0
		if s.k > 40 {
			clear(src[32:64]) // an all-zero block: scale 0, values 0
		}
		w := newQ8Weight(s.n, s.k, src)
		nonzero := 0
		for o := range s.n {
			for b0 := 0; b0 < s.k; b0 += q8Block {
				blk := src[o*s.k+b0 : o*s.k+min(b0+q8Block, s.k)]
				var amax float32
				for _, v := range blk {
					amax = max(amax, float32(math.Abs(float64(v))))
				}
				scale := amax / 127
				_, d := w.at(o, b0)
				assert.Equal(t, half.FromFloat32(scale), w.d[d], "%+v row %d block %d", s, o, b0/q8Block)
				for c, v := range blk {
					at, _ := w.at(o, b0+c)
					got := w.q[at]
					want := int8(0)
					if scale != 0 {
						want = int8(math.Round(float64(v * (1 / scale))))
					}
					require.Equal(t, want, got, "%+v (%d, %d)", s, o, b0+c)
					require.GreaterOrEqual(t, got, int8(-127))
					assert.LessOrEqual(t, math.Abs(float64(float32(got)*scale-v)), float64(scale)/2+1e-7)
					if got != 0 {
						nonzero++
					}
				}
			}
		}
		// Every nonzero byte is a value's: the padding is zero.
		all := 0
		for _, q := range w.q {
			if q != 0 {
				all++
			}
		}
		assert.Equal(t, nonzero, all, "%+v: nonzero padding", s)
		// Rows dequantize to their values.
		row := make([]float32, s.k)
		w.dequantizeRow(s.n-1, row)
		for i, v := range row {
			q, d := w.at(s.n-1, i)
			assert.Equal(t, float32(w.q[q])*half.ToFloat32(w.d[d]), v)
		}
	}
}

// q8Reference is y = x · Wᵀ from the quantized values in float64: each
// block's integer dot product times both scales, summed exactly (Q8_0 or
// Q4_0 weights).
func q8Reference(m, n, k int, a *q8Acts, w *quantWeight) []float64 {
	y := make([]float64, m*n)
	for i := range m {
		for o := range n {
			var sum float64
			for b := range w.blocks {
				var dot int64
				for c := range q8Block {
					v, _ := w.value(o, b*q8Block+c)
					dot += int64(a.q[(i*w.blocks+b)*q8Block+c]) * int64(v)
				}
				_, d := w.value(o, b*q8Block)
				sum += float64(dot) * float64(d) * float64(a.d[i*w.blocks+b])
			}
			y[i*n+o] = sum
		}
	}
	return y
}

// TestLinearQ8OnEveryKernelSet: the Q8_0 and Q4_0 products of every kernel
// set this CPU runs (AVX-512 VNNI, AVX2, the portable Go) equal the exact
// sum of the blocks' products to float32 rounding, through shapes that
// leave partial blocks, groups and panels, 1 to 9 rows, a bias and an
// activation, and panel ranges.
func TestLinearQ8OnEveryKernelSet(t *testing.T) {
	defer SetKernels("")
	rng := rand.New(rand.NewPCG(3, 4))
	for _, set := range KernelNames() {
		require.NoError(t, SetKernels(set))
		for _, tc := range []struct {
			m, n, k int
			f       format
		}{{1, 16, 32, formatQ8}, {1, 17, 33, formatQ8}, {2, 40, 100, formatQ8}, {3, 64, 512, formatQ8}, {4, 33, 1000, formatQ8},
			{5, 48, 2048, formatQ8}, {9, 20, 600, formatQ8}, {1, 5, 7, formatQ8}, {1, 16, 32, formatQ4}, {1, 17, 33, formatQ4},
			{2, 40, 100, formatQ4}, {3, 64, 512, formatQ4}, {4, 33, 1000, formatQ4}, {5, 48, 2048, formatQ4}, {9, 20, 600, formatQ4}, {1, 5, 7, formatQ4}} {
			s := tc
			name := fmt.Sprintf("%s bits %d m%d n%d k%d", set, map[format]int{formatQ8: 8, formatQ4: 4}[s.f], s.m, s.n, s.k)
			x, wf := randMatrix(rng, s.m*s.k), randMatrix(rng, s.n*s.k)
			w := &weight{in: s.k, out: s.n, q8: newQuantWeight(s.f, s.n, s.k, wf)}
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

// TestDecoderQ8: a decoder with quantization: q8_0 or q4_0 picks the
// first greedy token after each prompt of the float32 model with its
// layers' weights rounded as the format stores them (Q8_0 barely moves
// them; a tiny random model's Q4_0 moves its logits past their near ties,
// so the rounding is what is compared: the two differ by the activations'
// quantization and the head's Q8_0 only; later tokens of random weights
// part at near ties), and generates the same tokens alone and batched: a
// row's quantization and sums do not depend on the rows beside it.
func TestDecoderQ8(t *testing.T) {
	for name, shape := range enginetest.DecoderShapes {
		for _, f := range []format{formatQ8, formatQ4} {
			quant := map[format]string{formatQ8: "q8_0", formatQ4: "q4_0"}[f]
			t.Run(name+"/"+quant, func(t *testing.T) {
				keys := "generation:\n  max_model_len: 256\n  max_num_seqs: 8\n  max_batch_tokens: 64\n"
				ref, err := models.Load(writeDecoder(t, shape, keys))
				require.NoError(t, err)
				for i := range ref.Decoder.Layers {
					l := &ref.Decoder.Layers[i]
					for _, lin := range []*models.Linear{&l.Q, &l.K, &l.V, &l.O, &l.Gate, &l.Up, &l.Down} {
						qw := newQuantWeight(f, lin.Out, lin.In, lin.Weight)
						for o := range lin.Out {
							qw.dequantizeRow(o, lin.Weight[o*lin.In:(o+1)*lin.In])
						}
					}
				}
				dec, err := Engine{}.LoadDecoder(context.Background(), ref)
				require.NoError(t, err)
				t.Cleanup(func() { dec.Close() })
				refLoop := enginetest.StartLoop(t, dec, ref)
				qLoop, m := startDecoder(t, writeDecoder(t, shape, "quantization: "+quant+"\n"+keys))
				require.Equal(t, quant, m.Config.Quantization)
				prompts := testPrompts()
				want := enginetest.Generate(t, refLoop, prompts, 16, nil)
				got := enginetest.Generate(t, qLoop, prompts, 16, nil)
				for i := range prompts {
					assert.Equal(t, want[i][0], got[i][0], "prompt %d: the first token", i)
				}
				for i, p := range prompts {
					assert.Equal(t, got[i], enginetest.Generate(t, qLoop, [][]int32{p}, 16, nil)[0], "prompt %d alone and batched", i)
				}
			})
		}
	}
}

// BenchmarkLinearQ8 times one product of SmolLM's MLP shape at 1 and 16
// rows, Q8_0 against float32 and bfloat16 weights, on one thread.
func BenchmarkLinearQ8(b *testing.B) {
	rng := rand.New(rand.NewPCG(7, 8))
	n, k := 1536, 576
	l := linearOf(randMatrix(rng, n*k), n, k)
	for _, f := range []format{formatF32, formatBF16, formatQ8} {
		if f == formatBF16 && !BFloat16() {
			continue
		}
		w := resident(l, f)
		for _, m := range []int{1, 2, 5, 16} {
			x, y := randMatrix(rng, m*k), make([]float32, m*n)
			b.Run(fmt.Sprintf("format=%d/m=%d", f, m), func(b *testing.B) {
				for b.Loop() {
					linear(m, n, k, x, w, y)
				}
				b.ReportMetric(float64(m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GMAC/s")
			})
		}
	}
}

// TestReleaseWeights: once the plan has packed the weights, dropping the
// model's float32 copies (as serving does) leaves the decoder generating
// the same tokens, and the model holding only what the plan reads: the
// norms, and the embedding table where it is float32.
func TestReleaseWeights(t *testing.T) {
	keys := "generation:\n  max_model_len: 256\n  max_num_seqs: 8\n  max_batch_tokens: 64\n"
	for _, quant := range []string{"", "quantization: q8_0\n"} {
		m, err := models.Load(writeDecoder(t, enginetest.DecoderShapes["llama"], quant+keys))
		require.NoError(t, err)
		dec, err := Engine{}.LoadDecoder(context.Background(), m)
		require.NoError(t, err)
		loop := enginetest.StartLoop(t, dec, m)
		prompts := testPrompts()
		want := enginetest.Generate(t, loop, prompts, 12, nil)
		total := 0
		for _, tn := range m.Weights.Tensors {
			total += len(tn.Data)
		}
		dec.(engine.WeightReleaser).ReleaseWeights(m)
		runtime.GC()
		left := 0
		for _, tn := range m.Weights.Tensors {
			left += len(tn.Data)
		}
		embed := m.Decoder.Config.Vocab * m.Decoder.Config.Hidden
		if quant == "" {
			assert.Less(t, left, embed+total/20, "float32: the embedding table and the norms stay")
			assert.GreaterOrEqual(t, left, embed)
		} else {
			assert.Less(t, left, total/50, "Q8_0: only the norms stay")
		}
		assert.Equal(t, want, enginetest.Generate(t, loop, prompts, 12, nil), "%q after the release", quant)
		dec.Close()
	}
}

// TestQuantizeActs: activations are quantized as the weights are
// (llama.cpp's reference quantizer): the scale's inverse as the
// multiplier, halves rounded away from zero, and each block's sum kept.
func TestQuantizeActs(t *testing.T) {
	x := make([]float32, 64)
	x[0] = 127 // the block's largest: the multiplier is 1
	x[1], x[2], x[3] = 2.5, -3.5, 0.5
	a := quantizeActs(1, 64, x)
	defer a.release()
	assert.Equal(t, []int8{127, 3, -4, 1}, a.q[:4])
	assert.Equal(t, float32(1), a.d[0])
	assert.Zero(t, a.d[1], "an all-zero block")
	assert.Equal(t, int32(127+3-4+1), a.s[0])
	rng := rand.New(rand.NewPCG(11, 12))
	x = randMatrix(rng, 3*100)
	b := quantizeActs(3, 100, x)
	defer b.release()
	w := newQ8Weight(3, 100, x) // the same rows as weights: the same values
	for i := range 3 {
		for c := range 100 {
			at, _ := w.at(i, c)
			require.Equal(t, w.q[at], b.q[(i*4+c/32)*32+c%32], "row %d value %d", i, c)
		}
	}
}

// BenchmarkLinearQ8Stream times one row against 32 products of 8192x2048
// in Q8_0 (544 MiB) and in Q4_0 (288 MiB), each read from memory, not
// cache, on one thread and on a crew of every CPU, as a 1B decoder's
// decode step reads its layers: the weights' bytes over the time, against
// the machine's read bandwidth.
//
//	go test -run '^$' -bench LinearQ8Stream ./engine/cpufallback
func BenchmarkLinearQ8Stream(b *testing.B) {
	rng := rand.New(rand.NewPCG(7, 9))
	n, k := 8192, 2048
	l := linearOf(randMatrix(rng, n*k), n, k)
	x, y := randMatrix(rng, k), make([]float32, n)
	for _, f := range []format{formatQ8, formatQ4} {
		ws := make([]*weight, 32)
		bytes := 0
		for i := range ws {
			ws[i] = resident(l, f)
			bytes += ws[i].q8.bytes()
		}
		for _, threads := range []int{1, runtime.NumCPU()} {
			b.Run(fmt.Sprintf("bits=%d/threads=%d", ws[0].q8.bits, threads), func(b *testing.B) {
				old := minCrewWork
				minCrewWork = 0
				defer func() { minCrewWork = old }()
				c, t := beginCrew(threads)
				defer c.end()
				for b.Loop() {
					for _, w := range ws {
						linearPar(c, t, 1, x, w, y, nil, actNone)
					}
				}
				b.ReportMetric(float64(bytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
				b.ReportMetric(float64(len(ws)*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gweights/s")
			})
		}
	}
}
