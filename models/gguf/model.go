package gguf

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/stepserve/stepserve/internal/clip"
)

// The families a decoder is described as; the same strings as models'
// FamilyLlama, FamilyMistral and FamilyQwen2 (this package sits below
// models, which reads GGUF through it, so it cannot name them).
const (
	FamilyLlama   = "llama"
	FamilyMistral = "mistral"
	FamilyQwen2   = "qwen2"
)

// Bounds on a decoder's hyperparameters, models' own.
const (
	maxLayers   = 1024
	maxWidth    = 1 << 18
	maxVocab    = 1 << 22
	maxPosition = 1 << 21
)

// DecoderConfig is a decoder's architecture and hyperparameters read from
// a file's metadata, field for field models.DecoderConfig.
type DecoderConfig struct {
	// Architecture is general.architecture; Family the decoder family it
	// runs as (llama.cpp writes Mistral's checkpoints as llama).
	Architecture string
	Family       string
	Vocab        int
	Hidden       int
	Layers       int
	Heads        int
	KVHeads      int
	HeadDim      int
	Intermediate int
	MaxPosition  int
	RMSNormEps   float64
	RopeTheta    float64
	// QKVBias and OBias say the attention projections have biases
	// (Qwen2's q, k and v; a llama with attention_bias), from the tensors
	// the file holds.
	QKVBias, OBias bool
	// TiedEmbeddings says the file has no output.weight: the output
	// projection is the embedding matrix.
	TiedEmbeddings bool
	// RopeFreqs says the file holds rope_freqs.weight, the per-frequency
	// divisors llama.cpp's converter writes for llama3's rope_scaling in
	// place of its parameters; an engine must apply them (HeadDim/2
	// values, read as any tensor).
	RopeFreqs bool
}

// ReadDecoderConfig describes the decoder f holds, from its metadata
// (general.architecture llama, mistral or qwen2, and that architecture's
// keys) and the presence of its bias and output tensors. Its errors wrap
// ErrUnsupported for an architecture or feature stepserve does not run,
// and ErrMalformed for a missing or out-of-range key.
func ReadDecoderConfig(f *File) (*DecoderConfig, error) {
	arch, ok, err := f.String("general.architecture")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: metadata \"general.architecture\" is missing", ErrMalformed)
	}
	c := &DecoderConfig{Architecture: arch, RopeTheta: 10000}
	switch arch {
	case "llama":
		c.Family = FamilyLlama
	case "mistral":
		c.Family = FamilyMistral
	case "qwen2":
		c.Family = FamilyQwen2
	default:
		return nil, fmt.Errorf("%w: general.architecture %q; want llama, mistral or qwen2", ErrUnsupported, clip.Clip(arch, maxErrName))
	}
	k := func(s string) string { return arch + "." + s }
	ints := []struct {
		key      string
		dst      *int
		lo, hi   int
		required bool
	}{
		{"block_count", &c.Layers, 1, maxLayers, true},
		{"embedding_length", &c.Hidden, 1, maxWidth, true},
		{"feed_forward_length", &c.Intermediate, 1, maxWidth, true},
		{"attention.head_count", &c.Heads, 1, maxWidth, true},
		{"attention.head_count_kv", &c.KVHeads, 1, maxWidth, false},
		{"context_length", &c.MaxPosition, 1, maxPosition, true},
		{"attention.key_length", &c.HeadDim, 2, maxWidth, false},
		{"vocab_size", &c.Vocab, 1, maxVocab, false},
	}
	for _, x := range ints {
		v, ok, err := f.Uint(k(x.key))
		if err != nil {
			return nil, err
		}
		if !ok {
			if x.required {
				return nil, fmt.Errorf("%w: metadata %q is missing", ErrMalformed, k(x.key))
			}
			continue
		}
		if v < uint64(x.lo) || v > uint64(x.hi) {
			return nil, fmt.Errorf("%w: metadata %q is %d; want %d..%d", ErrMalformed, k(x.key), v, x.lo, x.hi)
		}
		*x.dst = int(v)
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.Heads%c.KVHeads != 0 {
		return nil, fmt.Errorf("%w: metadata %q is %d; want a divisor of the head count %d", ErrMalformed, k("attention.head_count_kv"), c.KVHeads, c.Heads)
	}
	if c.HeadDim == 0 {
		if c.Hidden%c.Heads != 0 {
			return nil, fmt.Errorf("%w: %s %d is not a multiple of %s %d, and no %s says the heads' width",
				ErrMalformed, k("embedding_length"), c.Hidden, k("attention.head_count"), c.Heads, k("attention.key_length"))
		}
		c.HeadDim = c.Hidden / c.Heads
	}
	if c.HeadDim%2 != 0 {
		return nil, fmt.Errorf("%w: head width %d; want an even width (rotary embeddings rotate pairs)", ErrMalformed, c.HeadDim)
	}
	if v, ok, err := f.Uint(k("attention.value_length")); err != nil {
		return nil, err
	} else if ok && v != uint64(c.HeadDim) {
		return nil, fmt.Errorf("%w: %s %d differs from the key width %d", ErrUnsupported, k("attention.value_length"), v, c.HeadDim)
	}
	if v, ok, err := f.Uint(k("rope.dimension_count")); err != nil {
		return nil, err
	} else if ok && v != uint64(c.HeadDim) {
		return nil, fmt.Errorf("%w: %s %d: partial rotary embeddings (the head width is %d) are not run", ErrUnsupported, k("rope.dimension_count"), v, c.HeadDim)
	}
	if v, ok, err := f.Uint(k("expert_count")); err != nil {
		return nil, err
	} else if ok && v > 0 {
		return nil, fmt.Errorf("%w: %s %d: mixture-of-experts decoders are not run", ErrUnsupported, k("expert_count"), v)
	}
	eps, ok, err := f.Float(k("attention.layer_norm_rms_epsilon"))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: metadata %q is missing", ErrMalformed, k("attention.layer_norm_rms_epsilon"))
	}
	if !(eps > 0 && eps < 1) {
		return nil, fmt.Errorf("%w: metadata %q is %g; want a small positive number", ErrMalformed, k("attention.layer_norm_rms_epsilon"), eps)
	}
	c.RMSNormEps = eps
	if theta, ok, err := f.Float(k("rope.freq_base")); err != nil {
		return nil, err
	} else if ok {
		if !(theta > 1) || math.IsInf(theta, 0) {
			return nil, fmt.Errorf("%w: metadata %q is %g; want a base above 1", ErrMalformed, k("rope.freq_base"), theta)
		}
		c.RopeTheta = theta
	}
	if typ, ok, err := f.String(k("rope.scaling.type")); err != nil {
		return nil, err
	} else if ok && typ != "none" {
		return nil, fmt.Errorf("%w: %s %q: only llama3's scaling (written as rope_freqs.weight) or none is run", ErrUnsupported, k("rope.scaling.type"), clip.Clip(typ, maxErrName))
	}
	if factor, ok, err := f.Float(k("rope.scaling.factor")); err != nil {
		return nil, err
	} else if ok && factor != 1 && factor != 0 {
		return nil, fmt.Errorf("%w: %s %g: only llama3's scaling (written as rope_freqs.weight) or none is run", ErrUnsupported, k("rope.scaling.factor"), factor)
	}
	if c.Vocab == 0 {
		if toks, ok, err := f.Strings("tokenizer.ggml.tokens"); err != nil {
			return nil, err
		} else if ok {
			c.Vocab = len(toks)
		} else if e, ok := f.TensorByName("token_embd.weight"); ok && len(e.Dims) == 2 {
			c.Vocab = int(min(e.Dims[1], maxVocab+1))
		}
		if c.Vocab < 1 || c.Vocab > maxVocab {
			return nil, fmt.Errorf("%w: the vocabulary size (%s, else tokenizer.ggml.tokens) is %d; want 1..%d", ErrMalformed, k("vocab_size"), c.Vocab, maxVocab)
		}
	}
	_, c.QKVBias = f.TensorByName("blk.0.attn_q.bias")
	_, c.OBias = f.TensorByName("blk.0.attn_output.bias")
	if c.Family == FamilyQwen2 && !c.QKVBias {
		return nil, fmt.Errorf("%w: a qwen2 decoder without blk.0.attn_q.bias; Qwen2 has query, key and value biases", ErrMalformed)
	}
	if c.Family == FamilyQwen2 && c.OBias {
		return nil, fmt.Errorf("%w: a qwen2 decoder with blk.0.attn_output.bias; Qwen2's output projection has none", ErrUnsupported)
	}
	_, hasOut := f.TensorByName("output.weight")
	c.TiedEmbeddings = !hasOut
	_, c.RopeFreqs = f.TensorByName("rope_freqs.weight")
	return c, nil
}

// layerNames maps a layer's GGUF tensor names (after blk.N.) to
// transformers' (after model.layers.N.).
var layerNames = map[string]string{
	"attn_norm":   "input_layernorm",
	"attn_q":      "self_attn.q_proj",
	"attn_k":      "self_attn.k_proj",
	"attn_v":      "self_attn.v_proj",
	"attn_output": "self_attn.o_proj",
	"ffn_norm":    "post_attention_layernorm",
	"ffn_gate":    "mlp.gate_proj",
	"ffn_up":      "mlp.up_proj",
	"ffn_down":    "mlp.down_proj",
}

var globalNames = map[string]string{
	"token_embd.weight":  "model.embed_tokens.weight",
	"output_norm.weight": "model.norm.weight",
	"output.weight":      "lm_head.weight",
}

// HFName is the transformers name of a llama-family GGUF tensor
// (blk.3.attn_q.weight is model.layers.3.self_attn.q_proj.weight); ok is
// false for a name that has none (rope_freqs.weight).
func HFName(name string) (string, bool) {
	if hf, ok := globalNames[name]; ok {
		return hf, true
	}
	rest, ok := strings.CutPrefix(name, "blk.")
	if !ok {
		return "", false
	}
	layer, rest, ok := strings.Cut(rest, ".")
	if !ok {
		return "", false
	}
	if n, err := strconv.Atoi(layer); err != nil || n < 0 || strconv.Itoa(n) != layer {
		return "", false
	}
	base, suffix, ok := strings.Cut(rest, ".")
	if !ok || (suffix != "weight" && suffix != "bias") {
		return "", false
	}
	hf, ok := layerNames[base]
	if !ok {
		return "", false
	}
	return "model.layers." + layer + "." + hf + "." + suffix, true
}

// DecoderTensor is one of a decoder's tensors: where it is in the file
// and how to make it transformers' tensor.
type DecoderTensor struct {
	// HF is transformers' name, Shape its row-major shape there.
	HF    string
	Shape []int
	Info  *TensorInfo
	// PermutedHeads is the head count of llama.cpp's Q/K row permutation
	// to undo (see [UnpermuteRoPE]); 0 when the rows are as transformers
	// has them.
	PermutedHeads int
}

// DecoderTensors lists every tensor the decoder c needs from f, by
// transformers' name, each checked to be there with the shape c implies
// and a type [File.ReadFloat32] reads. A missing tensor, a wrong shape or
// an unreadable type (Q6_K, say) is an error naming the tensor.
func DecoderTensors(f *File, c *DecoderConfig) ([]DecoderTensor, error) {
	var out []DecoderTensor
	// llama.cpp's converter permutes llama's q and k rows (weights and
	// biases) for its rotation of adjacent pairs; qwen2's it leaves, as
	// llama.cpp rotates qwen2 by halves (NEOX style).
	qHeads, kHeads := c.Heads, c.KVHeads
	if c.Architecture == "qwen2" {
		qHeads, kHeads = 0, 0
	}
	add := func(gguf string, perm int, shape ...int) error {
		hf, _ := HFName(gguf)
		t, ok := f.TensorByName(gguf)
		if !ok {
			return fmt.Errorf("%w: tensor %q (%s, shape %v) is missing", ErrMalformed, gguf, hf, shape)
		}
		if got := t.Shape(); !slices.Equal(got, shape) {
			return fmt.Errorf("%w: tensor %q (%s) has shape %v (dims %v); want %v", ErrMalformed, gguf, hf, got, t.Dims, shape)
		}
		if !t.Type.Readable() {
			return fmt.Errorf("%w: tensor %q is %s; stepserve reads F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K", ErrUnsupported, gguf, t.Type)
		}
		out = append(out, DecoderTensor{HF: hf, Shape: shape, Info: t, PermutedHeads: perm})
		return nil
	}
	q, kv := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	if err := add("token_embd.weight", 0, c.Vocab, c.Hidden); err != nil {
		return nil, err
	}
	for l := range c.Layers {
		b := fmt.Sprintf("blk.%d.", l)
		for _, x := range []struct {
			name  string
			perm  int
			shape []int
			if_   bool
		}{
			{"attn_norm.weight", 0, []int{c.Hidden}, true},
			{"attn_q.weight", qHeads, []int{q, c.Hidden}, true},
			{"attn_k.weight", kHeads, []int{kv, c.Hidden}, true},
			{"attn_v.weight", 0, []int{kv, c.Hidden}, true},
			{"attn_q.bias", qHeads, []int{q}, c.QKVBias},
			{"attn_k.bias", kHeads, []int{kv}, c.QKVBias},
			{"attn_v.bias", 0, []int{kv}, c.QKVBias},
			{"attn_output.weight", 0, []int{c.Hidden, q}, true},
			{"attn_output.bias", 0, []int{c.Hidden}, c.OBias},
			{"ffn_norm.weight", 0, []int{c.Hidden}, true},
			{"ffn_gate.weight", 0, []int{c.Intermediate, c.Hidden}, true},
			{"ffn_up.weight", 0, []int{c.Intermediate, c.Hidden}, true},
			{"ffn_down.weight", 0, []int{c.Hidden, c.Intermediate}, true},
		} {
			if !x.if_ {
				continue
			}
			if err := add(b+x.name, x.perm, x.shape...); err != nil {
				return nil, err
			}
		}
	}
	if err := add("output_norm.weight", 0, c.Hidden); err != nil {
		return nil, err
	}
	if !c.TiedEmbeddings {
		if err := add("output.weight", 0, c.Vocab, c.Hidden); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ReadDecoderTensor reads t's values as transformers has them: float32,
// row-major in t.Shape, llama.cpp's row permutation undone.
func (f *File) ReadDecoderTensor(t *DecoderTensor, headDim int) ([]float32, error) {
	data, err := f.ReadFloat32(t.Info)
	if err != nil {
		return nil, err
	}
	if t.PermutedHeads > 0 {
		return UnpermuteRoPE(data, t.PermutedHeads, headDim), nil
	}
	return data, nil
}

// UnpermuteRoPE undoes llama.cpp's permutation of a [heads*headDim, in]
// projection's rows (or a bias's values, in = 1) from transformers'
// rotate-half layout to adjacent pairs: within each head, transformers'
// row i is the file's row 2i and its row headDim/2+i the file's row 2i+1.
// Any element type goes (Q8_0 quants: rows of in values; Q8_0 scales:
// rows of in/32), as long as len(rows) is a multiple of heads*headDim.
func UnpermuteRoPE[T any](rows []T, heads, headDim int) []T {
	in := len(rows) / (heads * headDim)
	out := make([]T, len(rows))
	half := headDim / 2
	for h := range heads {
		for i := range half {
			for k := range 2 {
				src := (h*headDim + 2*i + k) * in
				dst := (h*headDim + k*half + i) * in
				copy(out[dst:dst+in], rows[src:src+in])
			}
		}
	}
	return out
}

// PermuteRoPE is llama.cpp's permutation, the inverse of UnpermuteRoPE:
// within each head, row 2i takes row i and row 2i+1 row headDim/2+i.
func PermuteRoPE[T any](rows []T, heads, headDim int) []T {
	in := len(rows) / (heads * headDim)
	out := make([]T, len(rows))
	half := headDim / 2
	for h := range heads {
		for i := range half {
			for k := range 2 {
				dst := (h*headDim + 2*i + k) * in
				src := (h*headDim + k*half + i) * in
				copy(out[dst:dst+in], rows[src:src+in])
			}
		}
	}
	return out
}
