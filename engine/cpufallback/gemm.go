package cpufallback

import "gonum.org/v1/gonum/blas"

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

// linear computes y[m, out] = x[m, in] · Wᵀ, the product of a Linear layer
// with torch's [out, in] weight layout (the bias is added by the caller's
// fused pass).
func linear(m, out, in int, x, w, y []float32) {
	gemm(true, m, out, in, 1, x, in, w, in, 0, y, out)
}
