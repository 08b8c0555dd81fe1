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
	// llama.cpp's converter keeps them.
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

// WriteLlama writes the decoder c with weights w (transformers' names,
// float32 data read) to path as a GGUF file of architecture "llama". The
// vocabulary is a placeholder of the right size (llama.cpp needs one to
// load; the benchmark feeds token ids, never text): <unk>, <s>, </s>, the
// 256 byte tokens, then one word per remaining id.
func WriteLlama(path string, c *models.DecoderConfig, w *models.Weights, o Options) error {
	if c.Family != models.FamilyLlama && c.Family != models.FamilyMistral {
		return fmt.Errorf("gguf: family %s: only llama and mistral rotate like llama.cpp's llama architecture", c.Family)
	}
	if c.QKVBias || c.OBias {
		return fmt.Errorf("gguf: attention biases are not written")
	}
	if c.RopeScaling != nil {
		return fmt.Errorf("gguf: rope_scaling is not written")
	}
	if c.Vocab < 260 {
		return fmt.Errorf("gguf: vocabulary of %d: the placeholder vocabulary needs at least 260 ids", c.Vocab)
	}
	var g gguf.Writer
	g.String("general.architecture", "llama")
	g.String("general.name", o.Name)
	g.Uint32("general.alignment", alignment)
	ft := uint32(0)
	if o.Type == F16 {
		ft = 1
	}
	g.Uint32("general.file_type", ft)
	g.Uint32("llama.context_length", uint32(c.MaxPosition))
	g.Uint32("llama.embedding_length", uint32(c.Hidden))
	g.Uint32("llama.block_count", uint32(c.Layers))
	g.Uint32("llama.feed_forward_length", uint32(c.Intermediate))
	g.Uint32("llama.attention.head_count", uint32(c.Heads))
	g.Uint32("llama.attention.head_count_kv", uint32(c.KVHeads))
	g.Uint32("llama.attention.key_length", uint32(c.HeadDim))
	g.Uint32("llama.attention.value_length", uint32(c.HeadDim))
	g.Uint32("llama.rope.dimension_count", uint32(c.HeadDim))
	g.Float32("llama.rope.freq_base", float32(c.RopeTheta))
	g.Float32("llama.attention.layer_norm_rms_epsilon", float32(c.RMSNormEps))
	g.Uint32("llama.vocab_size", uint32(c.Vocab))
	if c.SlidingWindow > 0 {
		return fmt.Errorf("gguf: a sliding window is not written")
	}

	if o.Tokenizer != nil {
		if err := g.WriteHFTokenizer(o.Tokenizer, o.ChatTemplate, o.BOS, o.EOS, o.AddBOS); err != nil {
			return err
		}
	} else {
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
		g.Uint32("tokenizer.ggml.bos_token_id", uint32(o.BOS))
		g.Uint32("tokenizer.ggml.eos_token_id", uint32(o.EOS))
		g.Uint32("tokenizer.ggml.unknown_token_id", 0)
	}

	add := func(to, from string, typ Type, rows func([]float32) []float32) error {
		t, ok := w.Tensors[from]
		if !ok || t.Data == nil {
			return fmt.Errorf("gguf: tensor %s is missing", from)
		}
		if len(t.Shape) == 1 {
			typ = F32
		}
		data := t.Data
		if rows != nil {
			data = rows(data)
		}
		return g.Tensor(to, t.Shape, typ, data)
	}
	if err := add("token_embd.weight", "model.embed_tokens.weight", o.Type, nil); err != nil {
		return err
	}
	for l := range c.Layers {
		p, b := fmt.Sprintf("model.layers.%d.", l), fmt.Sprintf("blk.%d.", l)
		for _, m := range []struct {
			to, from string
			rows     func([]float32) []float32
		}{
			{"attn_norm", "input_layernorm", nil},
			{"attn_q", "self_attn.q_proj", func(d []float32) []float32 { return PermuteRoPE(d, c.Heads, c.HeadDim) }},
			{"attn_k", "self_attn.k_proj", func(d []float32) []float32 { return PermuteRoPE(d, c.KVHeads, c.HeadDim) }},
			{"attn_v", "self_attn.v_proj", nil},
			{"attn_output", "self_attn.o_proj", nil},
			{"ffn_norm", "post_attention_layernorm", nil},
			{"ffn_gate", "mlp.gate_proj", nil},
			{"ffn_up", "mlp.up_proj", nil},
			{"ffn_down", "mlp.down_proj", nil},
		} {
			if err := add(b+m.to+".weight", p+m.from+".weight", o.Type, m.rows); err != nil {
				return err
			}
		}
	}
	if err := add("output_norm.weight", "model.norm.weight", F32, nil); err != nil {
		return err
	}
	if !c.TiedEmbeddings {
		if err := add("output.weight", "lm_head.weight", o.Type, nil); err != nil {
			return err
		}
	}

	return g.WriteFile(path)
}

// PermuteRoPE reorders the rows of a [heads*headDim, in] projection from
// transformers' rotate-half layout to llama.cpp's adjacent pairs: within
// each head, row 2i takes row i and row 2i+1 row headDim/2+i.
func PermuteRoPE(w []float32, heads, headDim int) []float32 {
	return gguf.PermuteRoPE(w, heads, headDim)
}
