package cpufallback

import (
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

// BLAS names the implementation of the engine's matrix products: "native"
// (stepserve's own kernels, Kernels() says for which instruction set),
// or the build's BLAS, "openblas" or "gonum", where they do not run. It is
// exported as stepserve_build_info's blas label.
func BLAS() string {
	if products != nil {
		return "native"
	}
	return blasName
}

// blasThreads reads the BLAS's thread bound back (tests); builds with
// OpenBLAS set it.
var blasThreads func() int
