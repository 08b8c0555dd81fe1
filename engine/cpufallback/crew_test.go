package cpufallback

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/models"
)

// withCrewCPUs lets crews run n threads whatever the machine has.
func withCrewCPUs(t *testing.T, n int) {
	old := crewCPUs
	crewCPUs = n
	t.Cleanup(func() { crewCPUs = old })
}

// skipWithoutCrews skips where the kernels in use have no native crew.
func skipWithoutCrews(t *testing.T) {
	c, _ := beginCrew(2)
	if c == nil {
		t.Skipf("no native crew with kernels %s in this build", Kernels())
	}
	c.end()
}

// A crew's products and layer norms answer bit for bit as one thread's
// (each output column is one kernel call's either way), in float32 and
// in bfloat16, on 2 to 5 threads (more than this machine may have CPUs:
// threads the OS runs late still finish the phase), with nothing
// allocated per call.
func TestCrewAnswersAsOneThread(t *testing.T) {
	withCrewCPUs(t, 8)
	skipWithoutCrews(t)
	rng := rand.New(rand.NewPCG(21, 22))
	for _, f := range []format{formatF32, formatBF16, formatQ8} {
		if f == formatBF16 && !BFloat16() {
			continue
		}
		for _, s := range []struct{ m, k, n int }{{1, 384, 384}, {13, 96, 1000}, {128, 384, 1152}, {64, 1536, 384}, {7, 33, 65}} {
			x := randMatrix(rng, s.m*s.k)
			var w [3]*weight
			var bias, want [3][]float32
			for i := range w {
				l := linearOf(randMatrix(rng, s.n*s.k), s.n, s.k)
				w[i] = resident(l, f)
				bias[i] = randMatrix(rng, s.n)
				want[i] = make([]float32, s.m*s.n)
				linearPanels(s.m, x, w[i], want[i], bias[i], actGELU, 0, w[i].panels())
			}
			for _, threads := range []int{2, 3, 5} {
				c, n := beginCrew(threads)
				require.NotNil(t, c)
				require.Equal(t, threads, n)
				var got [3][]float32
				for i := range got {
					got[i] = make([]float32, s.m*s.n)
				}
				run := func() {
					linearParN(c, threads, s.m, x, 3, w, got, bias, actGELU)
				}
				run()
				for i := range got {
					require.True(t, slices.Equal(want[i], got[i]), "format %v %+v on %d threads: product %d differs", f, s, threads, i)
				}
				assert.Zero(t, testing.AllocsPerRun(5, run), "format %v %+v", f, s)
				c.end()
			}
		}
	}

	norm := models.Norm{Weight: randMatrix(rng, 384), Bias: randMatrix(rng, 384)}
	for _, rows := range []int{16, 17, 128, 333} {
		x, y, bias := randMatrix(rng, rows*384), randMatrix(rng, rows*384), randMatrix(rng, 384)
		want := slices.Clone(x)
		residualNorm(want, y, bias, norm, 1e-12)
		for _, threads := range []int{2, 3, 5} {
			c, _ := beginCrew(threads)
			got := slices.Clone(x)
			c.residualNorm(got, y, bias, norm, 1e-12)
			require.True(t, slices.Equal(want, got), "%d rows on %d threads", rows, threads)
			c.end()
		}
	}
}

// Steps hold crews side by side (replicas, groups of sequences): more at
// once than there are crews, the ones without run on the team, and every
// answer is the one thread's.
func TestCrewsSideBySide(t *testing.T) {
	withCrewCPUs(t, 4)
	skipWithoutCrews(t)
	defer func(w int) { minParallelWork = w }(minParallelWork)
	minParallelWork = 0
	rng := rand.New(rand.NewPCG(23, 24))
	const m, k, n = 32, 128, 640
	x := randMatrix(rng, m*k)
	l := linearOf(randMatrix(rng, n*k), n, k)
	w := resident(l, formatF32)
	want := make([]float32, m*n)
	linearPanels(m, x, w, want, l.Bias, actReLU, 0, w.panels())
	var wg sync.WaitGroup
	errs := make(chan error, 2*maxCrews)
	for g := range 2 * maxCrews {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := make([]float32, m*n)
			for range 50 {
				c, n := beginCrew(2 + g%3)
				clear(got)
				linearPar(c, n, m, x, w, got, l.Bias, actReLU)
				c.end()
				if !slices.Equal(want, got) {
					errs <- fmt.Errorf("goroutine %d: the product differs", g)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Len(t, crews.free, maxCrews, "every crew went back")
	assert.Zero(t, crews.busy, "and its CPUs")
}

// Crews take only the CPUs the groups of sequences and crews already
// running leave: on 2 CPUs, a second group stepping beside a crew runs on
// its own thread; the most recently ended crew (its threads still
// spinning) is the next one held.
func TestCrewsLeaveTheCPUsOthersTake(t *testing.T) {
	withCrewCPUs(t, 2)
	groupRunning(1)
	a, n := beginCrew(4)
	if a == nil {
		groupRunning(-1)
		t.Skipf("no native crew with kernels %s in this build", Kernels())
	}
	assert.Equal(t, 2, n, "one group on 2 CPUs: a crew of 2")
	groupRunning(1)
	b, n := beginCrew(2)
	assert.Nil(t, b)
	assert.Equal(t, 1, n, "the CPUs are taken: one thread")
	groupRunning(-1)
	a.end()
	groupRunning(-1)
	assert.Zero(t, crews.busy)

	groupRunning(1)
	c, n := beginCrew(2)
	assert.Same(t, a, c, "the crew last ended is held again")
	assert.Equal(t, 2, n)
	c.end()

	// A step of a few tokens is not worth a crew's spinning: it splits on
	// the team.
	c, n = beginCrewFor(2, minCrewWork-1)
	assert.Nil(t, c)
	assert.Equal(t, 2, n)
	groupRunning(-1)
}

// The native attention head (softmax left unscaled, the context rows
// scaled instead) answers as the three passes it replaces, with and
// without a key mask, at odd lengths and head widths.
func TestAttentionHeadAsThreePasses(t *testing.T) {
	if products == nil || products.attention == nil {
		t.Skipf("no native attention head with kernels %s in this build", Kernels())
	}
	rng := rand.New(rand.NewPCG(25, 26))
	for _, s := range []struct{ S, d, heads int }{{1, 8, 1}, {7, 32, 3}, {33, 64, 2}, {128, 32, 12}, {200, 24, 4}} {
		H := s.d * s.heads
		q, k, v := randMatrix(rng, s.S*H), randMatrix(rng, s.S*H), randMatrix(rng, s.S*H)
		mask := make([]float32, s.S)
		for i := range mask {
			if i%3 == 2 {
				mask[i] = maskedScore
			}
		}
		for _, keys := range [][]float32{nil, mask} {
			want, got := make([]float32, s.S*H), make([]float32, s.S*H)
			scores := make([]float32, s.S*s.S)
			for h := range s.heads {
				off := h * s.d
				gemm(true, s.S, s.S, s.d, 0.125, q[off:], H, k[off:], H, 0, scores, s.S)
				add := keys
				if add == nil {
					add = make([]float32, s.S)
				}
				addSoftmaxRows(scores, add)
				gemm(false, s.S, s.d, s.S, 1, scores, s.S, v[off:], H, 0, want[off:], H)
				products.attention(s.S, s.d, H, 0.125, q[off:], k[off:], v[off:], keys, got[off:], scores)
			}
			for i := range want {
				require.InDelta(t, want[i], got[i], 1e-6*(1+math.Abs(float64(want[i]))), "%+v masked %v: element %d", s, keys != nil, i)
			}
		}
	}
}
