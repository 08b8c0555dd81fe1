package cpufallback

import (
	"math"

	"github.com/stepserve/stepserve/models"
)

// mlpPlan is one bucket's compiled MLP: the resident weights, and every
// buffer the step writes, allocated once.
type mlpPlan struct {
	m     *models.MLP
	batch int
	input []float32   // the bucket's "device" input buffer, [batch, in]
	acts  [][]float32 // layer i's output, [batch, out_i]
}

func newMLPPlan(m *models.MLP, batch int) *mlpPlan {
	p := &mlpPlan{m: m, batch: batch, input: make([]float32, batch*m.Layers[0].In)}
	for _, l := range m.Layers {
		p.acts = append(p.acts, make([]float32, batch*l.Out))
	}
	return p
}

// step copies the input staging in once, runs, and copies the result out
// once.
func (p *mlpPlan) step(in, out []byte) error {
	copy(p.input, floats(in))
	copy(floats(out), p.run())
	return nil
}

// run computes the MLP on p.input and returns the last activations.
func (p *mlpPlan) run() []float32 {
	x := p.input
	last := len(p.m.Layers) - 1
	for i, l := range p.m.Layers {
		y := p.acts[i]
		linear(p.batch, l.Out, l.In, x, l.Weight, y)
		switch {
		case i < last && p.m.Activation == "gelu":
			biasGELU(y, l.Bias)
		case i < last:
			biasReLU(y, l.Bias)
		case p.m.OutputActivation == "softmax":
			biasSoftmax(y, l.Bias)
		default:
			biasOnly(y, l.Bias)
		}
		x = y
	}
	return x
}

func biasOnly(y, bias []float32) {
	n := len(bias)
	for r := 0; r < len(y); r += n {
		row := y[r : r+n]
		for j, b := range bias {
			row[j] += b
		}
	}
}

func biasReLU(y, bias []float32) {
	n := len(bias)
	for r := 0; r < len(y); r += n {
		row := y[r : r+n]
		for j, b := range bias {
			row[j] = max(row[j]+b, 0)
		}
	}
}

// biasGELU applies the exact (erf) GELU that torch.nn.GELU and BERT use.
func biasGELU(y, bias []float32) {
	n := len(bias)
	for r := 0; r < len(y); r += n {
		row := y[r : r+n]
		for j, b := range bias {
			v := row[j] + b
			row[j] = 0.5 * v * (1 + erf32(v*(1/math.Sqrt2)))
		}
	}
}

// biasSoftmax adds the bias to each row and takes its softmax.
func biasSoftmax(y, bias []float32) {
	for r := 0; r < len(y); r += len(bias) {
		addSoftmax(y[r:r+len(bias)], bias)
	}
}
