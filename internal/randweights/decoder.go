package randweights

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
)

// Decoder is a Llama-layout decoder's shape, and the config.json keys
// that go with it.
type Decoder struct {
	Arch                                         string // LlamaForCausalLM (default), MistralForCausalLM or Qwen2ForCausalLM
	Vocab, Hidden, Layers, Heads, KVHeads, Inter int
	MaxPosition                                  int
	RopeTheta                                    float64
	Tied, QKVBias                                bool
	Llama3Scaling                                bool // rope_scaling: llama3 (factor 8, low 1, high 4, original 64)
	SlidingWindow                                int  // Mistral's attention window; 0 for none
	BOS, EOS                                     int
}

// SmolLM is SmolLM-135M's shape (hidden 576, 30 layers, 9 heads, 3 KV
// heads, intermediate 1536, tied embeddings) with vocab tokens: the
// benchmarks' small decoder.
func SmolLM(vocab int) Decoder {
	return Decoder{Arch: "LlamaForCausalLM", Vocab: vocab, Hidden: 576, Layers: 30, Heads: 9, KVHeads: 3, Inter: 1536,
		MaxPosition: 8192, RopeTheta: 10000, Tied: true, BOS: 0, EOS: 2}
}

// Decoder adds a decoder's tensors under transformers' names. The
// weights are drawn from N(0, 1/in) (the embeddings from N(0, 1)), and
// the output projection's scaled so that the logits spread by a few
// units: a random model's greedy choice is then rarely a near-tie, which
// engines that round differently would break differently.
func (b *Builder) Decoder(d Decoder) {
	dense := func(name string, out, in int, scale float64) {
		w := b.normal(out * in)
		s := float32(scale / (0.02 * math.Sqrt(float64(in))))
		for i := range w {
			w[i] *= s
		}
		b.add(name+".weight", w, out, in)
	}
	bias := func(name string, n int) {
		w := b.normal(n)
		for i := range w {
			w[i] *= 5 // N(0, 0.1)
		}
		b.add(name+".bias", w, n)
	}
	norm := func(name string, n int) {
		w := b.normal(n)
		for i := range w {
			w[i] = 1 + 5*w[i] // around one, not all one: the weight is applied
		}
		b.add(name+".weight", w, n)
	}
	hd := d.Hidden / d.Heads
	dense("model.embed_tokens", d.Vocab, d.Hidden, 0.02*math.Sqrt(float64(d.Hidden))/0.02) // N(0, 1)
	for l := range d.Layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		norm(p+"input_layernorm", d.Hidden)
		dense(p+"self_attn.q_proj", d.Heads*hd, d.Hidden, 1)
		dense(p+"self_attn.k_proj", d.KVHeads*hd, d.Hidden, 1)
		dense(p+"self_attn.v_proj", d.KVHeads*hd, d.Hidden, 1)
		if d.QKVBias {
			bias(p+"self_attn.q_proj", d.Heads*hd)
			bias(p+"self_attn.k_proj", d.KVHeads*hd)
			bias(p+"self_attn.v_proj", d.KVHeads*hd)
		}
		dense(p+"self_attn.o_proj", d.Hidden, d.Heads*hd, 3)
		norm(p+"post_attention_layernorm", d.Hidden)
		dense(p+"mlp.gate_proj", d.Inter, d.Hidden, 1)
		dense(p+"mlp.up_proj", d.Inter, d.Hidden, 1)
		dense(p+"mlp.down_proj", d.Hidden, d.Inter, 3)
	}
	norm("model.norm", d.Hidden)
	if !d.Tied {
		dense("lm_head", d.Vocab, d.Hidden, 3)
	}
}

// Config is the config.json transformers writes for d.
func (d Decoder) Config() map[string]any {
	arch, typ := "LlamaForCausalLM", "llama"
	switch d.Arch {
	case "MistralForCausalLM":
		arch, typ = d.Arch, "mistral"
	case "Qwen2ForCausalLM":
		arch, typ = d.Arch, "qwen2"
	}
	c := map[string]any{
		"architectures": []string{arch}, "model_type": typ,
		"vocab_size": d.Vocab, "hidden_size": d.Hidden, "num_hidden_layers": d.Layers,
		"num_attention_heads": d.Heads, "num_key_value_heads": d.KVHeads, "intermediate_size": d.Inter,
		"max_position_embeddings": d.MaxPosition, "rms_norm_eps": 1e-6, "rope_theta": d.RopeTheta,
		"hidden_act": "silu", "tie_word_embeddings": d.Tied, "bos_token_id": d.BOS, "eos_token_id": d.EOS,
		"torch_dtype": "float32", "transformers_version": "4.46.0", "initializer_range": 0.02,
	}
	if typ == "mistral" && d.SlidingWindow > 0 {
		c["sliding_window"] = d.SlidingWindow
	}
	if typ == "llama" {
		c["attention_bias"] = d.QKVBias
		c["mlp_bias"] = false
	}
	if d.Llama3Scaling {
		c["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
			"high_freq_factor": 4.0, "original_max_position_embeddings": 64}
	}
	return c
}

// DecoderFolder is what WriteDecoderFolder writes beside the weights.
type DecoderFolder struct {
	Shape     Decoder
	Seed      uint64
	Tokenizer []byte // tokenizer.json
	// TokenizerConfig is tokenizer_config.json (the chat template and
	// special tokens); nil for none.
	TokenizerConfig map[string]any
	// ModelYAML is model.yaml; empty for none.
	ModelYAML string
	Generator string // for the weights' metadata
}

// WriteDecoderFolder writes a Hugging Face folder of a random decoder
// into dir: config.json, generation_config.json, tokenizer.json,
// tokenizer_config.json, model.safetensors and model.yaml.
func WriteDecoderFolder(dir string, f DecoderFolder) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files := map[string]any{
		"config.json":            f.Shape.Config(),
		"generation_config.json": map[string]any{"bos_token_id": f.Shape.BOS, "eos_token_id": f.Shape.EOS, "transformers_version": "4.46.0"},
	}
	if f.TokenizerConfig != nil {
		files["tokenizer_config.json"] = f.TokenizerConfig
	}
	for name, v := range files {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), f.Tokenizer, 0o644); err != nil {
		return err
	}
	if f.ModelYAML != "" {
		if err := os.WriteFile(filepath.Join(dir, "model.yaml"), []byte(f.ModelYAML), 0o644); err != nil {
			return err
		}
	}
	b := New(f.Seed, 29)
	b.Decoder(f.Shape)
	return b.Write(filepath.Join(dir, "model.safetensors"), map[string]string{"format": "pt", "generator": f.Generator,
		"seed": fmt.Sprint(f.Seed), "weights": "random"})
}
