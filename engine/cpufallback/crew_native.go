//go:build cgo && !purego

package cpufallback

/*
#cgo CFLAGS: -O2
#cgo LDFLAGS: -lpthread
#include "crew_native.h"
#include "q8_native.h"
*/
import "C"

import (
	"unsafe"

	"github.com/stepserve/stepserve/models"
)

// nativeCrew is a crew's threads in C (crew_native.c).
type nativeCrew C.ss_crew

func newNativeCrew() *nativeCrew { return (*nativeCrew)(C.ss_crew_new()) }

func (n *nativeCrew) c() *C.ss_crew { return (*C.ss_crew)(n) }

func (n *nativeCrew) begin(threads int) { C.ss_crew_begin(n.c(), C.int(threads)) }

func (n *nativeCrew) end() { C.ss_crew_end(n.c()) }

// helped counts the chunks the crew's own threads (not its callers) ran.
func (n *nativeCrew) helped() int { return int(C.ss_crew_helped(n.c())) }

func failed(rc C.int) {
	if rc != 0 {
		panic("cpufallback: a crew's product: out of memory for the packing scratch")
	}
}

// linear runs t's products as chunks of panels on the crew's threads:
// the kernels of linearPanels, with the same shape checks first.
func (n *nativeCrew) linear(t *linearTask, chunks int) {
	var (
		ns  [3]C.int
		w   [3]*C.float
		wb  [3]*C.ushort
		y   [3]*C.float
		b   [3]*C.float
		k   = 0
		act = C.int(t.act)
		// Q8_0 products: the weights, and x quantized.
		wq        [3]*C.schar
		wd        [3]*C.ushort
		qbits     [3]C.int
		qx        *C.schar
		dx        *C.float
		sx        *C.int
		kg, level C.int
	)
	if t.acts != nil {
		level, kg = q8ISA(), C.int(t.acts.blocks)
		qx, dx, sx = (*C.schar)(unsafe.Pointer(&t.acts.q[0])), fp(t.acts.d), (*C.int)(unsafe.Pointer(&t.acts.s[0]))
	}
	for i := range t.n {
		wt := t.w[i]
		k = wt.in
		if len(t.x) < t.m*wt.in || len(t.y[i]) < t.m*wt.out || (t.bias[i] != nil && len(t.bias[i]) < wt.out) {
			panic("cpufallback: linear: mismatched shapes")
		}
		ns[i] = C.int(wt.out)
		y[i] = fp(t.y[i])
		if t.bias[i] != nil {
			b[i] = fp(t.bias[i])
		}
		if wt.q8 != nil {
			if t.acts == nil || t.acts.blocks != wt.q8.blocks || t.acts.m < t.m || len(wt.q8.d) < wt.panels()*wt.q8.blocks*16 || len(wt.q8.q) < wt.panels()*wt.q8.blocks*wt.q8.bits*64 {
				panic("cpufallback: linear: mismatched shapes")
			}
			wq[i] = (*C.schar)(unsafe.Pointer(&wt.q8.q[0]))
			wd[i] = (*C.ushort)(unsafe.Pointer(&wt.q8.d[0]))
			qbits[i] = C.int(wt.q8.bits)
		} else if wt.bf16 != nil {
			if len(wt.bf16) < (wt.out+31)/32*32*((wt.in+1)/2*2) {
				panic("cpufallback: linear: mismatched shapes")
			}
			wb[i] = (*C.ushort)(unsafe.Pointer(&wt.bf16[0]))
		} else {
			if len(wt.f32) < wt.panels()*products.width*wt.in {
				panic("cpufallback: linear: mismatched shapes")
			}
			w[i] = fp(wt.f32)
		}
		if i > 0 && wt.in != t.w[0].in {
			panic("cpufallback: linear: products of one x with different widths")
		}
	}
	failed(C.ss_crew_linear(n.c(), C.int(products.isa), C.int(chunks), C.int(t.m), C.int(k), C.int(t.n), act, fp(t.x),
		ns[0], ns[1], ns[2], w[0], w[1], w[2], wb[0], wb[1], wb[2], y[0], y[1], y[2], b[0], b[1], b[2],
		level, kg, qx, dx, sx, wq[0], wq[1], wq[2], wd[0], wd[1], wd[2], qbits[0], qbits[1], qbits[2]))
}

// attention runs a's sequence's heads as chunks, each on its thread's
// score block (a.scores[t], every block the same length).
func (n *nativeCrew) attention(a *attnTask, heads, S, H, d int, q, k, v, keys, ctx []float32, threads int) {
	stride := len(a.scores[0])
	if S*S > stride || (keys != nil && len(keys) < S) || len(q) < (S-1)*H+heads*d || len(k) < len(q) || len(v) < len(q) || len(ctx) < len(q) {
		panic("cpufallback: attention: mismatched shapes")
	}
	if len(a.scores) < threads {
		panic("cpufallback: attention: fewer score blocks than threads")
	}
	for i, s := range a.scores[:threads] {
		if len(s) != stride || unsafe.SliceData(s) != (*float32)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(a.scores[0])), i*stride*4)) {
			panic("cpufallback: attention: score blocks not one after another")
		}
	}
	failed(C.ss_crew_attention(n.c(), C.int(products.isa), C.int(heads), C.int(S), C.int(H), C.int(d), C.float(a.scale),
		fp(q), fp(k), fp(v), fp(keys), fp(ctx), fp(unsafe.Slice(unsafe.SliceData(a.scores[0]), threads*stride)), C.long(stride), C.int(threads)))
}

// norm is residualNorm's x = LayerNorm(x + y + bias) on the crew's
// threads, chunks of rows at a time.
func (n *nativeCrew) norm(x, y, bias []float32, nm models.Norm, eps float64, threads int) {
	H := len(bias)
	if H == 0 || len(x)%H != 0 || len(y) < len(x) || len(nm.Weight) != H || len(nm.Bias) != H {
		panic("cpufallback: residualNorm: mismatched shapes")
	}
	rows := len(x) / H
	if rows == 0 {
		return
	}
	per := max(1, (rows+2*threads-1)/(2*threads))
	failed(C.ss_crew_norm(n.c(), C.int((rows+per-1)/per), C.int(per), fp(x), fp(y), fp(bias), fp(nm.Weight), fp(nm.Bias),
		C.int(rows), C.int(H), C.float(eps)))
}
