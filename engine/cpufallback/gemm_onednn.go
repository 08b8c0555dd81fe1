//go:build cgo && onednn

package cpufallback

/*
#cgo LDFLAGS: -ldnnl -lgomp
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

// One OpenMP thread per call: the engine splits the work itself, and
// libgomp's idle threads spin.
static int ss_dnnl_sgemm(char tb, long m, long n, long k, float alpha, const float *a, long lda,
                         const float *b, long ldb, float beta, float *c, long ldc) {
	omp_set_num_threads(1);
	return dnnl_sgemm('N', tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
*/
import "C"

import "math"

// oneDNN's sgemm (Debian's libdnnl-dev, run-time ISA dispatch up to
// AVX-512), a build option (-tags onednn) kept to measure against the
// engine's own kernels: STEPSERVE_CPU_KERNELS=onednn selects it.
var _ = func() bool {
	dnnl := func(transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
		if m == 0 || n == 0 {
			return
		}
		checkC(m, n, c, ldc)
		checkA(m, k, a, lda)
		checkB(transB, n, k, b, ldb)
		tb := C.char('N')
		if transB {
			tb = 'T'
		}
		if st := C.ss_dnnl_sgemm(tb, C.long(m), C.long(n), C.long(k), C.float(alpha), fp(a), C.long(lda), fp(b), C.long(ldb), C.float(beta), fp(c), C.long(ldc)); st != 0 {
			panic("cpufallback: dnnl_sgemm failed")
		}
	}
	nativeProducts = append(nativeProducts, productKernel{
		name:  "onednn",
		width: 1,
		pack: func(k, n int, b []float32, ldb int, trans bool) []float32 {
			out := make([]float32, k*n)
			for i := range n {
				for j := range k {
					out[j*n+i] = b[i*ldb+j]
				}
			}
			return out
		},
		gemm: dnnl,
		linear: func(m, n, k int, x, packed, y, bias []float32, act activation, p0, p1 int) {
			if p0 >= p1 || m == 0 {
				return
			}
			j0, j1 := p0, min(p1, n)
			dnnl(false, m, j1-j0, k, 1, x, k, packed[j0:], n, 0, y[j0:], n)
			if bias != nil || act != actNone {
				for r := range m {
					row := y[r*n+j0 : r*n+j1]
					for j := range row {
						v := row[j]
						if bias != nil {
							v += bias[j0+j]
						}
						switch act {
						case actReLU:
							v = max(v, 0)
						case actGELU:
							v = 0.5 * v * (1 + erf32(v*(1/math.Sqrt2)))
						case actGELUTanh:
							v = v / (1 + exp32(-2*sqrt2OverPi*(v+0.044715*v*v*v)))
						}
						row[j] = v
					}
				}
			}
		},
	})
	return true
}()
