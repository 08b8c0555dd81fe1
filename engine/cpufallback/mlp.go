package cpufallback

import (
	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/models"
)

// mlpPlan is one bucket's compiled MLP: the resident weights, and every
// buffer the step writes, allocated once.
type mlpPlan struct {
	m     *models.MLP
	w     []*weight // layer i's weight, as resident
	batch int
	input []float32   // the bucket's "device" input buffer, [batch, in]
	acts  [][]float32 // layer i's output, [batch, out_i]
	rec   *trace.Recorder
}

func (p *mlpPlan) record(rec *trace.Recorder) { p.rec = rec }

func newMLPPlan(m *models.MLP, w residentWeights, batch int) *mlpPlan {
	p := &mlpPlan{m: m, batch: batch, input: make([]float32, batch*m.Layers[0].In)}
	for i, l := range m.Layers {
		p.acts = append(p.acts, make([]float32, batch*l.Out))
		p.w = append(p.w, w[&m.Layers[i]])
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
		t := p.rec.Begin()
		linear(p.batch, l.Out, l.In, x, p.w[i], y)
		p.rec.End("product", i, 0, t)
		t = p.rec.Begin()
		switch {
		case i < last && p.m.Activation == "gelu":
			biasAct(y, l.Bias, actGELU)
		case i < last:
			biasAct(y, l.Bias, actReLU)
		case p.m.OutputActivation == "softmax":
			addSoftmaxRows(y, l.Bias)
		default:
			biasAct(y, l.Bias, actNone)
		}
		p.rec.End("bias+activation", i, 0, t)
		x = y
	}
	return x
}
