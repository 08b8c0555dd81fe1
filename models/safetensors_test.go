package models

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSafetensorsRoundTrip(t *testing.T) {
	in := []*Tensor{
		{Name: "b", Shape: []int{3}, Data: []float32{1, -2, 3.5}},
		{Name: "a.weight", Shape: []int{2, 2}, Data: []float32{0.25, 0, -1e-3, 7}},
	}
	var buf bytes.Buffer
	require.NoError(t, WriteSafetensors(&buf, in, map[string]string{"format": "pt"}))
	require.Zero(t, (buf.Len()-8-int(binary.LittleEndian.Uint64(buf.Bytes())))%4)

	w, err := ParseSafetensors(buf.Bytes())
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"format": "pt"}, w.Metadata)
	require.Len(t, w.Tensors, 2)
	assert.Equal(t, []float32{1, -2, 3.5}, w.Tensors["b"].Data)
	assert.Equal(t, []int{2, 2}, w.Tensors["a.weight"].Shape)
	assert.Equal(t, []float32{0.25, 0, -1e-3, 7}, w.Tensors["a.weight"].Data)

	_, err = w.Tensor("a.weight", 4)
	assert.ErrorContains(t, err, `tensor "a.weight" has shape [2 2], want [4]`)
	_, err = w.Tensor("missing", 1)
	assert.ErrorContains(t, err, `tensor "missing" is missing`)
}

// build assembles a safetensors file from a raw header and data section.
func build(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	return append(append(b, header...), data...)
}

func TestSafetensorsHalfPrecision(t *testing.T) {
	// 1.0, -2.0, 65504 (max half), smallest subnormal, as F16 and BF16.
	f16 := []uint16{0x3c00, 0xc000, 0x7bff, 0x0001}
	bf16 := []uint16{0x3f80, 0xc000, 0x4780, 0x0000}
	var data []byte
	for _, h := range f16 {
		data = binary.LittleEndian.AppendUint16(data, h)
	}
	for _, h := range bf16 {
		data = binary.LittleEndian.AppendUint16(data, h)
	}
	w, err := ParseSafetensors(build(`{"h":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},"bf":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}}`, data))
	require.NoError(t, err)
	assert.Equal(t, []float32{1, -2, 65504, float32(math.Ldexp(1, -24))}, w.Tensors["h"].Data)
	assert.Equal(t, []float32{1, -2, 65536, 0}, w.Tensors["bf"].Data)
}

func TestSafetensorsMalformed(t *testing.T) {
	eight := make([]byte, 8)
	tests := []struct {
		name string
		file []byte
		want string
	}{
		{"empty", nil, "shorter than the 8-byte header length"},
		{"huge header length", binary.LittleEndian.AppendUint64(nil, 1<<40), "exceeds the"},
		{"header past end", binary.LittleEndian.AppendUint64(nil, 100), "runs past the end"},
		{"header not JSON", build(`{"a":`, nil), "header is not a JSON object"},
		{"header a list", build(`[1,2]`, nil), "header is not a JSON object"},
		{"unsupported dtype", build(`{"t":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}}`, eight), `tensor "t": dtype "C64" is not supported`},
		{"negative dim", build(`{"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, eight), `tensor "t": negative dimension`},
		{"huge shape", build(`{"t":{"dtype":"F32","shape":[65536,65536,65536],"data_offsets":[0,8]}}`, eight), `tensor "t": shape [65536 65536 65536] is too large`},
		{"one offset", build(`{"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}}`, eight), `data_offsets must be [begin, end]`},
		{"truncated data", build(`{"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, eight), `tensor "t": data_offsets [0, 16] fall outside the 8-byte data section`},
		{"reversed offsets", build(`{"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}`, eight), `fall outside`},
		{"size mismatch", build(`{"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, eight), `span 8 bytes, but F32[3] needs 12`},
		{"overlap", build(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight), `overlap tensor`},
		{"gap", build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight), `4 unclaimed bytes`},
		{"trailing bytes", build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, eight), `4 bytes after the last tensor`},
		{"unknown entry key", build(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}}`, eight), `tensor "a": bad header entry`},
		{"bad metadata", build(`{"__metadata__":{"a":1}}`, nil), `__metadata__ must map strings to strings`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseSafetensors(tt.file)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrSafetensors), "error %v should wrap ErrSafetensors", err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestReadSafetensorsNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "weights.safetensors")
	require.NoError(t, os.WriteFile(path, build(`{"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, make([]byte, 8)), 0o644))
	_, err := ReadSafetensors(path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), `tensor "t"`)
}

// FuzzParseSafetensors checks that no input panics and that whatever parses
// describes tensors whose data matches their shapes.
func FuzzParseSafetensors(f *testing.F) {
	var buf bytes.Buffer
	WriteSafetensors(&buf, []*Tensor{{Name: "w", Shape: []int{2, 3}, Data: make([]float32, 6)}}, nil)
	f.Add(buf.Bytes())
	f.Add(build(`{"t":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`, make([]byte, 4)))
	f.Add(build(`{"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, make([]byte, 8)))
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := ParseSafetensors(b)
		if err != nil {
			return
		}
		for name, tensor := range w.Tensors {
			if len(tensor.Data) != tensor.Numel() {
				t.Fatalf("tensor %q: %d values for shape %v", name, len(tensor.Data), tensor.Shape)
			}
		}
	})
}
