package models

// Decoder language models as their Hugging Face folders describe them:
// config.json of LlamaForCausalLM, MistralForCausalLM or
// Qwen2ForCausalLM (RMSNorm, rotary position embeddings with rope_theta
// and llama3-style rope_scaling, grouped-query attention, SwiGLU, q/k/v
// biases where the config has them, tied or untied embeddings), and
// generation_config.json's end-of-sequence ids and sampling defaults.
//
// This is what the generation path (issue 29) builds on: the shapes of
// every weight, the KV cache's bytes per token, and RoPE's frequencies,
// all from the folder as it is. No engine runs a decoder yet.

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/stepserve/stepserve/internal/clip"
)

// Decoder families.
const (
	FamilyLlama   = "llama"
	FamilyMistral = "mistral"
	FamilyQwen2   = "qwen2"
)

// Bounds on a decoder's sizes, as model.yaml's encoder has.
const (
	maxDecoderLayers   = 1024
	maxDecoderWidth    = 1 << 18
	maxDecoderVocab    = 1 << 22
	maxDecoderPosition = 1 << 21
)

// DecoderConfig is a decoder language model's shape.
type DecoderConfig struct {
	Family       string
	Vocab        int
	Hidden       int
	Layers       int
	Heads        int // query heads
	KVHeads      int // key/value heads: Heads for multi-head attention, fewer for grouped-query
	HeadDim      int
	Intermediate int // the SwiGLU's inner width
	MaxPosition  int // max_position_embeddings
	RMSNormEps   float64
	RopeTheta    float64
	// RopeScaling is llama3-style scaling of RoPE's frequencies; nil for
	// none.
	RopeScaling *RopeScaling
	// RopeFactors, where set, divide RoPE's frequencies one by one: a
	// GGUF file's rope_freqs.weight, which llama.cpp's converter writes
	// for llama3's rope_scaling (the same frequencies).
	RopeFactors []float64
	// QKVBias says the query, key and value projections have biases
	// (always in Qwen2; Llama's attention_bias), OBias the output
	// projection too (Llama's attention_bias).
	QKVBias, OBias bool
	// TiedEmbeddings says the output projection is the embedding matrix
	// (tie_word_embeddings): the folder has no lm_head.weight.
	TiedEmbeddings bool
	// SlidingWindow is Mistral's attention window; 0 for none.
	SlidingWindow int
}

// RopeScaling is llama3's rope_scaling: low frequencies divided by
// Factor, high ones kept, those between blended.
type RopeScaling struct {
	Factor          float64
	LowFreqFactor   float64
	HighFreqFactor  float64
	OriginalMaxPosn int
}

// hfDecoderConfig is the part of a decoder's config.json read here.
type hfDecoderConfig struct {
	Architectures         []string        `json:"architectures"`
	ModelType             string          `json:"model_type"`
	VocabSize             int             `json:"vocab_size"`
	HiddenSize            int             `json:"hidden_size"`
	NumHiddenLayers       int             `json:"num_hidden_layers"`
	NumAttentionHeads     int             `json:"num_attention_heads"`
	NumKeyValueHeads      *int            `json:"num_key_value_heads"`
	HeadDim               *int            `json:"head_dim"`
	IntermediateSize      int             `json:"intermediate_size"`
	MaxPositionEmbeddings int             `json:"max_position_embeddings"`
	RMSNormEps            *float64        `json:"rms_norm_eps"`
	RopeTheta             *float64        `json:"rope_theta"`
	RopeScaling           json.RawMessage `json:"rope_scaling"`
	RopeParameters        json.RawMessage `json:"rope_parameters"` // transformers v5: rope_theta and the scaling together
	AttentionBias         *bool           `json:"attention_bias"`
	MLPBias               bool            `json:"mlp_bias"`
	TieWordEmbeddings     *bool           `json:"tie_word_embeddings"`
	HiddenAct             string          `json:"hidden_act"`
	SlidingWindow         *int            `json:"sliding_window"`
	UseSlidingWindow      *bool           `json:"use_sliding_window"`
}

// decoderFamilies maps config.json's architectures entries to families.
var decoderFamilies = map[string]string{
	"LlamaForCausalLM": FamilyLlama, "MistralForCausalLM": FamilyMistral, "Qwen2ForCausalLM": FamilyQwen2,
}

// ParseDecoderConfig reads a decoder's config.json. Its errors wrap
// [ErrConfig] and name the field at fault.
func ParseDecoderConfig(b []byte) (*DecoderConfig, error) {
	var hc hfDecoderConfig
	if err := json.Unmarshal(b, &hc); err != nil {
		return nil, fmt.Errorf("%w: not a transformers config: %s", ErrConfig, clip.Clip(jsonError(err), maxNameInError))
	}
	family := ""
	for _, a := range hc.Architectures {
		if f, ok := decoderFamilies[a]; ok {
			family = f
			break
		}
	}
	if family == "" {
		return nil, fmt.Errorf("%w: architectures %q: not a decoder stepserve runs (want one of LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)",
			ErrConfig, clipAll(hc.Architectures))
	}
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrConfig, field, fmt.Sprintf(format, args...))
	}
	c := &DecoderConfig{Family: family, Vocab: hc.VocabSize, Hidden: hc.HiddenSize, Layers: hc.NumHiddenLayers,
		Heads: hc.NumAttentionHeads, Intermediate: hc.IntermediateSize, MaxPosition: hc.MaxPositionEmbeddings,
		RMSNormEps: 1e-6, RopeTheta: 10000, QKVBias: family == FamilyQwen2}
	for _, f := range []struct {
		name     string
		v, upper int
	}{
		{"vocab_size", c.Vocab, maxDecoderVocab}, {"hidden_size", c.Hidden, maxDecoderWidth},
		{"num_hidden_layers", c.Layers, maxDecoderLayers}, {"num_attention_heads", c.Heads, maxDecoderWidth},
		{"intermediate_size", c.Intermediate, maxDecoderWidth}, {"max_position_embeddings", c.MaxPosition, maxDecoderPosition},
	} {
		if f.v < 1 || f.v > f.upper {
			return nil, bad(f.name, "%d; want 1..%d", f.v, f.upper)
		}
	}
	c.KVHeads = c.Heads
	if hc.NumKeyValueHeads != nil {
		c.KVHeads = *hc.NumKeyValueHeads
	}
	if c.KVHeads < 1 || c.Heads%c.KVHeads != 0 {
		return nil, bad("num_key_value_heads", "%d; want a divisor of num_attention_heads (%d)", c.KVHeads, c.Heads)
	}
	c.HeadDim = c.Hidden / c.Heads
	if hc.HeadDim != nil {
		c.HeadDim = *hc.HeadDim
	} else if c.Hidden%c.Heads != 0 {
		return nil, bad("hidden_size", "%d is not a multiple of num_attention_heads (%d), and no head_dim says the heads' width", c.Hidden, c.Heads)
	}
	if c.HeadDim < 2 || c.HeadDim%2 != 0 || c.HeadDim > maxDecoderWidth {
		return nil, bad("head_dim", "%d; want an even width (rotary embeddings rotate pairs)", c.HeadDim)
	}
	if hc.RMSNormEps != nil {
		c.RMSNormEps = *hc.RMSNormEps
	}
	if !(c.RMSNormEps > 0 && c.RMSNormEps < 1) {
		return nil, bad("rms_norm_eps", "%g; want a small positive number", c.RMSNormEps)
	}
	if hc.RopeTheta != nil {
		c.RopeTheta = *hc.RopeTheta
	}
	if act := hc.HiddenAct; act != "" && act != "silu" {
		return nil, bad("hidden_act", "%q; the decoders stepserve runs use silu (SwiGLU)", clip.Clip(act, maxNameInError))
	}
	if hc.MLPBias {
		return nil, bad("mlp_bias", "true; stepserve runs MLPs without biases")
	}
	if hc.AttentionBias != nil && *hc.AttentionBias && family == FamilyLlama {
		c.QKVBias, c.OBias = true, true // Qwen2 always has q/k/v biases, Mistral none
	}
	if hc.TieWordEmbeddings != nil {
		c.TiedEmbeddings = *hc.TieWordEmbeddings
	}
	switch {
	case family == FamilyMistral && hc.SlidingWindow != nil && *hc.SlidingWindow > 0:
		c.SlidingWindow = *hc.SlidingWindow
	case family == FamilyQwen2 && hc.UseSlidingWindow != nil && *hc.UseSlidingWindow:
		return nil, bad("use_sliding_window", "true; Qwen2's sliding-window layers are not supported")
	}
	rope := hc.RopeScaling
	if len(hc.RopeParameters) > 0 && string(hc.RopeParameters) != "null" {
		// transformers v5 keeps rope_theta with the scaling.
		var p struct {
			Theta *float64 `json:"rope_theta"`
		}
		if err := json.Unmarshal(hc.RopeParameters, &p); err != nil {
			return nil, bad("rope_parameters", "%s", clip.Clip(jsonError(err), maxNameInError))
		}
		if p.Theta != nil {
			c.RopeTheta = *p.Theta
		}
		rope = hc.RopeParameters
	}
	if !(c.RopeTheta > 1) || math.IsInf(c.RopeTheta, 0) {
		return nil, bad("rope_theta", "%g; want a base above 1", c.RopeTheta)
	}
	var err error
	if c.RopeScaling, err = parseRopeScaling(rope); err != nil {
		return nil, err
	}
	return c, nil
}

// parseRopeScaling reads rope_scaling: null, or llama3's.
func parseRopeScaling(raw json.RawMessage) (*RopeScaling, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var rs struct {
		Type            string   `json:"rope_type"`
		OldType         string   `json:"type"`
		Factor          *float64 `json:"factor"`
		LowFreqFactor   *float64 `json:"low_freq_factor"`
		HighFreqFactor  *float64 `json:"high_freq_factor"`
		OriginalMaxPosn *int     `json:"original_max_position_embeddings"`
	}
	if err := json.Unmarshal(raw, &rs); err != nil {
		return nil, fmt.Errorf("%w: rope_scaling: %s", ErrConfig, clip.Clip(jsonError(err), maxNameInError))
	}
	kind := rs.Type
	if kind == "" {
		kind = rs.OldType
	}
	switch kind {
	case "default", "":
		return nil, nil
	case "llama3":
	default:
		return nil, fmt.Errorf("%w: rope_scaling: type %q is not one stepserve runs (llama3, or none)", ErrConfig, clip.Clip(kind, maxNameInError))
	}
	if rs.Factor == nil || rs.LowFreqFactor == nil || rs.HighFreqFactor == nil || rs.OriginalMaxPosn == nil {
		return nil, fmt.Errorf("%w: rope_scaling: llama3 needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings", ErrConfig)
	}
	s := &RopeScaling{Factor: *rs.Factor, LowFreqFactor: *rs.LowFreqFactor, HighFreqFactor: *rs.HighFreqFactor, OriginalMaxPosn: *rs.OriginalMaxPosn}
	if !(s.Factor >= 1) || !(s.LowFreqFactor > 0) || !(s.HighFreqFactor > s.LowFreqFactor) || s.OriginalMaxPosn < 1 {
		return nil, fmt.Errorf("%w: rope_scaling: factor %g, low_freq_factor %g, high_freq_factor %g, original_max_position_embeddings %d; want factor >= 1 and 0 < low < high",
			ErrConfig, s.Factor, s.LowFreqFactor, s.HighFreqFactor, s.OriginalMaxPosn)
	}
	return s, nil
}

// clipAll clips each of names for an error message.
func clipAll(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = clip.Clip(n, maxNameInError)
	}
	return out
}

// InvFreq is RoPE's inverse frequency for each pair of a head's
// dimensions (HeadDim/2 of them), rope_scaling applied: what position p
// is multiplied by before its cosine and sine are taken.
func (c *DecoderConfig) InvFreq() []float64 {
	n := c.HeadDim / 2
	out := make([]float64, n)
	for i := range out {
		out[i] = 1 / math.Pow(c.RopeTheta, float64(2*i)/float64(c.HeadDim))
	}
	if f := c.RopeFactors; len(f) == n {
		for i := range out {
			out[i] /= f[i]
		}
	}
	s := c.RopeScaling
	if s == nil {
		return out
	}
	lowWavelen := float64(s.OriginalMaxPosn) / s.LowFreqFactor
	highWavelen := float64(s.OriginalMaxPosn) / s.HighFreqFactor
	for i, f := range out {
		wavelen := 2 * math.Pi / f
		switch {
		case wavelen < highWavelen: // high frequencies: kept
		case wavelen > lowWavelen: // low frequencies: divided by the factor
			out[i] = f / s.Factor
		default: // between: blended
			smooth := (float64(s.OriginalMaxPosn)/wavelen - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
			out[i] = (1-smooth)*f/s.Factor + smooth*f
		}
	}
	return out
}

// KVBytesPerToken is what the KV cache holds for one token, with keys
// and values of elemBytes bytes each: a key and a value per layer and
// key/value head.
func (c *DecoderConfig) KVBytesPerToken(elemBytes int) int64 {
	return 2 * int64(c.Layers) * int64(c.KVHeads) * int64(c.HeadDim) * int64(elemBytes)
}

// Tensors are the weights the decoder's safetensors must hold, by their
// Hugging Face names, with their shapes.
func (c *DecoderConfig) Tensors() map[string][]int {
	q, kv := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	t := map[string][]int{
		"model.embed_tokens.weight": {c.Vocab, c.Hidden},
		"model.norm.weight":         {c.Hidden},
	}
	if !c.TiedEmbeddings {
		t["lm_head.weight"] = []int{c.Vocab, c.Hidden}
	}
	for l := range c.Layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		t[p+"input_layernorm.weight"] = []int{c.Hidden}
		t[p+"post_attention_layernorm.weight"] = []int{c.Hidden}
		t[p+"self_attn.q_proj.weight"] = []int{q, c.Hidden}
		t[p+"self_attn.k_proj.weight"] = []int{kv, c.Hidden}
		t[p+"self_attn.v_proj.weight"] = []int{kv, c.Hidden}
		t[p+"self_attn.o_proj.weight"] = []int{c.Hidden, q}
		if c.OBias {
			t[p+"self_attn.o_proj.bias"] = []int{c.Hidden}
		}
		if c.QKVBias {
			t[p+"self_attn.q_proj.bias"] = []int{q}
			t[p+"self_attn.k_proj.bias"] = []int{kv}
			t[p+"self_attn.v_proj.bias"] = []int{kv}
		}
		t[p+"mlp.gate_proj.weight"] = []int{c.Intermediate, c.Hidden}
		t[p+"mlp.up_proj.weight"] = []int{c.Intermediate, c.Hidden}
		t[p+"mlp.down_proj.weight"] = []int{c.Hidden, c.Intermediate}
	}
	return t
}

// GenerationConfig is generation_config.json: the ids that end a
// sequence, and the sampling defaults a request may override.
type GenerationConfig struct {
	EOS         []int
	BOS         *int
	Temperature *float64
	TopP        *float64
	TopK        *int
	MaxNew      *int
}

// ParseGenerationConfig reads generation_config.json; eos_token_id may
// be one id or a list.
func ParseGenerationConfig(b []byte, vocab int) (*GenerationConfig, error) {
	var g struct {
		EOS         json.RawMessage `json:"eos_token_id"`
		BOS         *int            `json:"bos_token_id"`
		Temperature *float64        `json:"temperature"`
		TopP        *float64        `json:"top_p"`
		TopK        *int            `json:"top_k"`
		MaxNew      *int            `json:"max_new_tokens"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		return nil, fmt.Errorf("%w: generation_config.json: %s", ErrConfig, clip.Clip(jsonError(err), maxNameInError))
	}
	out := &GenerationConfig{BOS: g.BOS, Temperature: g.Temperature, TopP: g.TopP, TopK: g.TopK, MaxNew: g.MaxNew}
	if len(g.EOS) > 0 && string(g.EOS) != "null" {
		var one int
		if err := json.Unmarshal(g.EOS, &one); err == nil {
			out.EOS = []int{one}
		} else if err := json.Unmarshal(g.EOS, &out.EOS); err != nil {
			return nil, fmt.Errorf("%w: generation_config.json: eos_token_id: want an id or a list of ids", ErrConfig)
		}
	}
	for _, id := range append(append([]int(nil), out.EOS...), deref(g.BOS, 0)) {
		if id < 0 || id >= vocab {
			return nil, fmt.Errorf("%w: generation_config.json: token id %d is outside the vocabulary (0..%d)", ErrConfig, id, vocab-1)
		}
	}
	switch {
	case g.Temperature != nil && !(*g.Temperature >= 0):
		return nil, fmt.Errorf("%w: generation_config.json: temperature %g; want 0 or more", ErrConfig, *g.Temperature)
	case g.TopP != nil && !(*g.TopP > 0 && *g.TopP <= 1):
		return nil, fmt.Errorf("%w: generation_config.json: top_p %g; want 0 < top_p <= 1", ErrConfig, *g.TopP)
	case g.TopK != nil && *g.TopK < 0:
		return nil, fmt.Errorf("%w: generation_config.json: top_k %d; want 0 or more", ErrConfig, *g.TopK)
	}
	return out, nil
}

func deref(p *int, zero int) int {
	if p == nil {
		return zero
	}
	return *p
}

// IsDecoderConfig reports whether a config.json names a decoder family
// stepserve knows, without judging the rest of it.
func IsDecoderConfig(b []byte) bool {
	var hc struct {
		Architectures []string `json:"architectures"`
	}
	if json.Unmarshal(b, &hc) != nil {
		return false
	}
	for _, a := range hc.Architectures {
		if _, ok := decoderFamilies[a]; ok {
			return true
		}
	}
	return false
}
