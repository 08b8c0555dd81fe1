// Package gguf writes a Hugging Face Llama-family decoder as a GGUF file,
// the format llama.cpp reads, so that make bench can run llama.cpp on the
// very weights stepserve serves, through models/gguf's writer.
//
// Two things differ from the Hugging Face layout. GGUF lists a tensor's
// dimensions innermost first (a [out, in] weight is written as in, out),
// and llama.cpp's "llama" architecture rotates adjacent pairs of a head's
// query and key features where transformers rotates its two halves, so
// the rows of q_proj and k_proj are permuted per head: row 2i of a head
// is transformers' row i and row 2i+1 its row half+i. The product is
// the same attention.
package gguf

import (
	"fmt"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/models/gguf"
)

// Type is a tensor's element type in GGUF's numbering.
type Type = gguf.Type

const (
	F32  = gguf.F32
	F16  = gguf.F16
	Q8_0 = gguf.Q8_0
	Q4_0 = gguf.Q4_0
)

// value types of metadata, for the tests' reader
const (
	tUint32  = uint32(gguf.TypeUint32)
	tInt32   = uint32(gguf.TypeInt32)
	tFloat32 = uint32(gguf.TypeFloat32)
	tString  = uint32(gguf.TypeString)
	tArray   = uint32(gguf.TypeArray)
)

const alignment = gguf.DefaultAlignment

// Options choose how WriteLlama stores the model.
type Options struct {
	Name string
	// Type stores the two-dimensional weights; norms stay float32, as
	// llama.cpp's converter keeps them. Under Q4_0 the embeddings and the
	// output head are Q8_0, as llama.cpp's Q4_0 keeps its output head
	// above 4 bits (Q6_K there).
	Type Type
	// BOS and EOS are the special token ids.
	BOS, EOS int
	// Tokenizer, when set, is a byte-level BPE tokenizer.json written as
	// the file's vocabulary (GGUF's gpt2 model), with ChatTemplate and
	// AddBOS; nil writes a placeholder vocabulary of the right size.
	Tokenizer    []byte
	ChatTemplate string
	AddBOS       bool
}

// Write writes the decoder c with weights w (transformers' names, float32
// data read) to path as a GGUF file for llama.cpp, its two-dimensional
// weights stored as o.Type (F32, F16, BF16, Q8_0 or Q4_0, the last two
// quantized by models/gguf as llama.cpp's quantize_row_q8_0_ref and
// quantize_row_q4_0_ref do), norms and
// biases in float32 as llama.cpp's converter keeps them.
//
// A Llama or Mistral decoder is written as architecture "llama" (the rows
// of q_proj and k_proj permuted to llama.cpp's adjacent-pair rotation); a
// Qwen2 one as architecture "qwen2", which rotates halves as transformers
// does, so its weights go unpermuted, and carries the q, k and v biases.
// The vocabulary is o.Tokenizer's, or a placeholder of the right size
// (llama.cpp needs one to load; the benchmark feeds token ids, never
// text): <unk>, <s>, </s>, the 256 byte tokens, then one word per
// remaining id.
func Write(path string, c *models.DecoderConfig, w *models.Weights, o Options) error {
	typ, name, bos, eos := o.Type, o.Name, o.BOS, o.EOS
	arch := "llama"
	switch c.Family {
	case models.FamilyLlama, models.FamilyMistral:
		if c.QKVBias || c.OBias {
			return fmt.Errorf("gguf: a llama-architecture file with attention biases is not written")
		}
	case models.FamilyQwen2:
		arch = "qwen2"
		if c.OBias {
			return fmt.Errorf("gguf: an output-projection bias is not written")
		}
	default:
		return fmt.Errorf("gguf: family %s is not written", c.Family)
	}
	if c.SlidingWindow > 0 || c.RopeScaling != nil && arch != "llama" || c.RopeFactors != nil {
		return fmt.Errorf("gguf: sliding windows, and rope scaling but llama3's on a llama-architecture file, are not written")
	}
	var g gguf.Writer
	g.String("general.architecture", arch)
	g.String("general.name", name)
	g.Uint32("general.alignment", gguf.DefaultAlignment)
	// llama_ftype: ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q8_0 7.
	g.Uint32("general.file_type", map[gguf.Type]uint32{gguf.F32: 0, gguf.F16: 1, gguf.BF16: 32, gguf.Q8_0: 7, gguf.Q4_0: 2}[typ])
	g.Uint32(arch+".context_length", uint32(c.MaxPosition))
	g.Uint32(arch+".embedding_length", uint32(c.Hidden))
	g.Uint32(arch+".block_count", uint32(c.Layers))
	g.Uint32(arch+".feed_forward_length", uint32(c.Intermediate))
	g.Uint32(arch+".attention.head_count", uint32(c.Heads))
	g.Uint32(arch+".attention.head_count_kv", uint32(c.KVHeads))
	g.Uint32(arch+".attention.key_length", uint32(c.HeadDim))
	g.Uint32(arch+".attention.value_length", uint32(c.HeadDim))
	g.Uint32(arch+".rope.dimension_count", uint32(c.HeadDim))
	g.Float32(arch+".rope.freq_base", float32(c.RopeTheta))
	g.Float32(arch+".attention.layer_norm_rms_epsilon", float32(c.RMSNormEps))
	g.Uint32(arch+".vocab_size", uint32(c.Vocab))

	if o.Tokenizer != nil {
		if err := g.WriteHFTokenizer(o.Tokenizer, o.ChatTemplate, bos, eos, o.AddBOS); err != nil {
			return err
		}
	} else {
		if c.Vocab < 260 {
			return fmt.Errorf("gguf: vocabulary of %d: the placeholder vocabulary needs at least 260 ids", c.Vocab)
		}
		tokens := make([]string, c.Vocab)
		types := make([]int32, c.Vocab)
		scores := make([]float32, c.Vocab)
		for i := range tokens {
			switch {
			case i == 0:
				tokens[i], types[i] = "<unk>", 2
			case i == 1:
				tokens[i], types[i] = "<s>", 3
			case i == 2:
				tokens[i], types[i] = "</s>", 3
			case i < 259:
				tokens[i], types[i] = fmt.Sprintf("<0x%02X>", i-3), 6
			default:
				tokens[i], types[i] = fmt.Sprintf("\u2581w%d", i), 1
				scores[i] = -float32(i)
			}
		}
		g.String("tokenizer.ggml.model", "llama")
		g.Strings("tokenizer.ggml.tokens", tokens)
		g.Float32s("tokenizer.ggml.scores", scores)
		g.Int32s("tokenizer.ggml.token_type", types)
		g.Uint32("tokenizer.ggml.bos_token_id", uint32(bos))
		g.Uint32("tokenizer.ggml.eos_token_id", uint32(eos))
		g.Uint32("tokenizer.ggml.unknown_token_id", 0)
	}

	add := func(to, from string, rows func([]float32) []float32) error {
		t, ok := w.Tensors[from]
		if !ok || t.Data == nil {
			return fmt.Errorf("gguf: tensor %s is missing", from)
		}
		ty := typ
		switch {
		case len(t.Shape) == 1:
			ty = gguf.F32
		case typ == gguf.Q4_0 && (to == "token_embd.weight" || to == "output.weight"):
			ty = gguf.Q8_0
		}
		data := t.Data
		if rows != nil {
			data = rows(data)
		}
		return g.Tensor(to, t.Shape, ty, data)
	}
	permute := func(heads int) func([]float32) []float32 {
		if arch != "llama" {
			return nil
		}
		return func(d []float32) []float32 { return gguf.PermuteRoPE(d, heads, c.HeadDim) }
	}
	if err := add("token_embd.weight", "model.embed_tokens.weight", nil); err != nil {
		return err
	}
	for l := range c.Layers {
		p, b := fmt.Sprintf("model.layers.%d.", l), fmt.Sprintf("blk.%d.", l)
		ts := []struct {
			to, from string
			rows     func([]float32) []float32
		}{
			{"attn_norm.weight", "input_layernorm.weight", nil},
			{"attn_q.weight", "self_attn.q_proj.weight", permute(c.Heads)},
			{"attn_k.weight", "self_attn.k_proj.weight", permute(c.KVHeads)},
			{"attn_v.weight", "self_attn.v_proj.weight", nil},
			{"attn_output.weight", "self_attn.o_proj.weight", nil},
			{"ffn_norm.weight", "post_attention_layernorm.weight", nil},
			{"ffn_gate.weight", "mlp.gate_proj.weight", nil},
			{"ffn_up.weight", "mlp.up_proj.weight", nil},
			{"ffn_down.weight", "mlp.down_proj.weight", nil},
		}
		if c.QKVBias {
			ts = append(ts, []struct {
				to, from string
				rows     func([]float32) []float32
			}{
				{"attn_q.bias", "self_attn.q_proj.bias", nil},
				{"attn_k.bias", "self_attn.k_proj.bias", nil},
				{"attn_v.bias", "self_attn.v_proj.bias", nil},
			}...)
		}
		for _, t := range ts {
			if err := add(b+t.to, p+t.from, t.rows); err != nil {
				return err
			}
		}
	}
	if err := add("output_norm.weight", "model.norm.weight", nil); err != nil {
		return err
	}
	if !c.TiedEmbeddings {
		if err := add("output.weight", "lm_head.weight", nil); err != nil {
			return err
		}
	}
	if c.RopeScaling != nil {
		// llama3's rope_scaling as llama.cpp's converter writes it: each
		// frequency's divisor, the plain frequency over the scaled one.
		plain := *c
		plain.RopeScaling = nil
		base, scaled := plain.InvFreq(), c.InvFreq()
		factors := make([]float32, len(base))
		for i := range factors {
			factors[i] = float32(base[i] / scaled[i])
		}
		if err := g.Tensor("rope_freqs.weight", []int{len(factors)}, gguf.F32, factors); err != nil {
			return err
		}
	}
	return g.WriteFile(path)
}

// WriteLlama is Write, for a Llama or Mistral decoder.
func WriteLlama(path string, c *models.DecoderConfig, w *models.Weights, o Options) error {
	if c.Family != models.FamilyLlama && c.Family != models.FamilyMistral {
		return fmt.Errorf("gguf: family %s: only llama and mistral rotate like llama.cpp's llama architecture", c.Family)
	}
	return Write(path, c, w, o)
}

// PermuteRoPE reorders the rows of a [heads*headDim, in] projection from
// transformers' rotate-half layout to llama.cpp's adjacent pairs: within
// each head, row 2i takes row i and row 2i+1 row headDim/2+i.
func PermuteRoPE(w []float32, heads, headDim int) []float32 {
	return gguf.PermuteRoPE(w, heads, headDim)
}
