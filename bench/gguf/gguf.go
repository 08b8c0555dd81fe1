// Package gguf writes a Hugging Face Llama-family decoder as a GGUF file,
// the format llama.cpp reads, so that make bench can run llama.cpp on the
// very weights stepserve serves. It is written from the format's
// description (ggml's docs/gguf.md): a header, typed key/value metadata,
// tensor descriptions, then the tensors' data, each aligned to 32 bytes.
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
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"slices"

	"github.com/stepserve/stepserve/internal/half"
	"github.com/stepserve/stepserve/models"
)

// Type is a tensor's element type in GGUF's numbering.
type Type uint32

const (
	F32 Type = 0
	F16 Type = 1
)

// value types of metadata
const (
	tUint32  = 4
	tInt32   = 5
	tFloat32 = 6
	tString  = 8
	tArray   = 9
)

const alignment = 32

// Writer accumulates metadata and tensors and writes them out.
type Writer struct {
	kv      []kv
	tensors []tensor
}

type kv struct {
	key   string
	typ   uint32
	value any
}

type tensor struct {
	name string
	dims []uint64 // innermost first
	typ  Type
	data []float32
}

// String, Uint32, Int32 and Float32 add a metadata key.
func (w *Writer) String(key, v string)        { w.kv = append(w.kv, kv{key, tString, v}) }
func (w *Writer) Uint32(key string, v uint32) { w.kv = append(w.kv, kv{key, tUint32, v}) }
func (w *Writer) Int32(key string, v int32)   { w.kv = append(w.kv, kv{key, tInt32, v}) }
func (w *Writer) Float32(key string, v float32) {
	w.kv = append(w.kv, kv{key, tFloat32, v})
}

// Strings, Int32s and Float32s add an array-valued key.
func (w *Writer) Strings(key string, v []string)   { w.kv = append(w.kv, kv{key, tArray, v}) }
func (w *Writer) Int32s(key string, v []int32)     { w.kv = append(w.kv, kv{key, tArray, v}) }
func (w *Writer) Float32s(key string, v []float32) { w.kv = append(w.kv, kv{key, tArray, v}) }

// Tensor adds a tensor of the given row-major shape (outermost first, as
// safetensors and torch write it), stored as typ.
func (w *Writer) Tensor(name string, shape []int, typ Type, data []float32) error {
	n := 1
	dims := make([]uint64, len(shape))
	for i, d := range shape {
		n *= d
		dims[len(shape)-1-i] = uint64(d)
	}
	if n != len(data) {
		return fmt.Errorf("gguf: tensor %s: shape %v holds %d values, got %d", name, shape, n, len(data))
	}
	w.tensors = append(w.tensors, tensor{name, dims, typ, data})
	return nil
}

// WriteTo writes the file.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	c := &counter{w: bufio.NewWriterSize(out, 1<<20)}
	c.raw([]byte("GGUF"))
	c.u32(3)
	c.u64(uint64(len(w.tensors)))
	c.u64(uint64(len(w.kv)))
	for _, e := range w.kv {
		c.str(e.key)
		c.u32(e.typ)
		switch v := e.value.(type) {
		case string:
			c.str(v)
		case uint32:
			c.u32(v)
		case int32:
			c.u32(uint32(v))
		case float32:
			c.u32(math.Float32bits(v))
		case []string:
			c.u32(tString)
			c.u64(uint64(len(v)))
			for _, s := range v {
				c.str(s)
			}
		case []int32:
			c.u32(tInt32)
			c.u64(uint64(len(v)))
			for _, x := range v {
				c.u32(uint32(x))
			}
		case []float32:
			c.u32(tFloat32)
			c.u64(uint64(len(v)))
			for _, x := range v {
				c.u32(math.Float32bits(x))
			}
		}
	}
	var offset uint64
	for _, t := range w.tensors {
		c.str(t.name)
		c.u32(uint32(len(t.dims)))
		for _, d := range t.dims {
			c.u64(d)
		}
		c.u32(uint32(t.typ))
		c.u64(offset)
		offset += pad(uint64(len(t.data)) * t.typ.size())
	}
	c.raw(make([]byte, pad(uint64(c.n))-uint64(c.n)))
	buf := make([]byte, 0, 1<<16)
	for _, t := range w.tensors {
		size := uint64(len(t.data)) * t.typ.size()
		for i, x := range t.data {
			if t.typ == F16 {
				buf = binary.LittleEndian.AppendUint16(buf, half.FromFloat32(x))
			} else {
				buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(x))
			}
			if len(buf) >= 1<<16-4 || i == len(t.data)-1 {
				c.raw(buf)
				buf = buf[:0]
			}
		}
		c.raw(make([]byte, pad(size)-size))
	}
	if c.err == nil {
		c.err = c.w.Flush()
	}
	return c.n, c.err
}

func (t Type) size() uint64 {
	if t == F16 {
		return 2
	}
	return 4
}

func pad(n uint64) uint64 { return (n + alignment - 1) / alignment * alignment }

type counter struct {
	w   *bufio.Writer
	n   int64
	err error
}

func (c *counter) raw(b []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(b)
	c.n += int64(n)
	c.err = err
}

func (c *counter) u32(v uint32) { c.raw(binary.LittleEndian.AppendUint32(nil, v)) }
func (c *counter) u64(v uint64) { c.raw(binary.LittleEndian.AppendUint64(nil, v)) }
func (c *counter) str(s string) {
	c.u64(uint64(len(s)))
	c.raw([]byte(s))
}

// Options choose how WriteLlama stores the model.
type Options struct {
	Name string
	// Type stores the two-dimensional weights; norms stay float32, as
	// llama.cpp's converter keeps them.
	Type Type
	// BOS and EOS are the special token ids.
	BOS, EOS int
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
	var g Writer
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

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := g.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("gguf: %s: %w", path, err)
	}
	return f.Close()
}

// PermuteRoPE reorders the rows of a [heads*headDim, in] projection from
// transformers' rotate-half layout to llama.cpp's adjacent pairs: within
// each head, row 2i takes row i and row 2i+1 row headDim/2+i.
func PermuteRoPE(w []float32, heads, headDim int) []float32 {
	in := len(w) / (heads * headDim)
	out := slices.Clone(w)
	half := headDim / 2
	for h := range heads {
		for i := range half {
			for k, src := range []int{i, half + i} {
				dst := (h*headDim + 2*i + k) * in
				s := (h*headDim + src) * in
				copy(out[dst:dst+in], w[s:s+in])
			}
		}
	}
	return out
}
