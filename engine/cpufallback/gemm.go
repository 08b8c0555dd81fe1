package cpufallback

import (
	"gonum.org/v1/gonum/blas"

	"github.com/stepserve/stepserve/models"
)

// Tile sizes that keep every gonum Sgemm call on its serial path, which
// neither spawns goroutines nor allocates: gonum goes parallel from four
// 64x64 blocks of C.
const (
	tileM = 64
	tileN = 128
)

// gemm computes C = alpha·A·op(B) + beta·C on row-major matrices: A is
// [m, k] with row stride lda; B is [k, n], or [n, k] when transB, with row
// stride ldb; C is [m, n] with row stride ldc. Strides let it work on one
// attention head's columns in place.
func gemm(transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if products != nil {
		products.gemm(transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	blasGemm(transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// blasGemm is gemm on the build's BLAS: gonum's, or OpenBLAS's.
func blasGemm(transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	tb := blas.NoTrans
	if transB {
		tb = blas.Trans
	}
	if !tileProducts {
		impl.Sgemm(blas.NoTrans, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	for i := 0; i < m; i += tileM {
		mi := min(tileM, m-i)
		for j := 0; j < n; j += tileN {
			nj := min(tileN, n-j)
			bj := j
			if transB {
				bj = j * ldb
			}
			impl.Sgemm(blas.NoTrans, tb, mi, nj, k, alpha, a[i*lda:], lda, b[bj:], ldb, beta, c[i*ldc+j:], ldc)
		}
	}
}

// weight is one Linear's weight as the engine keeps it resident, in the
// layout its product kernel wants, made once at load.
type weight struct {
	in, out int
	// f32 is packed in panels of the kernel's width where native kernels
	// run (see productKernel.pack), else transposed to [in, out] for the
	// BLAS (see transposed).
	f32 []float32
	// bf16, where the model asks for bfloat16 (device_dtype) and the CPU
	// has AVX512_BF16, replaces f32: packed for productKernel.linearBF16.
	bf16 []uint16
	// q8, where the model is quantized (model.yaml's quantization: q8_0
	// or q4_0), replaces both: Q8_0 or Q4_0 blocks for linearQ8, in panels
	// of q8Panel rows.
	q8 *quantWeight
}

// panels is how many panels of the product kernel's width w's output
// columns make: the units linearPanels splits among threads.
func (w *weight) panels() int {
	if w.q8 != nil {
		return (w.out + q8Panel - 1) / q8Panel
	}
	if products == nil {
		return 1
	}
	return (w.out + products.width - 1) / products.width
}

// linear computes y[m, out] = x[m, in] · Wᵀ, the product of a Linear
// layer, from w, its weight as resident; the bias is added by the
// caller's fused pass.
func linear(m, out, in int, x []float32, w *weight, y []float32) {
	linearPanels(m, x, w, y, nil, actNone, 0, w.panels())
}

// linearPanels computes act(x · Wᵀ + bias) (bias nil for none) on the
// output columns of panels p0 up to p1 of w (see panels): the bias and
// activation are applied in the product's output pass where native kernels
// run.
func linearPanels(m int, x []float32, w *weight, y, bias []float32, act activation, p0, p1 int) {
	switch {
	case w.q8 != nil:
		a := quantizeActs(m, w.in, x)
		linearQ8(m, a, w, y, bias, act, p0, p1)
		a.release()
	case w.bf16 != nil:
		products.linearBF16(m, w.out, w.in, x, w.bf16, y, bias, act, p0, p1)
	case products != nil:
		products.linear(m, w.out, w.in, x, w.f32, y, bias, act, p0, p1)
	default:
		blasGemm(false, m, w.out, w.in, 1, x, w.in, w.f32, w.out, 0, y, w.out)
		if bias != nil || act != actNone {
			if bias == nil {
				bias = zeros(w.out)
			}
			biasAct(y[:m*w.out], bias, act)
		}
	}
}

// zeros returns n zeros; the portable path's rare bias-less activation.
func zeros(n int) []float32 { return make([]float32, n) }

// format is how a model's weights are kept resident: float32, bfloat16
// (device_dtype: bfloat16 where the CPU has it), Q8_0 or Q4_0
// (quantization: q8_0 or q4_0).
type format int

const (
	formatF32 format = iota
	formatBF16
	formatQ8
	formatQ4
)

// weightFormat is the format of m's weights.
func weightFormat(cfg *models.Config) format {
	switch {
	case cfg.Quantization == "q8_0":
		return formatQ8
	case cfg.Quantization == "q4_0":
		return formatQ4
	case wantsBF16(cfg):
		return formatBF16
	}
	return formatF32
}

// resident returns a Linear's weight in the layout the product kernels
// want: Q8_0 or Q4_0 blocks for formatQ8 and formatQ4; packed in panels
// of the micro-kernel's width where native kernels run (in bfloat16 for
// formatBF16), else transposed to [in, out] for the BLAS.
func resident(l *models.Linear, f format) *weight {
	w := &weight{in: l.In, out: l.Out}
	switch {
	case f == formatQ8 || f == formatQ4:
		w.q8 = newQuantWeight(f, l.Out, l.In, l.Weight)
	case f == formatBF16:
		w.bf16 = products.packBF16(l.In, l.Out, l.Weight, l.In)
	case products != nil:
		w.f32 = products.pack(l.In, l.Out, l.Weight, l.In, true)
	default:
		w.f32 = transposed(l)
	}
	return w
}

// transposed returns a Linear's weight in the [in, out] layout the engine
// keeps resident: torch stores [out, in], and a product against the
// transpose of that runs 3x slower in OpenBLAS at a few rows (37 against
// 112 GFLOP/s at 13 rows of 128x128 here; 6% slower at 221 rows).
func transposed(l *models.Linear) []float32 {
	wT := make([]float32, l.In*l.Out)
	for o := range l.Out {
		for i, v := range l.Weight[o*l.In : (o+1)*l.In] {
			wT[i*l.Out+o] = v
		}
	}
	return wT
}

// residentWeights are a model's Linear weights in the engine's layout,
// made once per program and shared by its plans.
type residentWeights map[*models.Linear]*weight

// newResidentWeights makes them, in bfloat16 where the model's
// device_dtype asks for it (Engine.Load has checked that the CPU can).
func newResidentWeights(m *models.Model) residentWeights {
	r := residentWeights{}
	f := weightFormat(m.Config)
	add := func(l *models.Linear) { r[l] = resident(l, f) }
	if m.MLP != nil {
		for i := range m.MLP.Layers {
			add(&m.MLP.Layers[i])
		}
	}
	if m.Encoder != nil {
		for i := range m.Encoder.Layers {
			l := &m.Encoder.Layers[i]
			for _, lin := range []*models.Linear{&l.Query, &l.Key, &l.Value, &l.AttnOut, &l.Inter, &l.Out} {
				add(lin)
			}
		}
		if h := m.Encoder.Head; h != nil {
			add(&h.Dense)
			add(&h.Classifier)
		}
	}
	return r
}
