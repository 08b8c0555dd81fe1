//go:build cgo && !purego

package cpufallback

/*
#cgo CFLAGS: -O2
#include "q8_native.h"
*/
import "C"

import "unsafe"

// The native Q8_0 products, where the CPU has AVX-512 VNNI or AVX2; they
// run with the native product kernels (not under STEPSERVE_CPU_KERNELS=go).
var q8Level = int(C.ss_q8_level())

func init() {
	if q8Level != C.SS_Q8_NONE {
		q8Kernel = nativeLinearQ8
	}
}

// q8ISA is the level the native kernels run at: AVX-512 VNNI only with
// the AVX-512 product kernels in use, so that STEPSERVE_CPU_KERNELS=avx2
// runs AVX2's on any CPU.
func q8ISA() C.int {
	if products != nil && products.name == "avx512" && q8Level == C.SS_Q8_VNNI {
		return C.SS_Q8_VNNI
	}
	return C.SS_Q8_AVX2
}

func nativeLinearQ8(m, n int, a *q8Acts, w *quantWeight, y, bias []float32, act activation, p0, p1 int) {
	if m == 0 || n == 0 || p0 >= p1 {
		return
	}
	var pb *C.float
	if bias != nil {
		pb = fp(bias)
	}
	C.ss_linear_q8(q8ISA(), C.int(w.bits), C.int(m), C.int(n), C.int(w.blocks), (*C.schar)(unsafe.Pointer(&a.q[0])), fp(a.d),
		(*C.int)(unsafe.Pointer(&a.s[0])), (*C.schar)(unsafe.Pointer(&w.q[0])), (*C.ushort)(unsafe.Pointer(&w.d[0])), fp(y), pb, C.int(act), C.int(p0), C.int(p1))
}
