package cpufallback

import (
	"math"

	"github.com/stepserve/stepserve/models"
)

// The element-wise passes around a step's products. Each works on whole
// row-major matrices in one call, so that a native implementation crosses
// into C once per pass. These are the portable Go versions; builds with
// native kernels (kernels_native.go) replace them at start-up where the CPU
// allows.
var (
	kernelName = "go"

	// biasAct adds bias to every row of y (len(y) a multiple of
	// len(bias)) and applies act.
	biasAct = goBiasAct
	// addSoftmaxRows adds add to every row of y (len(add) columns) and
	// takes each row's softmax in place.
	addSoftmaxRows = goAddSoftmaxRows
	// residualNorm computes x = LayerNorm(x + y + bias) row by row, with
	// len(bias) columns.
	residualNorm = goResidualNorm
	// layerNormRows normalizes every row of x (len(n.Weight) columns).
	layerNormRows = goLayerNormRows
	// decodeAttention is one decode token's attention for a group of
	// query heads over the paged cache (see ss_decode_attention), where
	// native kernels run; nil elsewhere (attnStep then runs it in Go).
	decodeAttention func(a decodeAttn)
	// siluMul makes gate = silu(gate) * up, element by element (SwiGLU).
	siluMul = goSiluMul
	// softmaxRow takes y's softmax in place.
	softmaxRow = goSoftmaxRow
)

func goSoftmaxRow(y []float32) {
	m := float32(math.Inf(-1))
	for _, v := range y {
		m = max(m, v)
	}
	var sum float32
	for j, v := range y {
		e := exp32(v - m)
		y[j] = e
		sum += e
	}
	inv := 1 / sum
	for j := range y {
		y[j] *= inv
	}
}

func goSiluMul(gate, up []float32) {
	up = up[:len(gate)]
	for i, g := range gate {
		gate[i] = g / (1 + exp32(-g)) * up[i]
	}
}

// decodeAttn is one call of decodeAttention: the group query heads in q
// (hd apart) attend to positions from up to to of a sequence whose
// position j has its key at kv[base + table[j/bs]*blockStride +
// (j%bs)*rowStride:] and its value valOff further; out gets the group's
// heads; scores holds group x (to-from) floats.
type decodeAttn struct {
	group, hd, from, to int
	kv                  []float32
	base                int
	blockStride, bs     int
	rowStride, valOff   int
	table               []int32
	scale               float32
	q, out, scores      []float32
}

// Kernels names the instruction set of the engine's kernels (products and
// element-wise passes): "avx512", "avx2" or "go" (see dispatch.go). The
// startup log and stepserve_build_info say which is in use.
func Kernels() string { return kernelName }

// activation is what biasAct applies after the bias.
type activation int

const (
	actNone activation = iota
	actReLU
	actGELU
	// actGELUTanh is GELU's tanh approximation (gelu_new,
	// gelu_pytorch_tanh): x/2 (1 + tanh(u)) = x / (1 + e^-2u), u =
	// sqrt(2/pi) (x + 0.044715 x^3).
	actGELUTanh
)

// sqrt2OverPi is sqrt(2/pi), of GELU's tanh approximation.
const sqrt2OverPi = 0.7978845608028654

func goBiasAct(y, bias []float32, act activation) {
	n := len(bias)
	for r := 0; r < len(y); r += n {
		row := y[r : r+n]
		switch act {
		case actGELU:
			// The exact (erf) GELU that torch.nn.GELU and BERT use.
			for j, b := range bias {
				v := row[j] + b
				row[j] = 0.5 * v * (1 + erf32(v*(1/math.Sqrt2)))
			}
		case actGELUTanh:
			for j, b := range bias {
				v := row[j] + b
				row[j] = v / (1 + exp32(-2*sqrt2OverPi*(v+0.044715*v*v*v)))
			}
		case actReLU:
			for j, b := range bias {
				row[j] = max(row[j]+b, 0)
			}
		default:
			for j, b := range bias {
				row[j] += b
			}
		}
	}
}

// goAddSoftmaxRows is numerically stable: one pass for each row's maximum,
// one for the exponentials.
func goAddSoftmaxRows(y, add []float32) {
	for r := 0; r < len(y); r += len(add) {
		row := y[r : r+len(add)]
		mx := float32(math.Inf(-1))
		for j := range row {
			row[j] += add[j]
			mx = max(mx, row[j])
		}
		var sum float32
		for j := range row {
			e := exp32(row[j] - mx)
			row[j] = e
			sum += e
		}
		inv := 1 / sum
		for j := range row {
			row[j] *= inv
		}
	}
}

func goResidualNorm(x, y, bias []float32, n models.Norm, eps float64) {
	H := len(bias)
	for r := 0; r < len(x); r += H {
		row, add := x[r:r+H], y[r:r+H]
		for j := range row {
			row[j] += add[j] + bias[j]
		}
		layerNorm(row, n, eps)
	}
}

func goLayerNormRows(x []float32, n models.Norm, eps float64) {
	H := len(n.Weight)
	for r := 0; r < len(x); r += H {
		layerNorm(x[r:r+H], n, eps)
	}
}

func layerNorm(row []float32, n models.Norm, eps float64) {
	var sum float64
	for _, v := range row {
		sum += float64(v)
	}
	mean := sum / float64(len(row))
	var ss float64
	for _, v := range row {
		d := float64(v) - mean
		ss += d * d
	}
	inv := 1 / math.Sqrt(ss/float64(len(row))+eps)
	for j, v := range row {
		row[j] = float32((float64(v)-mean)*inv)*n.Weight[j] + n.Bias[j]
	}
}
