package gguf_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	benchgguf "github.com/stepserve/stepserve/bench/gguf"
	"github.com/stepserve/stepserve/internal/randweights"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/models/gguf"
)

// A llama decoder written by bench/gguf (as llama.cpp's converter lays it
// out: q and k rows permuted) reads back as the very config and tensors
// models.Load read from its Hugging Face folder.
func TestLlamaDecoderRoundTrip(t *testing.T) {
	dir := t.TempDir()
	tok, err := randweights.ByteLevelTokenizer(300)
	require.NoError(t, err)
	shape := randweights.Decoder{Vocab: 300, Hidden: 32, Layers: 2, Heads: 4, KVHeads: 2, Inter: 48, MaxPosition: 64, RopeTheta: 10000, BOS: 1, EOS: 2}
	require.NoError(t, randweights.WriteDecoderFolder(dir, randweights.DecoderFolder{Shape: shape, Seed: 5, Tokenizer: tok, Generator: "test"}))
	m, err := models.Load(dir)
	require.NoError(t, err)
	want := m.Config.Decoder
	path := filepath.Join(dir, "m.gguf")
	require.NoError(t, benchgguf.WriteLlama(path, want, m.Weights, benchgguf.Options{Name: "t", Type: gguf.F32, BOS: 1, EOS: 2}))

	f, err := gguf.Open(path)
	require.NoError(t, err)
	defer f.Close()
	c, err := gguf.ReadDecoderConfig(f)
	require.NoError(t, err)
	got := models.DecoderConfig{Family: c.Family, Vocab: c.Vocab, Hidden: c.Hidden, Layers: c.Layers, Heads: c.Heads, KVHeads: c.KVHeads,
		HeadDim: c.HeadDim, Intermediate: c.Intermediate, MaxPosition: c.MaxPosition, RMSNormEps: c.RMSNormEps, RopeTheta: c.RopeTheta,
		QKVBias: c.QKVBias, OBias: c.OBias, TiedEmbeddings: c.TiedEmbeddings}
	w := *want
	w.RMSNormEps = float64(float32(w.RMSNormEps)) // written as float32
	assert.Equal(t, w, got)

	ts, err := gguf.DecoderTensors(f, c)
	require.NoError(t, err)
	assert.Len(t, ts, len(m.Weights.Tensors))
	for _, dt := range ts {
		hf := m.Weights.Tensors[dt.HF]
		require.NotNil(t, hf, dt.HF)
		assert.Equal(t, hf.Shape, dt.Shape, dt.HF)
		data, err := f.ReadDecoderTensor(&dt, c.HeadDim)
		require.NoError(t, err)
		assert.Equal(t, hf.Data, data, dt.HF)
	}
}

// A qwen2 decoder keeps its rows as transformers has them (llama.cpp
// rotates qwen2 by halves), has q, k and v biases, and may tie its
// output to the embeddings; Q8_0 weights come back within their step.
func TestQwen2Decoder(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const vocab, hidden, heads, kvHeads, inter = 40, 64, 4, 2, 96
	hd := hidden / heads
	var w gguf.Writer
	w.String("general.architecture", "qwen2")
	for k, v := range map[string]uint32{"block_count": 1, "embedding_length": hidden, "feed_forward_length": inter,
		"attention.head_count": heads, "attention.head_count_kv": kvHeads, "context_length": 128} {
		w.Uint32("qwen2."+k, v)
	}
	w.Float32("qwen2.attention.layer_norm_rms_epsilon", 1e-6)
	w.Float32("qwen2.rope.freq_base", 1e6)
	w.Strings("tokenizer.ggml.tokens", make([]string, vocab))
	want := map[string][]float32{}
	add := func(name string, typ gguf.Type, shape ...int) {
		n := 1
		for _, d := range shape {
			n *= d
		}
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		require.NoError(t, w.Tensor(name, shape, typ, x))
		want[name] = x
	}
	add("token_embd.weight", gguf.Q8_0, vocab, hidden)
	add("blk.0.attn_norm.weight", gguf.F32, hidden)
	add("blk.0.attn_q.weight", gguf.Q8_0, hidden, hidden)
	add("blk.0.attn_q.bias", gguf.F32, hidden)
	add("blk.0.attn_k.weight", gguf.F16, kvHeads*hd, hidden)
	add("blk.0.attn_k.bias", gguf.F32, kvHeads*hd)
	add("blk.0.attn_v.weight", gguf.BF16, kvHeads*hd, hidden)
	add("blk.0.attn_v.bias", gguf.F32, kvHeads*hd)
	add("blk.0.attn_output.weight", gguf.Q4_0, hidden, hidden)
	add("blk.0.ffn_norm.weight", gguf.F32, hidden)
	add("blk.0.ffn_gate.weight", gguf.Q8_0, inter, hidden)
	add("blk.0.ffn_up.weight", gguf.Q8_0, inter, hidden)
	add("blk.0.ffn_down.weight", gguf.Q8_0, hidden, inter)
	add("output_norm.weight", gguf.F32, hidden)
	var b bytes.Buffer
	_, err := w.WriteTo(&b)
	require.NoError(t, err)
	f, err := gguf.Parse(bytes.NewReader(b.Bytes()), int64(b.Len()))
	require.NoError(t, err)
	c, err := gguf.ReadDecoderConfig(f)
	require.NoError(t, err)
	assert.Equal(t, &gguf.DecoderConfig{Architecture: "qwen2", Family: "qwen2", Vocab: vocab, Hidden: hidden, Layers: 1, Heads: heads,
		KVHeads: kvHeads, HeadDim: hd, Intermediate: inter, MaxPosition: 128, RMSNormEps: float64(float32(1e-6)), RopeTheta: 1e6,
		QKVBias: true, TiedEmbeddings: true}, c)
	ts, err := gguf.DecoderTensors(f, c)
	require.NoError(t, err)
	assert.Len(t, ts, 14)
	for _, dt := range ts {
		assert.Zero(t, dt.PermutedHeads, dt.HF)
		data, err := f.ReadDecoderTensor(&dt, hd)
		require.NoError(t, err)
		tol := map[gguf.Type]float64{gguf.F32: 0, gguf.F16: 2e-3, gguf.BF16: 2e-2, gguf.Q8_0: 0.04, gguf.Q4_0: 0.6}[dt.Info.Type]
		for i, x := range want[dt.Info.Name] {
			require.InDelta(t, x, data[i], tol*max(1, float64(abs(x))), "%s [%d]", dt.HF, i)
		}
	}
	hf, ok := gguf.HFName("blk.0.attn_q.bias")
	assert.True(t, ok)
	assert.Equal(t, "model.layers.0.self_attn.q_proj.bias", hf)
	for _, n := range []string{"blk.x.attn_q.weight", "blk.01.attn_q.weight", "blk.0.attn_q", "rope_freqs.weight", "blk.0.ffn_gate_exps.weight"} {
		_, ok := gguf.HFName(n)
		assert.False(t, ok, n)
	}
}

func abs(x float32) float32 { return max(x, -x) }

// A file missing a key or a tensor, or holding a type or architecture
// stepserve does not run, is refused by name.
func TestDecoderRefusals(t *testing.T) {
	base := func(arch string) *gguf.Writer {
		var w gguf.Writer
		w.String("general.architecture", arch)
		for k, v := range map[string]uint32{"block_count": 1, "embedding_length": 32, "feed_forward_length": 32,
			"attention.head_count": 4, "context_length": 16, "vocab_size": 8} {
			w.Uint32(arch+"."+k, v)
		}
		w.Float32(arch+".attention.layer_norm_rms_epsilon", 1e-5)
		return &w
	}
	read := func(w *gguf.Writer) (*gguf.File, error) {
		var b bytes.Buffer
		_, err := w.WriteTo(&b)
		require.NoError(t, err)
		return gguf.Parse(bytes.NewReader(b.Bytes()), int64(b.Len()))
	}
	for _, c := range []struct {
		name string
		w    func() *gguf.Writer
		want string
	}{
		{"arch", func() *gguf.Writer { return base("gemma") }, `general.architecture "gemma"; want llama, mistral or qwen2`},
		{"eps", func() *gguf.Writer {
			w := base("llama")
			w.Float32("llama.attention.layer_norm_rms_epsilon", 0)
			return w
		}, "layer_norm_rms_epsilon\" is 0"},
		{"layers", func() *gguf.Writer { w := base("llama"); w.Uint32("llama.block_count", 1<<30); return w }, `"llama.block_count" is 1073741824; want 1..1024`},
		{"kv heads", func() *gguf.Writer { w := base("llama"); w.Uint32("llama.attention.head_count_kv", 3); return w }, "want a divisor"},
		{"yarn", func() *gguf.Writer { w := base("llama"); w.String("llama.rope.scaling.type", "yarn"); return w }, `rope.scaling.type "yarn"`},
		{"moe", func() *gguf.Writer { w := base("llama"); w.Uint32("llama.expert_count", 8); return w }, "mixture-of-experts"},
		{"qwen2 without biases", func() *gguf.Writer { return base("qwen2") }, "without blk.0.attn_q.bias"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := read(c.w())
			require.NoError(t, err)
			_, err = gguf.ReadDecoderConfig(f)
			assert.ErrorContains(t, err, c.want)
		})
	}
	// The tensors: a missing one, a wrong shape, an unreadable type.
	w := base("llama")
	f, err := read(w)
	require.NoError(t, err)
	c, err := gguf.ReadDecoderConfig(f)
	require.NoError(t, err)
	_, err = gguf.DecoderTensors(f, c)
	assert.ErrorContains(t, err, `tensor "token_embd.weight" (model.embed_tokens.weight, shape [8 32]) is missing`)
	w = base("llama")
	require.NoError(t, w.Tensor("token_embd.weight", []int{32, 8}, gguf.F32, make([]float32, 256)))
	f, _ = read(w)
	_, err = gguf.DecoderTensors(f, c)
	assert.ErrorContains(t, err, "has shape [32 8] (dims [8 32]); want [8 32]")
	w = base("llama")
	require.NoError(t, w.RawTensor("token_embd.weight", []int{8, 256}, gguf.Q3_K, make([]byte, 8*110)))
	w.Uint32("llama.embedding_length", 256)
	f, _ = read(w)
	c, err = gguf.ReadDecoderConfig(f)
	require.NoError(t, err)
	_, err = gguf.DecoderTensors(f, c)
	assert.ErrorIs(t, err, gguf.ErrUnsupported)
	assert.ErrorContains(t, err, "is Q3_K")
}

// Unpermuting undoes llama.cpp's permutation, for any element type.
func TestPermuteRoPE(t *testing.T) {
	rows := make([]int8, 2*8*3) // 2 heads of 8 rows of 3
	for i := range rows {
		rows[i] = int8(i)
	}
	p := gguf.PermuteRoPE(rows, 2, 8)
	assert.Equal(t, rows, gguf.UnpermuteRoPE(p, 2, 8))
	assert.Equal(t, []int8{0, 1, 2}, p[0:3])
	assert.Equal(t, []int8{12, 13, 14}, p[3:6], "row 1 of the file is row headDim/2 = 4")
	assert.Equal(t, fmt.Sprint(benchgguf.PermuteRoPE([]float32{0, 1, 2, 3}, 1, 4)), fmt.Sprint([]float32{0, 2, 1, 3}))
}
