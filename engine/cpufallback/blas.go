package cpufallback

import (
	"runtime"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// The BLAS behind the engine's products. Builds with cgo and the openblas
// tag (make does this where libopenblas-dev is installed) route Sgemm to
// OpenBLAS; other builds use gonum's pure Go.
var (
	impl     blas.Float32Level3 = gonum.Implementation{}
	blasName                    = "gonum"
	// tileProducts keeps gonum's Sgemm on its serial, allocation-free path
	// by splitting products into tiles; OpenBLAS needs no such help.
	tileProducts = true
)

// BLAS names the implementation of the engine's matrix products: "openblas"
// or "gonum". It is exported as stepserve_build_info's blas label.
func BLAS() string { return blasName }

// setBLASThreads bounds the BLAS's threads; builds with OpenBLAS set it.
var setBLASThreads func(n int)

// blasThreads reads the BLAS's thread bound back (tests).
var blasThreads func() int

// SetThreads sets how many CPUs one step may use, n of them or with n 0
// every CPU, and returns the number in effect. The encoder splits a
// step's sequences into that many groups that run side by side (each
// sequence depends on its own rows alone); the BLAS runs each product on
// one thread, because an idle OpenBLAS thread spins on its CPU and takes
// it from the HTTP, tokenizing and encoding work that runs beside the
// steps (a third of a loaded 2-CPU server went to that spinning).
func SetThreads(n int) int {
	if n == 0 {
		n = runtime.NumCPU()
	}
	parallelism.Store(int32(n))
	return n
}
