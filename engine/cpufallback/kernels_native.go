//go:build cgo && !purego

package cpufallback

/*
#cgo CFLAGS: -O2
#cgo LDFLAGS: -lm
#include "kernels_avx2.h"
*/
import "C"

import (
	"unsafe"

	"github.com/stepserve/stepserve/models"
)

// The AVX2 + FMA kernels of kernels_avx2.c, installed where the CPU has
// both. They vectorize the exponentials and erfs that dominated the
// encoder step in Go (about two thirds of it at every bucket).
// chooseKernels installs them with the AVX2 or AVX-512 products.
var _ = func() bool {
	if C.ss_have_avx2() != 0 {
		nativeElementWise = func() {
			biasAct, addSoftmaxRows, residualNorm, layerNormRows = avx2BiasAct, avx2AddSoftmaxRows, avx2ResidualNorm, avx2LayerNormRows
			decodeAttention, siluMul, softmaxRow = avx2DecodeAttention, avx2SiluMul, avx2SoftmaxRow
		}
	}
	return true
}()

func fp(s []float32) *C.float { return (*C.float)(unsafe.Pointer(unsafe.SliceData(s))) }

// rows checks that y holds whole rows of cols columns before C walks it.
func rows(y []float32, cols int) C.int {
	if cols == 0 || len(y)%cols != 0 {
		panic("cpufallback: kernel on a matrix that is not whole rows")
	}
	return C.int(len(y) / cols)
}

func avx2BiasAct(y, bias []float32, act activation) {
	if len(y) == 0 {
		return
	}
	C.ss_bias_act(fp(y), fp(bias), rows(y, len(bias)), C.int(len(bias)), C.int(act))
}

func avx2AddSoftmaxRows(y, add []float32) {
	if len(y) == 0 {
		return
	}
	C.ss_add_softmax(fp(y), fp(add), rows(y, len(add)), C.int(len(add)))
}

// avx2DecodeAttention checks that every row C will read is inside a.kv
// and the buffers hold what it writes, then runs ss_decode_attention.
func avx2DecodeAttention(a decodeAttn) {
	P := a.to - a.from
	if P <= 0 || a.hd <= 0 || a.hd%8 != 0 || a.group <= 0 || a.bs <= 0 || a.rowStride < a.hd || a.blockStride < 0 || a.valOff < 0 ||
		len(a.q) < a.group*a.hd || len(a.out) < a.group*a.hd || len(a.scores) < a.group*P ||
		(a.to-1)/a.bs >= len(a.table) || a.from < 0 {
		panic("cpufallback: decodeAttention: mismatched shapes")
	}
	last := a.base + (a.bs-1)*a.rowStride + a.valOff + a.hd
	for _, b := range a.table[a.from/a.bs : (a.to-1)/a.bs+1] {
		if b < 0 || int(b)*a.blockStride+last > len(a.kv) {
			panic("cpufallback: decodeAttention: a block outside the cache")
		}
	}
	C.ss_decode_attention(C.int(a.group), C.int(a.hd), C.int(a.from), C.int(a.to), fp(a.kv[a.base:]), C.long(a.blockStride),
		C.int(a.bs), C.int(a.rowStride), C.long(a.valOff), (*C.int)(unsafe.Pointer(unsafe.SliceData(a.table))),
		C.float(a.scale), fp(a.q), fp(a.out), fp(a.scores))
}

func avx2SoftmaxRow(y []float32) {
	if len(y) > 0 {
		C.ss_add_softmax(fp(y), nil, 1, C.int(len(y)))
	}
}

func avx2SiluMul(gate, up []float32) {
	if len(up) < len(gate) {
		panic("cpufallback: siluMul: mismatched shapes")
	}
	if len(gate) > 0 {
		C.ss_silu_mul(fp(gate), fp(up), C.long(len(gate)))
	}
}

func avx2ResidualNorm(x, y, bias []float32, n models.Norm, eps float64) {
	if len(x) == 0 {
		return
	}
	H := len(bias)
	if len(y) < len(x) || len(n.Weight) != H || len(n.Bias) != H {
		panic("cpufallback: residualNorm: mismatched shapes")
	}
	C.ss_residual_norm(fp(x), fp(y), fp(bias), fp(n.Weight), fp(n.Bias), rows(x, H), C.int(H), C.float(eps))
}

func avx2LayerNormRows(x []float32, n models.Norm, eps float64) {
	if len(x) == 0 {
		return
	}
	H := len(n.Weight)
	if len(n.Bias) != H {
		panic("cpufallback: layerNorm: mismatched shapes")
	}
	C.ss_layer_norm(fp(x), fp(n.Weight), fp(n.Bias), rows(x, H), C.int(H), C.float(eps))
}
