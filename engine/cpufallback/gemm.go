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

// linear computes y[m, out] = x[m, in] · Wᵀ, the product of a Linear
// layer, from w, its weight as resident (see resident); the bias is added
// by the caller's fused pass.
func linear(m, out, in int, x, w, y []float32) {
	if products != nil {
		products.linear(m, out, in, x, w, y, nil, actNone, 0, (out+products.width-1)/products.width)
		return
	}
	blasGemm(false, m, out, in, 1, x, in, w, out, 0, y, out)
}

// resident returns a Linear's weight in the layout the product kernels
// want: packed in panels of the micro-kernel's width where native kernels
// run, else transposed to [in, out] for the BLAS.
func resident(l *models.Linear) []float32 {
	if products != nil {
		return products.pack(l.In, l.Out, l.Weight, l.In, true)
	}
	return transposed(l)
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
type residentWeights map[*models.Linear][]float32

func newResidentWeights(m *models.Model) residentWeights {
	r := residentWeights{}
	add := func(l *models.Linear) { r[l] = resident(l) }
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
	}
	return r
}
