package cpufallback

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/models"
)

// The installed kernels (AVX2 where built and supported, else Go) checked
// against float64 math, at widths with and without a tail of fewer than 8
// columns, including saturated exponentials and fully masked rows.
func TestKernelsAgainstFloat64(t *testing.T) {
	t.Logf("kernels: %s", Kernels())
	rng := rand.New(rand.NewPCG(1, 2))
	for _, cols := range []int{1, 3, 8, 37, 128, 512} {
		rowsN := 5
		x := make([]float32, rowsN*cols)
		bias := make([]float32, cols)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * 4)
		}
		for i := range bias {
			bias[i] = float32(rng.NormFloat64())
		}
		x[0], bias[0] = 40, 0 // GELU of a large value is the value
		if cols > 1 {
			x[1] = -40 // and of a large negative one, zero
		}

		for _, act := range []activation{actNone, actReLU, actGELU, actGELUTanh} {
			y := append([]float32(nil), x...)
			biasAct(y, bias, act)
			for i, v := range x {
				z := float64(v) + float64(bias[i%cols])
				want := z
				switch act {
				case actReLU:
					want = math.Max(z, 0)
				case actGELU:
					want = 0.5 * z * (1 + math.Erf(z/math.Sqrt2))
				case actGELUTanh:
					want = 0.5 * z * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(z+0.044715*z*z*z)))
				}
				require.InDelta(t, want, y[i], 2e-5*math.Max(1, math.Abs(want)), "act %d cols %d at %d", act, cols, i)
			}
		}

		// Softmax with a key mask: masked columns get exactly zero.
		mask := make([]float32, cols)
		for j := range mask {
			if j%3 == 2 {
				mask[j] = maskedScore
			}
		}
		y := append([]float32(nil), x...)
		addSoftmaxRows(y, mask)
		for r := range rowsN {
			row, in := y[r*cols:(r+1)*cols], x[r*cols:(r+1)*cols]
			mx := math.Inf(-1)
			for j := range in {
				mx = math.Max(mx, float64(in[j])+float64(mask[j]))
			}
			var sum float64
			for j := range in {
				sum += math.Exp(float64(in[j]) + float64(mask[j]) - mx)
			}
			for j := range in {
				want := math.Exp(float64(in[j])+float64(mask[j])-mx) / sum
				require.InDelta(t, want, row[j], 1e-5, "softmax cols %d row %d col %d", cols, r, j)
				if mask[j] != 0 {
					assert.Zero(t, row[j])
				}
			}
		}

		// Residual + layer norm, and layer norm alone.
		norm := models.Norm{Weight: make([]float32, cols), Bias: make([]float32, cols)}
		for j := range cols {
			norm.Weight[j], norm.Bias[j] = float32(1+rng.NormFloat64()*0.1), float32(rng.NormFloat64()*0.1)
		}
		res := make([]float32, len(x))
		for i := range res {
			res[i] = float32(rng.NormFloat64())
		}
		got := append([]float32(nil), x...)
		residualNorm(got, res, bias, norm, 1e-12)
		alone := append([]float32(nil), x...)
		layerNormRows(alone, norm, 1e-5)
		for r := range rowsN {
			sum, inRow := make([]float64, cols), x[r*cols:(r+1)*cols]
			for j := range cols {
				sum[j] = float64(inRow[j]) + float64(res[r*cols+j]) + float64(bias[j])
			}
			checkNorm(t, sum, got[r*cols:(r+1)*cols], norm, 1e-12)
			plain := make([]float64, cols)
			for j := range cols {
				plain[j] = float64(inRow[j])
			}
			checkNorm(t, plain, alone[r*cols:(r+1)*cols], norm, 1e-5)
		}
	}
}

func checkNorm(t *testing.T, in []float64, got []float32, n models.Norm, eps float64) {
	t.Helper()
	var mean, ss float64
	for _, v := range in {
		mean += v
	}
	mean /= float64(len(in))
	for _, v := range in {
		ss += (v - mean) * (v - mean)
	}
	inv := 1 / math.Sqrt(ss/float64(len(in))+eps)
	for j, v := range in {
		want := (v-mean)*inv*float64(n.Weight[j]) + float64(n.Bias[j])
		require.InDelta(t, want, got[j], 2e-5*math.Max(1, math.Abs(want)), "layer norm width %d col %d", len(in), j)
	}
}

// The installed kernels and the Go ones agree on the same inputs: a model
// answers the same whichever build serves it.
func TestKernelsMatchGo(t *testing.T) {
	if Kernels() == "go" {
		t.Skip("only the Go kernels are in this build")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	x := make([]float32, 7*45)
	bias := make([]float32, 45)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * 3)
	}
	for i := range bias {
		bias[i] = float32(rng.NormFloat64())
	}
	for _, act := range []activation{actNone, actReLU, actGELU, actGELUTanh} {
		a, b := append([]float32(nil), x...), append([]float32(nil), x...)
		biasAct(a, bias, act)
		goBiasAct(b, bias, act)
		assert.InDeltaSlice(t, b, a, 1e-5, "act %d", act)
	}
	a, b := append([]float32(nil), x...), append([]float32(nil), x...)
	addSoftmaxRows(a, bias)
	goAddSoftmaxRows(b, bias)
	assert.InDeltaSlice(t, b, a, 1e-6)
}

func TestKernelsAllocateNothing(t *testing.T) {
	y, bias := make([]float32, 16*128), make([]float32, 128)
	norm := models.Norm{Weight: make([]float32, 128), Bias: make([]float32, 128)}
	allocs := testing.AllocsPerRun(10, func() {
		biasAct(y, bias, actGELU)
		addSoftmaxRows(y, bias)
		residualNorm(y, y, bias, norm, 1e-12)
		layerNormRows(y, norm, 1e-12)
	})
	assert.Zero(t, allocs)
}
