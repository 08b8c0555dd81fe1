//go:build cgo && !purego

package cpufallback

/*
#cgo CFLAGS: -O2
#cgo LDFLAGS: -lm
#include "gemm_native.h"
*/
import "C"

import "unsafe"

// The matrix-product kernels of gemm_native.c, registered best first for
// the instruction sets this CPU has (cpuid, through gcc's
// __builtin_cpu_supports); dispatch.go picks one at start-up.
var _ = func() bool {
	level := int(C.ss_cpu_level())
	for _, isa := range []struct {
		name  string
		level int
	}{{"avx512", C.SS_ISA_AVX512}, {"avx2", C.SS_ISA_AVX2}} {
		if level >= isa.level {
			k := nativeProductKernel(isa.name, C.int(isa.level))
			if isa.level == C.SS_ISA_AVX512 && C.ss_have_avx512bf16() != 0 {
				k.packBF16, k.linearBF16 = packBF16, linearBF16
			}
			nativeProducts = append(nativeProducts, k)
		}
	}
	return true
}()

func nativeProductKernel(name string, isa C.int) productKernel {
	width := int(C.ss_panel_width(isa))
	return productKernel{
		name:  name,
		isa:   int(isa),
		width: width,
		pack: func(k, n int, b []float32, ldb int, trans bool) []float32 {
			out := hugeMake[float32]((n + width - 1) / width * width * k)
			if len(out) == 0 {
				return out
			}
			checkB(trans, n, k, b, ldb)
			C.ss_pack_b(C.int(width), C.int(k), C.int(n), fp(b), C.int(ldb), cbool(trans), fp(out))
			return out
		},
		gemm: func(transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
			if m == 0 || n == 0 {
				return
			}
			checkC(m, n, c, ldc)
			if k > 0 {
				checkA(m, k, a, lda)
				checkB(transB, n, k, b, ldb)
			}
			if C.ss_gemm(isa, cbool(transB), C.int(m), C.int(n), C.int(k), C.float(alpha), fp(a), C.int(lda), fp(b), C.int(ldb), C.float(beta), fp(c), C.int(ldc)) != 0 {
				panic("cpufallback: gemm: out of memory for the packing scratch")
			}
		},
		attention: func(S, d, ld int, scale float32, q, k, v, keys, ctx, scores []float32) {
			checkHead(S, d, ld, q, k, v, keys, ctx, scores)
			if C.ss_attention_head(isa, C.int(S), C.int(d), C.long(ld), C.float(scale), fp(q), fp(k), fp(v), fp(keys), fp(ctx), fp(scores)) != 0 {
				panic("cpufallback: attention: out of memory for the packing scratch")
			}
		},
		linear: func(m, n, k int, x, packed, y, bias []float32, act activation, p0, p1 int) {
			if m == 0 || n == 0 || p0 >= p1 {
				return
			}
			if p0 < 0 || p1*width > (n+width-1)/width*width || len(packed) < (n+width-1)/width*width*k || len(x) < m*k || len(y) < m*n || (bias != nil && len(bias) < n) {
				panic("cpufallback: linear: mismatched shapes")
			}
			var pb *C.float
			if bias != nil {
				pb = fp(bias)
			}
			C.ss_gemm_packed(isa, C.int(m), C.int(n), C.int(k), 1, fp(x), C.int(k), fp(packed), 0, fp(y), C.int(n), pb, C.int(act), C.int(p0), C.int(p1))
		},
	}
}

// checkHead checks what one attention head reads and writes before C
// does: S rows of d columns at row stride ld in q, k, v and ctx, S keys
// (or none), an S x S score block.
func checkHead(S, d, ld int, q, k, v, keys, ctx, scores []float32) {
	need := (S-1)*ld + d
	if S <= 0 || d <= 0 || ld < d || len(q) < need || len(k) < need || len(v) < need || len(ctx) < need ||
		(keys != nil && len(keys) < S) || len(scores) < S*S {
		panic("cpufallback: attention: mismatched shapes")
	}
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// The same length checks as gonum's, so that a bad call panics in Go
// instead of reading past a slice in C.
func checkA(m, k int, a []float32, lda int) {
	if lda < k || len(a) < (m-1)*lda+k {
		panic("cpufallback: gemm: short A")
	}
}

func checkB(trans bool, n, k int, b []float32, ldb int) {
	rows, cols := k, n
	if trans {
		rows, cols = n, k
	}
	if ldb < cols || len(b) < (rows-1)*ldb+cols {
		panic("cpufallback: gemm: short B")
	}
}

func checkC(m, n int, c []float32, ldc int) {
	if ldc < n || len(c) < (m-1)*ldc+n {
		panic("cpufallback: gemm: short C")
	}
}

func packBF16(k, n int, b []float32, ldb int) []uint16 {
	out := hugeMake[uint16]((n + 31) / 32 * 32 * ((k + 1) / 2 * 2))
	if len(out) == 0 {
		return out
	}
	checkB(true, n, k, b, ldb)
	C.ss_pack_b_bf16(C.int(k), C.int(n), fp(b), C.int(ldb), (*C.ushort)(unsafe.Pointer(&out[0])))
	return out
}

func linearBF16(m, n, k int, x []float32, packed []uint16, y, bias []float32, act activation, p0, p1 int) {
	if m == 0 || n == 0 || p0 >= p1 {
		return
	}
	if p0 < 0 || p1 > (n+31)/32 || len(packed) < (n+31)/32*32*((k+1)/2*2) || len(x) < m*k || len(y) < m*n || (bias != nil && len(bias) < n) {
		panic("cpufallback: linear: mismatched shapes")
	}
	var pb *C.float
	if bias != nil {
		pb = fp(bias)
	}
	C.ss_linear_bf16(C.int(m), C.int(n), C.int(k), fp(x), (*C.ushort)(unsafe.Pointer(&packed[0])), fp(y), pb, C.int(act), C.int(p0), C.int(p1))
}
