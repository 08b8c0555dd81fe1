package models

import "fmt"

// Linear is one fully connected layer: y = x Wᵀ + b, with W stored [Out, In]
// row-major as torch.nn.Linear stores it.
type Linear struct {
	In, Out int
	Weight  []float32 // Out*In
	Bias    []float32 // Out
}

// MLP is the mlp architecture: Linear layers with Activation between them and
// OutputActivation after the last.
type MLP struct {
	Layers           []Linear
	Activation       string // relu | gelu
	OutputActivation string // none | softmax
}

// NewMLP takes the layers named by cfg out of w, checking every shape; it
// stops at the first tensor missing or of the wrong shape. Run on weights
// whose data is not read yet, it checks the shapes alone.
func NewMLP(cfg *MLPConfig, w *Weights) (*MLP, error) {
	m := &MLP{Activation: cfg.Activation, OutputActivation: cfg.OutputActivation,
		Layers: make([]Linear, 0, len(cfg.Sizes)-1)}
	for i := 0; i+1 < len(cfg.Sizes); i++ {
		in, out := cfg.Sizes[i], cfg.Sizes[i+1]
		wt, err := w.Tensor(fmt.Sprintf("layers.%d.weight", i), out, in)
		if err != nil {
			return nil, err
		}
		bt, err := w.Tensor(fmt.Sprintf("layers.%d.bias", i), out)
		if err != nil {
			return nil, err
		}
		m.Layers = append(m.Layers, Linear{In: in, Out: out, Weight: wt.Data, Bias: bt.Data})
	}
	return m, nil
}
