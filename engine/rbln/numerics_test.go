package rbln

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// inDeviceDtype makes the worker compute on torch's CPU in the model's
// device_dtype rather than float32 (worker.py's CPU_DTYPE_ENV).
var inDeviceDtype = map[string]string{"STEPSERVE_WORKER_CPU_DTYPE": "device"}

// warmRunner loads m on e with the grid's buckets and warms it up.
func warmRunner(t *testing.T, m *models.Model, e engine.Engine, grid *bucketing.Grid) *steps.Runner {
	t.Helper()
	_, r, err := loadAndWarm(t, e, m, grid, false)
	require.NoError(t, err)
	return r
}

// onlyProgram is the one program loaded on e.
func onlyProgram(t *testing.T, e *Engine) *program {
	t.Helper()
	w := e.workers[0]
	w.mu.Lock()
	defer w.mu.Unlock()
	require.Len(t, w.programs, 1)
	for p := range w.programs {
		return p
	}
	return nil
}

// stagedAs asserts that the worker reads and writes p's staging as it
// says (its load reply): floats in bfloat16, 2 bytes each, token ids in
// int32, rows padded to 64; and logs the bytes a step moves each way.
func stagedAs(t *testing.T, p *program, in string) {
	t.Helper()
	p.mu.Lock()
	mapped := p.mapped
	p.mu.Unlock()
	require.Len(t, mapped, len(p.shapes))
	for i, v := range mapped {
		b, l := &p.bounds[i], &p.layouts[i]
		size := map[string]int{"bfloat16": 2, "int32": 4}[in]
		assert.Equal(t, tensorView{Dtype: in, Shape: []int{b.batch, b.in.row}, ElementBytes: size}, v.In, "bucket %s", p.shapes[i].Label())
		assert.Equal(t, tensorView{Dtype: "bfloat16", Shape: []int{b.batch, b.out.row}, ElementBytes: 2}, v.Out, "bucket %s", p.shapes[i].Label())
		assert.Zero(t, b.in.row%64+b.out.row%64)
		t.Logf("bucket %s: a step moves %d bytes in, %d out (in the host layout %d and %d)", p.shapes[i].Label(),
			b.in.bytes(b.batch), b.out.bytes(b.batch), l.InBytes, l.OutBytes)
	}
}

func argmax(v []float64) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

func cosine(a, b []float64) float64 {
	var ab, aa, bb float64
	for i := range a {
		ab, aa, bb = ab+a[i]*b[i], aa+a[i]*a[i], bb+b[i]*b[i]
	}
	return ab / math.Sqrt(aa*bb)
}

// TestBFloat16DigitsMatchTheCPUEngine runs digits in bfloat16 in a real
// worker and in float32 on the Go CPU engine: every probability within
// 0.05, and so every row's class agrees where the float32 engine's best
// two are more than 0.1 apart. Closer rows are not held to one class:
// torch's bfloat16 products are chosen by cpuid (oneDNN's AVX512-BF16 or
// AMX kernels, or ATen's own), and their rounding may settle a near tie
// either way on another CPU.
func TestBFloat16DigitsMatchTheCPUEngine(t *testing.T) {
	requireTorch(t)
	e, _ := newEngine(t, Options{Env: inDeviceDtype})
	m := loadDigits(t)
	m.Config.DeviceDtype = "bfloat16"
	grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, nil)
	require.NoError(t, err)
	onWorker, onCPU := warmRunner(t, m, e, grid), warmRunner(t, inFloat32(m), cpufallback.Engine{}, grid)
	stagedAs(t, onlyProgram(t, e), "bfloat16")
	worst, rows, decided := 0.0, 0, 0
	for _, n := range []int{1, 3, 17, 40} {
		a, b := digitsRequest(n, float32(n)), digitsRequest(n, float32(n))
		require.NoError(t, onWorker.Run(context.Background(), []*steps.Request{a}))
		require.NoError(t, onCPU.Run(context.Background(), []*steps.Request{b}))
		fa, fb := floats(a.Outputs[0]), floats(b.Outputs[0])
		for r := range n {
			pa, pb := fa[10*r:10*r+10], fb[10*r:10*r+10]
			if top2Gap(pb) > 0.1 {
				assert.Equal(t, argmax(pb), argmax(pa), "batch of %d, row %d: %v against %v", n, r, pa, pb)
				decided++
			}
			for i := range pa {
				worst = math.Max(worst, math.Abs(pa[i]-pb[i]))
			}
			rows++
		}
	}
	t.Logf("digits, bfloat16 worker against float32 Go: %d rows, argmax held on the %d clear ones, probabilities differ by %.2g at most", rows, decided, worst)
	assert.Greater(t, decided, rows/2, "most rows have a clear class")
	assert.Greater(t, worst, 0.0, "the worker computed in bfloat16, not float32")
	assert.Less(t, worst, 0.05)
}

// inFloat32 is m as the CPU engine computes it in float32: its
// device_dtype bfloat16 would ask that engine for bfloat16 products,
// which a CPU without AVX512_BF16 refuses (and one with it computes).
func inFloat32(m *models.Model) *models.Model {
	c := *m.Config
	c.DeviceDtype = "float16"
	f := *m
	f.Config = &c
	return &f
}

// top2Gap is how far the best of p is ahead of the second best.
func top2Gap(p []float64) float64 {
	best, second := math.Inf(-1), math.Inf(-1)
	for _, v := range p {
		switch {
		case v > best:
			best, second = v, best
		case v > second:
			second = v
		}
	}
	return best - second
}

// TestBFloat16EncoderMatchesTheCPUEngine runs tiny-encoder in bfloat16 in a
// real worker and in float32 on the Go CPU engine. Batches of 3 run in the
// 4-row bucket, whose padding row is all mask zeros: the bucket's outputs
// must stay finite for the warm-up and every step.
func TestBFloat16EncoderMatchesTheCPUEngine(t *testing.T) {
	requireTorch(t)
	e, _ := newEngine(t, Options{Env: inDeviceDtype})
	m, err := models.Load("../../model_repository/tiny-encoder")
	require.NoError(t, err)
	m.Config.DeviceDtype = "bfloat16"
	grid, err := bucketing.NewGrid([]int{1, 4}, []int{32, 64})
	require.NoError(t, err)
	onWorker, onCPU := warmRunner(t, m, e, grid), warmRunner(t, inFloat32(m), cpufallback.Engine{}, grid)
	stagedAs(t, onlyProgram(t, e), "int32")
	hidden := m.Config.Encoder.Hidden
	batches := [][]string{
		{"hello"},
		{"the quick brown fox jumps over the lazy dog", "a", "serving encoders on an npu in half precision"},
		{strings.Repeat("many tokens make a long sequence ", 3), "short one"},
	}
	minCos, worst, rows := 1.0, 0.0, 0
	for _, texts := range batches {
		run := func(r *steps.Runner) []float64 {
			in, seq, err := m.PrepareInputs(nil, []models.Input{{Shape: []int64{int64(len(texts))}, Strings: texts}})
			require.NoError(t, err)
			q := &steps.Request{Rows: len(texts), Seq: seq, Inputs: in, Outputs: [][]byte{make([]byte, 4*hidden*len(texts))}}
			require.NoError(t, r.Run(context.Background(), []*steps.Request{q}))
			return floats(q.Outputs[0])
		}
		got, want := run(onWorker), run(onCPU)
		for r := range texts {
			a, b := got[hidden*r:hidden*(r+1)], want[hidden*r:hidden*(r+1)]
			c := cosine(a, b)
			assert.GreaterOrEqual(t, c, 0.999, "%q", texts[r])
			minCos = math.Min(minCos, c)
			for i := range a {
				worst = math.Max(worst, math.Abs(a[i]-b[i]))
			}
			rows++
		}
	}
	t.Logf("tiny-encoder, bfloat16 worker against float32 Go: %d rows, cosine %.6f at least, elements differ by %.2g at most", rows, minCos, worst)
	assert.Greater(t, worst, 0.0, "the worker computed in bfloat16, not float32")
}

// TestWarmupRunsEachBucketTwice counts the worker's steps (the test double
// logs every explain region): two per bucket at load, where the first
// release ran four, and two per bucket again when a restarted worker
// reloads the model, so that no client's step builds a graph.
func TestWarmupRunsEachBucketTwice(t *testing.T) {
	requireTorch(t)
	log := filepath.Join(t.TempDir(), "regions")
	e, _ := newEngine(t, Options{Env: map[string]string{"PYTHONPATH": fakeRBLN(), "STEPSERVE_FAKE_RBLN_REGIONS": log}})
	regions := func() int {
		b, err := os.ReadFile(log)
		if os.IsNotExist(err) {
			return 0
		}
		require.NoError(t, err)
		return strings.Count(string(b), "\n")
	}
	m := loadDigits(t)
	grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, nil)
	require.NoError(t, err)
	r := warmRunner(t, m, e, grid)
	buckets := len(grid.Shapes())
	assert.Equal(t, 2*buckets, regions(), "two runs per bucket at load")

	require.NoError(t, r.Run(context.Background(), []*steps.Request{digitsRequest(3, 1)}))
	assert.Equal(t, 2*buckets+1, regions(), "one run per step")

	w := e.workers[0]
	w.mu.Lock()
	var p *program
	for q := range w.programs {
		p = q
	}
	w.mu.Unlock()
	e.KillWorker("cpu") // the torch engine's one worker
	assert.Eventually(t, func() bool { return !p.Healthy() }, 5*time.Second, time.Millisecond)
	waitHealthy(t, p, time.Minute)
	assert.Equal(t, 4*buckets+1, regions(), "two runs per bucket when a restarted worker reloads")
}

// TestWarmupFailsOnNaNOutputs: a model whose outputs are NaN on the zeroed
// warm-up input fails the rbln load, naming the bucket. Its weights are
// finite but overflow: zeros in give the first layer's bias (1e30), the
// second layer's 1e30 weights make that +inf, and the third sums +inf and
// -inf.
func TestWarmupFailsOnNaNOutputs(t *testing.T) {
	requireTorch(t)
	dir := t.TempDir()
	fill := func(n int, v func(i int) float32) []float32 {
		out := make([]float32, n)
		for i := range out {
			out[i] = v(i)
		}
		return out
	}
	huge := func(int) float32 { return 1e30 }
	f, err := os.Create(filepath.Join(dir, "weights.safetensors"))
	require.NoError(t, err)
	require.NoError(t, models.WriteSafetensors(f, []*models.Tensor{
		{Name: "layers.0.weight", Shape: []int{64, 64}, Data: make([]float32, 64*64)},
		{Name: "layers.0.bias", Shape: []int{64}, Data: fill(64, huge)},
		{Name: "layers.1.weight", Shape: []int{64, 64}, Data: fill(64*64, huge)},
		{Name: "layers.1.bias", Shape: []int{64}, Data: make([]float32, 64)},
		{Name: "layers.2.weight", Shape: []int{64, 64}, Data: fill(64*64, func(i int) float32 { return float32(1 - 2*(i%2)) })},
		{Name: "layers.2.bias", Shape: []int{64}, Data: make([]float32, 64)},
	}, nil))
	require.NoError(t, f.Close())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.yaml"), []byte(`
architecture: mlp
mlp: {sizes: [64, 64, 64, 64]}
inputs: [{name: x, datatype: FP32, shape: [-1, 64]}]
outputs: [{name: y, datatype: FP32, shape: [-1, 64]}]
buckets: {batch: [2, 4]}
device_dtype: bfloat16
`), 0o644))
	m, err := models.Load(dir)
	require.NoError(t, err)
	e, _ := newEngine(t, Options{Env: inDeviceDtype})
	grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, nil)
	require.NoError(t, err)
	prog, err := e.Load(context.Background(), m, grid.Shapes())
	require.NoError(t, err)
	defer prog.Close()
	r, err := steps.New(steps.Options{Model: m, Program: prog, Grid: grid, Engine: e.Name(), StrictWarmup: true})
	require.NoError(t, err)
	_, err = r.Warmup(context.Background())
	assert.EqualError(t, err, `steps: model `+m.Name+`: warm-up of bucket b2: output "y" has a non-finite value (NaN) at element 0`)
}
