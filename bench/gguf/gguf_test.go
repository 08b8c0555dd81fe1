package gguf

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/internal/half"
	"github.com/stepserve/stepserve/internal/randweights"
	"github.com/stepserve/stepserve/models"
)

// parsed is a GGUF file read back by the format's description.
type parsed struct {
	kv      map[string]any
	tensors map[string]parsedTensor
}

type parsedTensor struct {
	dims []uint64
	typ  Type
	data []byte
}

func parse(t *testing.T, b []byte) parsed {
	t.Helper()
	require.Equal(t, "GGUF", string(b[:4]))
	le := binary.LittleEndian
	require.Equal(t, uint32(3), le.Uint32(b[4:]))
	nt, nkv := le.Uint64(b[8:]), le.Uint64(b[16:])
	off := 24
	u32 := func() uint32 { v := le.Uint32(b[off:]); off += 4; return v }
	u64 := func() uint64 { v := le.Uint64(b[off:]); off += 8; return v }
	str := func() string { n := int(u64()); s := string(b[off : off+n]); off += n; return s }
	var value func(typ uint32) any
	value = func(typ uint32) any {
		switch typ {
		case tUint32, tInt32:
			return u32()
		case tFloat32:
			return math.Float32frombits(u32())
		case tString:
			return str()
		case tArray:
			et, n := u32(), u64()
			out := make([]any, n)
			for i := range out {
				out[i] = value(et)
			}
			return out
		}
		t.Fatalf("value type %d", typ)
		return nil
	}
	p := parsed{kv: map[string]any{}, tensors: map[string]parsedTensor{}}
	for range nkv {
		k := str()
		p.kv[k] = value(u32())
	}
	type info struct {
		name   string
		pt     parsedTensor
		offset uint64
	}
	var infos []info
	for range nt {
		in := info{name: str()}
		nd := u32()
		for range nd {
			in.pt.dims = append(in.pt.dims, u64())
		}
		in.pt.typ = Type(u32())
		in.offset = u64()
		infos = append(infos, in)
	}
	data := (off + alignment - 1) / alignment * alignment
	for _, in := range infos {
		n := uint64(1)
		for _, d := range in.pt.dims {
			n *= d
		}
		require.Zero(t, in.offset%alignment, in.name)
		start := uint64(data) + in.offset
		_, size := in.pt.typ.Block()
		in.pt.data = b[start : start+n*uint64(size)]
		p.tensors[in.name] = in.pt
	}
	return p
}

// A decoder written as GGUF reads back with llama.cpp's names, the
// dimensions innermost first, q and k rows paired for llama.cpp's rotary
// layout, the norms in float32 and the rest in float16 when asked.
func TestWriteLlama(t *testing.T) {
	dir := t.TempDir()
	tok, err := randweights.ByteLevelTokenizer(300)
	require.NoError(t, err)
	shape := randweights.Decoder{Vocab: 300, Hidden: 16, Layers: 2, Heads: 4, KVHeads: 2, Inter: 24, MaxPosition: 64, RopeTheta: 10000, BOS: 1, EOS: 2}
	require.NoError(t, randweights.WriteDecoderFolder(dir, randweights.DecoderFolder{Shape: shape, Seed: 3, Tokenizer: tok, Generator: "test"}))
	m, err := models.Load(dir)
	require.NoError(t, err)
	c := m.Config.Decoder
	for _, typ := range []Type{F32, F16} {
		path := filepath.Join(dir, "m.gguf")
		require.NoError(t, WriteLlama(path, c, m.Weights, Options{Name: "t", Type: typ, BOS: 1, EOS: 2}))
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		p := parse(t, b)
		assert.Equal(t, "llama", p.kv["general.architecture"])
		assert.Equal(t, uint32(4), p.kv["llama.attention.head_count"])
		assert.Equal(t, uint32(2), p.kv["llama.attention.head_count_kv"])
		assert.Len(t, p.kv["tokenizer.ggml.tokens"], 300)
		assert.Len(t, p.tensors, 1+2*9+1+1, "embeddings, 9 a layer, the final norm and the untied head")

		q := p.tensors["blk.1.attn_q.weight"]
		assert.Equal(t, []uint64{16, 16}, q.dims)
		assert.Equal(t, typ, q.typ)
		assert.Equal(t, F32, p.tensors["blk.1.attn_norm.weight"].typ)
		assert.Equal(t, []uint64{16, 300}, p.tensors["token_embd.weight"].dims)
		// Head 1 of k (head_dim 4): row 2 of the file is transformers'
		// row 1, row 3 is row 3.
		want := m.Weights.Tensors["model.layers.1.self_attn.k_proj.weight"].Data
		k := p.tensors["blk.1.attn_k.weight"]
		for _, r := range []struct{ file, hf int }{{4, 4}, {5, 6}, {6, 5}, {7, 7}} {
			for col := range 16 {
				assert.InDelta(t, want[r.hf*16+col], elem(k, r.file*16+col), 1e-3*math.Abs(float64(want[r.hf*16+col]))+1e-6)
			}
		}
	}
	c2 := *c
	c2.QKVBias = true
	assert.ErrorContains(t, WriteLlama(filepath.Join(dir, "x.gguf"), &c2, m.Weights, Options{}), "biases")
}

func elem(p parsedTensor, i int) float32 {
	if p.typ == F16 {
		return half.ToFloat32(binary.LittleEndian.Uint16(p.data[2*i:]))
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(p.data[4*i:]))
}
