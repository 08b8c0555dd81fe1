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
// gonum's products here run serially (see tileProducts) whatever it is.
var setBLASThreads func(n int)

// blasThreads reads the BLAS's thread bound back (tests).
var blasThreads func() int

// SetThreads bounds the threads the CPU engine's products use, n of them,
// or with n 0 half the CPUs (at least 1): the step runs one at a time per
// model, and the other CPUs are left to HTTP, tokenizing and encoding,
// which run beside it. A BLAS thread that waits for work spins on its CPU,
// so more threads than that slow a loaded server down. It returns the
// number in effect: always 1 with gonum.
func SetThreads(n int) int {
	if n == 0 {
		n = max(1, runtime.NumCPU()/2)
	}
	if setBLASThreads == nil {
		return 1
	}
	setBLASThreads(n)
	return n
}
