package cpufallback

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/models"
)

// randomMLP builds a model with the given widths and random weights.
func randomMLP(t testing.TB, sizes []int, act, out string) *models.Model {
	rng := rand.New(rand.NewPCG(1, 2))
	m := &models.MLP{Activation: act, OutputActivation: out}
	for i := 0; i+1 < len(sizes); i++ {
		l := models.Linear{In: sizes[i], Out: sizes[i+1], Weight: make([]float32, sizes[i]*sizes[i+1]), Bias: make([]float32, sizes[i+1])}
		for j := range l.Weight {
			l.Weight[j] = float32(rng.NormFloat64() / math.Sqrt(float64(sizes[i])))
		}
		for j := range l.Bias {
			l.Bias[j] = float32(rng.NormFloat64() * 0.1)
		}
		m.Layers = append(m.Layers, l)
	}
	cfg := &models.Config{
		Architecture: "mlp",
		MLP:          &models.MLPConfig{Sizes: sizes, Activation: act, OutputActivation: out},
		Inputs:       []models.TensorSpec{{Name: "x", Datatype: models.FP32, Shape: []int{-1, sizes[0]}}},
		Outputs:      []models.TensorSpec{{Name: "y", Datatype: models.FP32, Shape: []int{-1, sizes[len(sizes)-1]}}},
	}
	return &models.Model{Name: "test", Config: cfg, MLP: m}
}

// reference computes the MLP naively in float64.
func reference(m *models.MLP, x []float64) []float64 {
	for i, l := range m.Layers {
		y := make([]float64, l.Out)
		for o := range y {
			v := float64(l.Bias[o])
			for k := range x {
				v += float64(l.Weight[o*l.In+k]) * x[k]
			}
			y[o] = v
		}
		last := i == len(m.Layers)-1
		for o := range y {
			switch {
			case !last && m.Activation == "relu":
				y[o] = math.Max(y[o], 0)
			case !last && m.Activation == "gelu":
				y[o] = 0.5 * y[o] * (1 + math.Erf(y[o]/math.Sqrt2))
			}
		}
		if last && m.OutputActivation == "softmax" {
			mx, sum := math.Inf(-1), 0.0
			for _, v := range y {
				mx = math.Max(mx, v)
			}
			for o := range y {
				y[o] = math.Exp(y[o] - mx)
				sum += y[o]
			}
			for o := range y {
				y[o] /= sum
			}
		}
		x = y
	}
	return x
}

func TestStepMatchesReference(t *testing.T) {
	// Widths above the gemm tiles (64 rows, 128 columns) exercise the tiling.
	for _, tc := range []struct {
		sizes    []int
		act, out string
	}{
		{[]int{64, 128, 10}, "relu", "softmax"},
		{[]int{70, 300, 130, 5}, "gelu", "none"},
	} {
		m := randomMLP(t, tc.sizes, tc.act, tc.out)
		buckets := []bucketing.Shape{{Batch: 1}, {Batch: 3}, {Batch: 100}}
		p, err := Engine{}.Load(context.Background(), m, buckets)
		require.NoError(t, err)
		rng := rand.New(rand.NewPCG(3, 4))
		for b, s := range buckets {
			require.NoError(t, p.Compile(context.Background(), b))
			in, out := p.Staging(b)
			x := floats(in)
			for i := range x {
				x[i] = float32(rng.Float64()*4 - 2)
			}
			rep, err := p.Step(context.Background(), b)
			require.NoError(t, err)
			assert.True(t, rep.Clean)
			assert.Equal(t, engine.Count(1), rep.H2D)
			assert.Equal(t, engine.Count(1), rep.D2H)
			assert.Equal(t, engine.Count(0), rep.Recompiles)

			width, outW := tc.sizes[0], tc.sizes[len(tc.sizes)-1]
			y := floats(out)
			for r := 0; r < s.Batch; r++ {
				row := make([]float64, width)
				for k := range row {
					row[k] = float64(x[r*width+k])
				}
				want := reference(m.MLP, row)
				for o := range want {
					assert.InDelta(t, want[o], float64(y[r*outW+o]), 1e-4, "sizes %v bucket %d row %d out %d", tc.sizes, s.Batch, r, o)
				}
			}
		}
		require.NoError(t, p.Close())
	}
}

func TestStepDoesNotAllocate(t *testing.T) {
	m := randomMLP(t, []int{64, 128, 10}, "relu", "softmax")
	buckets := []bucketing.Shape{{Batch: 1}, {Batch: 32}, {Batch: 200}}
	p, err := Engine{}.Load(context.Background(), m, buckets)
	require.NoError(t, err)
	ctx := context.Background()
	for b := range buckets {
		require.NoError(t, p.Compile(ctx, b))
		allocs := testing.AllocsPerRun(50, func() {
			if _, err := p.Step(ctx, b); err != nil {
				t.Fatal(err)
			}
		})
		assert.Zero(t, allocs, "bucket %v: allocations per step", buckets[b])
	}
}

func TestLazyBucketIsReportedAsRecompile(t *testing.T) {
	m := randomMLP(t, []int{4, 8, 2}, "relu", "none")
	p, err := Engine{}.Load(context.Background(), m, []bucketing.Shape{{Batch: 2}})
	require.NoError(t, err)
	first, err := p.Step(context.Background(), 0)
	require.NoError(t, err)
	assert.False(t, first.Clean)
	assert.Equal(t, engine.Count(1), first.Recompiles)
	assert.Contains(t, first.Reasons[0], "recompile: bucket b2")

	second, err := p.Step(context.Background(), 0)
	require.NoError(t, err)
	assert.True(t, second.Clean)
	assert.Equal(t, engine.Count(0), second.Recompiles)
}

func TestStepErrors(t *testing.T) {
	m := randomMLP(t, []int{4, 2}, "relu", "none")
	p, err := Engine{}.Load(context.Background(), m, []bucketing.Shape{{Batch: 1}})
	require.NoError(t, err)
	_, err = p.Step(context.Background(), 5)
	assert.True(t, errors.Is(err, engine.ErrBucket))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = p.Step(ctx, 0)
	assert.ErrorIs(t, err, context.Canceled)

	require.NoError(t, p.Close())
	_, err = p.Step(context.Background(), 0)
	assert.ErrorContains(t, err, "closed")

	_, err = Engine{}.Load(context.Background(), &models.Model{Name: "e", Config: &models.Config{Architecture: "encoder"}}, nil)
	assert.ErrorContains(t, err, `architecture "encoder" is not supported by the CPU engine`)
}

// BenchmarkDigitsStep measures every bucket of the shipped digits model:
// GFLOP/s of its products (counted as bench/encoder_numpy.py counts them
// for OpenBLAS) and allocations per step.
func BenchmarkDigitsStep(b *testing.B) {
	m, err := models.Load("../../model_repository/digits")
	require.NoError(b, err)
	var buckets []bucketing.Shape
	for _, n := range m.Config.Buckets.Batch {
		buckets = append(buckets, bucketing.Shape{Batch: n})
	}
	p, err := Engine{}.Load(context.Background(), m, buckets)
	require.NoError(b, err)
	for i, s := range buckets {
		require.NoError(b, p.Compile(context.Background(), i))
		b.Run(s.Label(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p.Step(context.Background(), i)
			}
			flops := 2.0 * float64(s.Batch) * (64*128 + 128*10)
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
