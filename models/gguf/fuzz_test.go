package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// fuzzSeed is a small valid file with a bit of everything the reader
// checks: typed and nested metadata, a tokenizer, a decoder's keys and
// tensors of each readable type.
func fuzzSeed(tb testing.TB) []byte {
	var w Writer
	w.String("general.architecture", "llama")
	w.Uint32("general.alignment", 32)
	for k, v := range map[string]uint32{"block_count": 1, "embedding_length": 32, "feed_forward_length": 32,
		"attention.head_count": 2, "context_length": 16} {
		w.Uint32("llama."+k, v)
	}
	w.Float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
	w.String("tokenizer.ggml.model", "llama")
	w.Strings("tokenizer.ggml.tokens", []string{"<unk>", "<s>", "</s>", "<0x41>", "▁", "a", "▁a"})
	w.Float32s("tokenizer.ggml.scores", []float32{0, 0, 0, 0, -1, -1, -0.5})
	w.Int32s("tokenizer.ggml.token_type", []int32{2, 3, 3, 6, 1, 1, 1})
	w.Uint32("tokenizer.ggml.bos_token_id", 1)
	w.Set("nested", []any{[]int32{1}, []string{"x"}})
	w.Set("flag", true)
	x := make([]float32, 256)
	for i := range x {
		x[i] = float32(i%17) - 8
	}
	for i, typ := range []Type{F32, F16, BF16, Q8_0, Q4_0} {
		if err := w.Tensor("t"+typ.String(), []int{8 - i, 32}, typ, x[:256-32*i]); err != nil {
			tb.Fatal(err)
		}
	}
	if err := w.RawTensor("k", []int{256}, Q4_K, make([]byte, 144)); err != nil {
		tb.Fatal(err)
	}
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		tb.Fatal(err)
	}
	return b.Bytes()
}

// FuzzParse feeds arbitrary bytes to the reader and to everything built
// on it: none may panic or hang, a refusal wraps ErrMalformed or
// ErrUnsupported, and an accepted file's tensors lie inside it.
func FuzzParse(f *testing.F) {
	seed := fuzzSeed(f)
	f.Add(seed)
	for _, n := range []int{0, 4, 8, 24, 40, len(seed) / 2, len(seed) - 1} {
		f.Add(seed[:n])
	}
	for _, at := range []int{8, 16, 24, 40, 100, 300} {
		b := bytes.Clone(seed)
		binary.LittleEndian.PutUint64(b[at:], 1<<60)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("error wraps neither ErrMalformed nor ErrUnsupported: %v", err)
			}
			return
		}
		var total uint64
		for i := range file.Tensors {
			ti := &file.Tensors[i]
			total += ti.Bytes
			if uint64(file.DataOffset)+ti.Offset+ti.Bytes > uint64(len(data)) {
				t.Fatalf("tensor %q ends past the file", ti.Name)
			}
			if ti.Type.Readable() {
				v, err := file.ReadFloat32(ti)
				if err != nil {
					t.Fatal(err)
				}
				if uint64(len(v)) != ti.Elements() {
					t.Fatalf("tensor %q: %d values, want %d", ti.Name, len(v), ti.Elements())
				}
			}
			if ti.Type == Q8_0 {
				if _, err := file.ReadQ8_0(ti); err != nil {
					t.Fatal(err)
				}
			}
		}
		if total > uint64(len(data)) {
			t.Fatalf("tensors of %d bytes in a file of %d", total, len(data))
		}
		if c, err := ReadDecoderConfig(file); err == nil {
			_, _ = DecoderTensors(file, c)
		}
		if tk, err := ReadTokenizer(file); err == nil {
			if _, err := tk.HFJSON(); err != nil {
				t.Fatal(err)
			}
		}
	})
}
