package main

import (
	"math"
	"math/rand/v2"

	"github.com/stepserve/stepserve/models"
)

// mlp is the training-time network, in float64: h = relu(W1 x/16 + b1),
// p = softmax(W2 h + b2).
type mlp struct {
	w1 [nHidden][nIn]float64
	b1 [nHidden]float64
	w2 [nOut][nHidden]float64
	b2 [nOut]float64
}

func newMLP(rng *rand.Rand) *mlp {
	n := &mlp{}
	he := func(fanIn int) float64 { return math.Sqrt(6.0/float64(fanIn)) * (2*rng.Float64() - 1) }
	for i := range n.w1 {
		for j := range n.w1[i] {
			n.w1[i][j] = he(nIn)
		}
	}
	for i := range n.w2 {
		for j := range n.w2[i] {
			n.w2[i][j] = he(nHidden) / math.Sqrt2
		}
	}
	return n
}

// step runs one minibatch of backpropagation and returns the summed loss.
func (n *mlp) step(batch []sample, opt *adam) float64 {
	g := &mlp{}
	var loss float64
	for _, s := range batch {
		var x [nIn]float64
		for j := range x {
			x[j] = s.x[j] / pixelScale
		}
		var h [nHidden]float64
		for i := range h {
			v := n.b1[i]
			for j := range x {
				v += n.w1[i][j] * x[j]
			}
			h[i] = max(v, 0)
		}
		var p [nOut]float64
		mx := math.Inf(-1)
		for k := range p {
			v := n.b2[k]
			for i := range h {
				v += n.w2[k][i] * h[i]
			}
			p[k] = v
			mx = max(mx, v)
		}
		var sum float64
		for k := range p {
			p[k] = math.Exp(p[k] - mx)
			sum += p[k]
		}
		for k := range p {
			p[k] /= sum
		}
		loss -= math.Log(max(p[s.label], 1e-12))

		// Softmax + cross-entropy: dL/dz = p - onehot.
		var dh [nHidden]float64
		for k := range p {
			dz := p[k]
			if k == s.label {
				dz--
			}
			g.b2[k] += dz
			for i := range h {
				g.w2[k][i] += dz * h[i]
				dh[i] += dz * n.w2[k][i]
			}
		}
		for i := range h {
			if h[i] <= 0 {
				continue
			}
			g.b1[i] += dh[i]
			for j := range x {
				g.w1[i][j] += dh[i] * x[j]
			}
		}
	}
	opt.apply(n, g, 1/float64(len(batch)))
	return loss
}

// params lists every parameter of n as one flat view, in a fixed order, so
// that the optimizer can treat them alike.
func (n *mlp) params() [][]float64 {
	var out [][]float64
	for i := range n.w1 {
		out = append(out, n.w1[i][:])
	}
	out = append(out, n.b1[:])
	for i := range n.w2 {
		out = append(out, n.w2[i][:])
	}
	return append(out, n.b2[:])
}

type adam struct {
	lr, b1, b2, eps float64
	t               int
	m, v            [][]float64
}

func newAdam(n *mlp, lr float64) *adam {
	a := &adam{lr: lr, b1: 0.9, b2: 0.999, eps: 1e-8}
	for _, p := range n.params() {
		a.m = append(a.m, make([]float64, len(p)))
		a.v = append(a.v, make([]float64, len(p)))
	}
	return a
}

func (a *adam) apply(n, grad *mlp, scale float64) {
	a.t++
	c1 := 1 - math.Pow(a.b1, float64(a.t))
	c2 := 1 - math.Pow(a.b2, float64(a.t))
	gs := grad.params()
	for pi, p := range n.params() {
		for i := range p {
			g := gs[pi][i] * scale
			a.m[pi][i] = a.b1*a.m[pi][i] + (1-a.b1)*g
			a.v[pi][i] = a.b2*a.v[pi][i] + (1-a.b2)*g*g
			p[i] -= a.lr * (a.m[pi][i] / c1) / (math.Sqrt(a.v[pi][i]/c2) + a.eps)
		}
	}
}

// export returns the weights as the mlp architecture names them, with the
// pixel scale folded into the first layer.
func (n *mlp) export() []*models.Tensor {
	w1 := make([]float32, 0, nHidden*nIn)
	for i := range n.w1 {
		for j := range n.w1[i] {
			w1 = append(w1, float32(n.w1[i][j]/pixelScale))
		}
	}
	w2 := make([]float32, 0, nOut*nHidden)
	for i := range n.w2 {
		for j := range n.w2[i] {
			w2 = append(w2, float32(n.w2[i][j]))
		}
	}
	f32 := func(v []float64) []float32 {
		out := make([]float32, len(v))
		for i := range v {
			out[i] = float32(v[i])
		}
		return out
	}
	return []*models.Tensor{
		{Name: "layers.0.weight", Shape: []int{nHidden, nIn}, Data: w1},
		{Name: "layers.0.bias", Shape: []int{nHidden}, Data: f32(n.b1[:])},
		{Name: "layers.1.weight", Shape: []int{nOut, nHidden}, Data: w2},
		{Name: "layers.1.bias", Shape: []int{nOut}, Data: f32(n.b2[:])},
	}
}

// forwardExported runs the exported float32 weights on raw pixels.
func forwardExported(t []*models.Tensor, x [nIn]float64) []float64 {
	w1, b1, w2, b2 := t[0].Data, t[1].Data, t[2].Data, t[3].Data
	h := make([]float64, nHidden)
	for i := range h {
		v := float64(b1[i])
		for j := range x {
			v += float64(w1[i*nIn+j]) * x[j]
		}
		h[i] = max(v, 0)
	}
	z := make([]float64, nOut)
	for k := range z {
		v := float64(b2[k])
		for i := range h {
			v += float64(w2[k*nHidden+i]) * h[i]
		}
		z[k] = v
	}
	return z
}
