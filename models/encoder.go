package models

import "fmt"

// Encoder is the encoder architecture's weights: a BERT layout, as the
// Hugging Face checkpoints name it.
type Encoder struct {
	Config *EncoderConfig

	WordEmb, PosEmb, TypeEmb []float32 // [vocab, H], [max_position, H], [types, H]
	EmbNorm                  Norm
	Layers                   []EncoderLayer
}

// EncoderLayer is one post-norm transformer layer.
type EncoderLayer struct {
	Query, Key, Value, AttnOut Linear
	AttnNorm                   Norm
	Inter, Out                 Linear // feed-forward: H -> I (GELU) -> H
	OutNorm                    Norm
}

// Norm is a LayerNorm's scale and shift.
type Norm struct{ Weight, Bias []float32 }

// NewEncoder takes an encoder's tensors out of w, with or without the
// "bert." prefix, checking every shape against cfg. It stops at the first
// tensor missing or of the wrong shape, so that a config asking for more
// layers than the file holds costs no more than the file does. Run on
// weights whose data is not read yet, it checks the shapes alone.
func NewEncoder(cfg *EncoderConfig, w *Weights) (*Encoder, error) {
	prefix := ""
	if _, ok := w.Tensors["bert.embeddings.word_embeddings.weight"]; ok {
		prefix = "bert."
	}
	H, I := cfg.Hidden, cfg.Intermediate
	var err error
	get := func(name string, shape ...int) []float32 {
		if err != nil {
			return nil
		}
		var t *Tensor
		t, err = w.Tensor(prefix+name, shape...)
		if err != nil {
			return nil
		}
		return t.Data
	}
	linear := func(name string, out, in int) Linear {
		return Linear{In: in, Out: out, Weight: get(name+".weight", out, in), Bias: get(name+".bias", out)}
	}
	norm := func(name string) Norm {
		return Norm{Weight: get(name+".weight", H), Bias: get(name+".bias", H)}
	}
	e := &Encoder{
		Config:  cfg,
		WordEmb: get("embeddings.word_embeddings.weight", cfg.VocabSize, H),
		PosEmb:  get("embeddings.position_embeddings.weight", cfg.MaxPosition, H),
		TypeEmb: get("embeddings.token_type_embeddings.weight", cfg.TypeVocabSize, H),
		EmbNorm: norm("embeddings.LayerNorm"),
	}
	if err != nil {
		return nil, err
	}
	e.Layers = make([]EncoderLayer, 0, min(cfg.Layers, len(w.Tensors)))
	for i := range cfg.Layers {
		p := fmt.Sprintf("encoder.layer.%d.", i)
		l := EncoderLayer{
			Query:    linear(p+"attention.self.query", H, H),
			Key:      linear(p+"attention.self.key", H, H),
			Value:    linear(p+"attention.self.value", H, H),
			AttnOut:  linear(p+"attention.output.dense", H, H),
			AttnNorm: norm(p + "attention.output.LayerNorm"),
			Inter:    linear(p+"intermediate.dense", I, H),
			Out:      linear(p+"output.dense", H, I),
			OutNorm:  norm(p + "output.LayerNorm"),
		}
		if err != nil {
			return nil, fmt.Errorf("%w (encoder.layers is %d)", err, cfg.Layers)
		}
		e.Layers = append(e.Layers, l)
	}
	return e, nil
}
