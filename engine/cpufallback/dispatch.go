package cpufallback

import (
	"fmt"
	"os"
	"strings"

	"github.com/stepserve/stepserve/models"
)

// The engine's kernels are chosen once, at start-up, from what the CPU has:
// native builds (cgo, without the purego tag) register their instruction
// sets' matrix-product kernels best first (gemm_native.go), and the
// element-wise passes' native versions (kernels_native.go); the portable
// Go passes and the build's BLAS (gonum, or OpenBLAS with the openblas tag)
// are the fallback and the reference. STEPSERVE_CPU_KERNELS names a set
// instead of the best: avx512, avx2 or go (a machine with less, for
// measurements and tests).

// KernelsEnv is the environment variable that overrides the kernels' choice.
const KernelsEnv = "STEPSERVE_CPU_KERNELS"

// productKernel is one instruction set's matrix products.
type productKernel struct {
	name string // "avx512", "avx2": Kernels() while in use
	// isa is the native kernels' instruction set (gemm_native.h's
	// SS_ISA_*), for a crew's threads to call them; 0 for others.
	isa int
	// width is the micro-kernel's panel width: resident weights are packed
	// in panels of width output columns.
	width int
	// pack returns B [k, n] (or [n, k] when trans), row stride ldb, in
	// panels of width columns.
	pack func(k, n int, b []float32, ldb int, trans bool) []float32
	// gemm is gemm's contract on an unpacked B (it packs into scratch).
	gemm func(transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)
	// linear computes y[m, n] = act(x[m, k] · packed + bias), bias nil for
	// none, on the output columns of panels p0 up to p1.
	linear func(m, n, k int, x, packed, y, bias []float32, act activation, p0, p1 int)
	// attention is one head of one sequence of S rows (row stride ld):
	// ctx = softmax(q · kᵀ · scale + keys) · v, keys nil for no mask, on
	// the S x S block scores; nil where the kernels have none (the step
	// then runs gemm, addSoftmaxRows, gemm).
	attention func(S, d, ld int, scale float32, q, k, v, keys, ctx, scores []float32)
	// packBF16 and linearBF16 are pack and linear in bfloat16 (products
	// summed in float32), where the CPU has AVX512_BF16; nil elsewhere.
	// packBF16 takes B as torch stores a Linear's weight, [n, k].
	packBF16   func(k, n int, b []float32, ldb int) []uint16
	linearBF16 func(m, n, k int, x []float32, packed []uint16, y, bias []float32, act activation, p0, p1 int)
}

// wantsBF16 says whether a model gets bfloat16 products on the CPU
// engine: model.yaml's device_dtype: bfloat16 (its default, float16, is
// the rbln engine's; the CPU engine computes that in float32), where the
// kernels in use have them.
func wantsBF16(cfg *models.Config) bool {
	return cfg.DeviceDtype == "bfloat16" && products != nil && products.linearBF16 != nil
}

// ComputeDtype implements [engine.DtypeEngine]: bfloat16 where the model
// opts in and the kernels have it, float32 otherwise.
func (Engine) ComputeDtype(cfg *models.Config) string {
	if wantsBF16(cfg) {
		return "bfloat16"
	}
	return "float32"
}

// checkDtype refuses a model that asks the CPU engine itself (engine: cpu)
// for bfloat16 where the kernels in use have no bfloat16 products. A model
// written for another engine (the CPU engine as its failover, or as the
// server's default) computes in float32 there, as before.
func checkDtype(name string, cfg *models.Config) error {
	if cfg.DeviceDtype != "bfloat16" || cfg.Engine != "cpu" || wantsBF16(cfg) {
		return nil
	}
	return fmt.Errorf("cpufallback: model %s: device_dtype bfloat16 needs a CPU with AVX512_BF16 (vdpbf16ps) and the native kernels; this one runs kernels %s%s: remove device_dtype (the CPU engine computes in float32)",
		name, Kernels(), map[bool]string{true: " without bfloat16 products", false: ""}[products != nil])
}

var (
	// nativeProducts are the product kernels this build and CPU can run,
	// best first; registered by gemm_native.go's package variables.
	nativeProducts []productKernel
	// nativeElementWise installs the native element-wise passes, nil where
	// the build or CPU has none (kernels_native.go).
	nativeElementWise func()
	// products is the product kernel in use, nil for the build's BLAS.
	products *productKernel
	// kernelsErr says why STEPSERVE_CPU_KERNELS could not be followed;
	// Engine.Load returns it, so that a server does not run on kernels it
	// was not asked for.
	kernelsErr error
)

// chooseKernels installs the kernels named by want ("" for the best the
// CPU has). It runs at start-up (after every init that registers kernels)
// and in tests, never while a step runs.
func chooseKernels(want string) error {
	want = strings.ToLower(strings.TrimSpace(want))
	useGo := func() {
		products = nil
		kernelName = "go"
		biasAct, addSoftmaxRows, residualNorm, layerNormRows = goBiasAct, goAddSoftmaxRows, goResidualNorm, goLayerNormRows
		decodeAttention, siluMul, softmaxRow = nil, goSiluMul, goSoftmaxRow
	}
	if want == "go" {
		useGo()
		return nil
	}
	var names []string
	for i := range nativeProducts {
		k := &nativeProducts[i]
		names = append(names, k.name)
		if want == "" || want == k.name {
			products = k
			kernelName = k.name
			if nativeElementWise != nil {
				nativeElementWise()
			}
			return nil
		}
	}
	if want == "" {
		useGo()
		return nil
	}
	useGo()
	names = append(names, "go")
	return fmt.Errorf("cpufallback: %s=%s: this build and CPU run %s (kernels %q are for a CPU with that instruction set, in a build with cgo)",
		KernelsEnv, want, strings.Join(names, ", "), want)
}

// KernelNames lists the kernel sets this build and CPU can run, best first.
func KernelNames() []string {
	var names []string
	for _, k := range nativeProducts {
		names = append(names, k.name)
	}
	return append(names, "go")
}

// The native files register their kernels in package variables'
// initializers, which Go runs before any init function.
func init() {
	kernelsErr = chooseKernels(os.Getenv(KernelsEnv))
}

// SetKernels installs the kernel set named (one of KernelNames, or "" for
// the best), as STEPSERVE_CPU_KERNELS does at start-up; for benchmarks that
// compare them in one process. Programs keep the weights packed for the set
// in use when they were loaded: load after it, and step no program while it
// runs.
func SetKernels(name string) error {
	err := chooseKernels(name)
	kernelsErr = err
	return err
}

// BFloat16 reports whether the kernels in use have bfloat16 products
// (device_dtype: bfloat16 runs in bfloat16).
func BFloat16() bool { return products != nil && products.linearBF16 != nil }
