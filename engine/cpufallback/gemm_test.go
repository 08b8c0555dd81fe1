package cpufallback

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/models"
)

func randMatrix(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

// closeTo checks got against gonum's answer want within float32 rounding of
// a k-term dot product: the kernels sum in a different order.
func closeTo(t *testing.T, want, got []float32, k int, format string, args ...any) {
	t.Helper()
	tol := 2e-6 * math.Sqrt(float64(max(k, 1))) * 4
	for i := range want {
		if d := math.Abs(float64(want[i]) - float64(got[i])); d > tol*math.Max(1, math.Abs(float64(want[i]))) {
			t.Fatalf(format+": element %d: %g, gonum %g (tolerance %g)", append(args, i, got[i], want[i], tol)...)
		}
	}
}

// Every product kernel this build and CPU run, against gonum's Sgemm: odd
// sizes (1 up to 300, non-multiples of the vector and panel widths), B
// plain and transposed, strided operands like one attention head's
// columns, alpha and beta.
func TestProductKernelsAgainstGonum(t *testing.T) {
	if len(nativeProducts) == 0 {
		t.Skip("no native product kernels in this build or on this CPU")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	sizes := []int{1, 2, 5, 7, 8, 13, 16, 17, 31, 32, 33, 64, 100, 127, 300}
	type shape struct{ m, n, k int }
	var shapes []shape
	for range 60 {
		shapes = append(shapes, shape{sizes[rng.IntN(len(sizes))], sizes[rng.IntN(len(sizes))], sizes[rng.IntN(len(sizes))]})
	}
	shapes = append(shapes, shape{1, 1, 1}, shape{300, 300, 300}, shape{9, 47, 600}, shape{128, 384, 384})
	// The few-row tiles (a decode step's products): every row count, K
	// over one block and not a multiple of anything.
	shapes = append(shapes, shape{1, 70, 600}, shape{2, 33, 1}, shape{3, 47, 385}, shape{4, 64, 1537})
	for _, pk := range nativeProducts {
		for _, s := range shapes {
			for _, transB := range []bool{false, true} {
				// Strides wider than the matrices, as for one head of a
				// [rows, H] activation.
				lda, ldb, ldc := s.k+3, s.n+5, s.n+2
				if transB {
					ldb = s.k + 1
				}
				a := randMatrix(rng, s.m*lda)
				b := randMatrix(rng, max(s.k, s.n)*ldb)
				c0 := randMatrix(rng, s.m*ldc)
				for _, ab := range [][2]float32{{1, 0}, {0.125, 0}, {0.5, 1.5}} {
					want := append([]float32(nil), c0...)
					tb := blas.NoTrans
					if transB {
						tb = blas.Trans
					}
					gonum.Implementation{}.Sgemm(blas.NoTrans, tb, s.m, s.n, s.k, ab[0], a, lda, b, ldb, ab[1], want, ldc)
					got := append([]float32(nil), c0...)
					pk.gemm(transB, s.m, s.n, s.k, ab[0], a, lda, b, ldb, ab[1], got, ldc)
					closeTo(t, want, got, s.k, "%s gemm %+v transB %v alpha, beta %v", pk.name, s, transB, ab)
				}
			}
			// linear on packed weights, with the fused bias and activation,
			// whole and split into panel ranges (as threads split it).
			x := randMatrix(rng, s.m*s.k)
			w := randMatrix(rng, s.n*s.k) // torch's [out, in]
			bias := randMatrix(rng, s.n)
			packed := pk.pack(s.k, s.n, w, s.k, true)
			panels := (s.n + pk.width - 1) / pk.width
			for _, act := range []activation{actNone, actReLU, actGELU, actGELUTanh} {
				want := make([]float32, s.m*s.n)
				gonum.Implementation{}.Sgemm(blas.NoTrans, blas.Trans, s.m, s.n, s.k, 1, x, s.k, w, s.k, 0, want, s.n)
				goBiasAct(want, bias, act)
				got := make([]float32, s.m*s.n)
				mid := panels / 2
				pk.linear(s.m, s.n, s.k, x, packed, got, bias, act, 0, mid)
				pk.linear(s.m, s.n, s.k, x, packed, got, bias, act, mid, panels)
				closeTo(t, want, got, s.k, "%s linear %+v act %d", pk.name, s, act)
			}
		}
	}
}

// The product path the engine takes (gemm, linear, resident) agrees with
// the BLAS under each kernel set, the portable one included.
func TestChosenKernelsAgainstBLAS(t *testing.T) {
	defer func() { require.NoError(t, chooseKernels("")) }()
	rng := rand.New(rand.NewPCG(5, 6))
	m, n, k := 37, 70, 45
	x := randMatrix(rng, m*k)
	w := randMatrix(rng, n*k)
	want := make([]float32, m*n)
	gonum.Implementation{}.Sgemm(blas.NoTrans, blas.Trans, m, n, k, 1, x, k, w, k, 0, want, n)
	for _, name := range KernelNames() {
		require.NoError(t, chooseKernels(name))
		require.Equal(t, name, Kernels())
		l := linearOf(w, n, k)
		got := make([]float32, m*n)
		linear(m, n, k, x, resident(l, formatF32), got)
		closeTo(t, want, got, k, "kernels %s: linear", name)
		got2 := make([]float32, m*n)
		gemm(true, m, n, k, 1, x, k, w, k, 0, got2, n)
		closeTo(t, want, got2, k, "kernels %s: gemm", name)
	}
	require.Error(t, chooseKernels("sse9"), "an unknown kernel set is refused")

	// STEPSERVE_CPU_KERNELS naming a set this CPU or build lacks: every
	// load says so, rather than run on other kernels.
	require.Error(t, SetKernels("sse9"))
	defer func() { require.NoError(t, SetKernels("")) }()
	model, err := models.Load("testdata/encoder")
	require.NoError(t, err)
	_, err = Engine{}.Load(context.Background(), model, []bucketing.Shape{{Batch: 1, Seq: 32}})
	require.ErrorContains(t, err, KernelsEnv+"=sse9: this build and CPU run")
}

func linearOf(w []float32, out, in int) *models.Linear {
	return &models.Linear{In: in, Out: out, Weight: w, Bias: make([]float32, out)}
}

// The products of one MiniLM-sized layer (hidden 384, intermediate 1536) at
// 128 and 2048 rows, on one thread, on every kernel set and the BLAS.
func BenchmarkProducts(b *testing.B) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, s := range []struct{ m, n, k int }{{128, 384, 384}, {128, 1536, 384}, {128, 384, 1536}, {2048, 384, 384}, {2048, 1536, 384}, {2048, 384, 1536}} {
		x := randMatrix(rng, s.m*s.k)
		w := randMatrix(rng, s.n*s.k)
		y := make([]float32, s.m*s.n)
		for _, pk := range append([]productKernel{{name: "blas-" + blasName}}, nativeProducts...) {
			b.Run(fmt.Sprintf("%dx%dx%d/%s", s.m, s.n, s.k, pk.name), func(b *testing.B) {
				var run func()
				if pk.pack == nil {
					wT := transposed(linearOf(w, s.n, s.k))
					run = func() { blasGemm(false, s.m, s.n, s.k, 1, x, s.k, wT, s.n, 0, y, s.n) }
				} else {
					packed := pk.pack(s.k, s.n, w, s.k, true)
					run = func() { pk.linear(s.m, s.n, s.k, x, packed, y, nil, actNone, 0, (s.n+pk.width-1)/pk.width) }
				}
				b.ReportAllocs()
				for b.Loop() {
					run()
				}
				b.ReportMetric(2*float64(s.m*s.n*s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// bf16 rounds to bfloat16 to nearest even, as the kernels do.
func bf16(f float32) float64 {
	u := math.Float32bits(f)
	u = (u + 0x7fff + (u>>16)&1) &^ 0xffff
	return float64(math.Float32frombits(u))
}

// The bfloat16 products are the float64 products of the bfloat16-rounded
// operands, to within float32 summation: odd k (a padded pair), widths not
// a multiple of the panel, split panel ranges, the epilogue.
func TestBF16ProductsAgainstRoundedOperands(t *testing.T) {
	var pk *productKernel
	for i := range nativeProducts {
		if nativeProducts[i].linearBF16 != nil {
			pk = &nativeProducts[i]
		}
	}
	if pk == nil {
		t.Skip("no bfloat16 products on this CPU (AVX512_BF16) or in this build")
	}
	rng := rand.New(rand.NewPCG(9, 10))
	for _, s := range []struct{ m, n, k int }{{1, 1, 1}, {3, 17, 5}, {9, 33, 257}, {100, 70, 384}, {97, 384, 600}, {8, 64, 1536},
		{1, 96, 2001}, {2, 40, 7}, {4, 65, 1537}} {
		x := randMatrix(rng, s.m*s.k)
		w := randMatrix(rng, s.n*s.k)
		bias := randMatrix(rng, s.n)
		packed := pk.packBF16(s.k, s.n, w, s.k)
		panels := (s.n + 31) / 32
		for _, act := range []activation{actNone, actGELU, actGELUTanh} {
			got := make([]float32, s.m*s.n)
			pk.linearBF16(s.m, s.n, s.k, x, packed, got, bias, act, 0, panels/2)
			pk.linearBF16(s.m, s.n, s.k, x, packed, got, bias, act, panels/2, panels)
			want := make([]float32, s.m*s.n)
			for i := range s.m {
				for j := range s.n {
					var d float64
					for p := range s.k {
						d += bf16(x[i*s.k+p]) * bf16(w[j*s.k+p])
					}
					want[i*s.n+j] = float32(d)
				}
			}
			goBiasAct(want, bias, act)
			closeTo(t, want, got, s.k, "bf16 linear %+v act %d", s, act)
		}
	}
}

// linearPar splits a product's panels among threads: the same result as
// one thread, with nothing allocated per call, also from several callers
// at once (as replicas step side by side).
func TestLinearParMatchesSerial(t *testing.T) {
	defer SetThreads(0)
	SetThreads(4)
	rng := rand.New(rand.NewPCG(11, 12))
	for _, s := range []struct{ m, n, k int }{{1, 384, 384}, {13, 1536, 384}, {128, 384, 1536}, {5, 7, 9}} {
		x := randMatrix(rng, s.m*s.k)
		l := linearOf(randMatrix(rng, s.n*s.k), s.n, s.k)
		l.Bias = randMatrix(rng, s.n)
		w := resident(l, formatF32)
		want := make([]float32, s.m*s.n)
		linearPanels(s.m, x, w, want, l.Bias, actGELU, 0, w.panels())
		var wg sync.WaitGroup
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 20 {
					got := make([]float32, s.m*s.n)
					linearPar(nil, 4, s.m, x, w, got, l.Bias, actGELU)
					if !slices.Equal(want, got) {
						t.Errorf("%+v: linearPar differs from one thread", s)
						return
					}
				}
			}()
		}
		wg.Wait()
		got := make([]float32, s.m*s.n)
		assert.Zero(t, testing.AllocsPerRun(20, func() { linearPar(nil, 4, s.m, x, w, got, l.Bias, actGELU) }), "%+v", s)
	}
}

// linearPar at MiniLM's products of one 128-token sequence, on 1 and 2
// threads: how far splitting panels scales.
func BenchmarkLinearPar(b *testing.B) {
	rng := rand.New(rand.NewPCG(13, 14))
	for _, s := range []struct{ m, n, k int }{{128, 384, 384}, {128, 1536, 384}, {128, 384, 1536}} {
		x := randMatrix(rng, s.m*s.k)
		w := resident(linearOf(randMatrix(rng, s.n*s.k), s.n, s.k), formatF32)
		y := make([]float32, s.m*s.n)
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("%dx%dx%d/%d", s.m, s.n, s.k, threads), func(b *testing.B) {
				defer SetThreads(0)
				SetThreads(threads)
				for b.Loop() {
					linearPar(nil, threads, s.m, x, w, y, nil, actNone)
				}
				b.ReportMetric(2*float64(s.m*s.n*s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// panicky is a rangeTask whose chunk bad panics.
type panicky struct {
	bad  int
	done atomic.Int64
}

func (p *panicky) run(i int) {
	if i == p.bad {
		panic("chunk failed")
	}
	p.done.Add(1)
}

// TestTeamPanicReachesTheCaller: a chunk that panics on a helper does not
// end the process from the helper's goroutine: the caller gets the panic
// once every chunk has run, and the team serves the next call.
func TestTeamPanicReachesTheCaller(t *testing.T) {
	for bad := range 16 {
		p := &panicky{bad: bad}
		func() {
			defer func() { assert.Equal(t, "chunk failed", recover()) }()
			parallelRun(p, 16, 2)
		}()
		assert.Equal(t, int64(15), p.done.Load(), "every other chunk ran")
	}
	ok := &panicky{bad: -1}
	parallelRun(ok, 64, 2)
	assert.Equal(t, int64(64), ok.done.Load())

	// On one CPU (or with every job slot taken) the chunks run on the
	// caller, under the same contract.
	p := &panicky{bad: 3}
	func() {
		defer func() { assert.Equal(t, "chunk failed", recover()) }()
		serialRun(p, 16)
	}()
	assert.Equal(t, int64(15), p.done.Load(), "every other chunk ran on the caller")
}
