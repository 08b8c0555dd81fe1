package models

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTorchConfig(t *testing.T) {
	base := `
architecture: torch
torch: {module: model.py, config: {width: 16}}
inputs:
  - {name: image, datatype: FP32, shape: [-1, 1, 8, 8]}
  - {name: tokens, datatype: INT64, shape: [-1, -1], pad: 1}
outputs:
  - {name: logits, datatype: FP32, shape: [-1, 10]}
  - {name: best, datatype: INT32, shape: [-1, 1]}
buckets: {batch: [1, 8], seq: [32]}
`
	cfg, err := ParseConfig(strings.NewReader(base))
	require.NoError(t, err)
	assert.Equal(t, "build", cfg.Torch.Factory, "the factory defaults to build")
	assert.Equal(t, map[string]any{"width": 16}, cfg.Torch.Config)
	assert.Equal(t, 1.0, *cfg.Inputs[1].Pad)

	for _, tc := range []struct{ name, from, to, want string }{
		{"no torch section", "torch: {module: model.py, config: {width: 16}}", "", "torch: is required for architecture torch"},
		{"module outside", "module: model.py", "module: ../other/model.py", `torch.module: "../other/model.py" must be a .py file in the model directory`},
		{"module absolute", "module: model.py", "module: /etc/model.py", "torch.module"},
		{"module not python", "module: model.py", "module: model.pt", "torch.module"},
		{"factory not an identifier", "config:", "factory: 'os.system', config:", `torch.factory: "os.system" is not a Python identifier`},
		{"weights not safetensors", "config:", "weights: model.pt, config:", "torch.weights"},
		{"input datatype", "datatype: FP32, shape: [-1, 1, 8, 8]", "datatype: BYTES, shape: [-1, 1, 8, 8]", "inputs[0].datatype: BYTES (strings) cannot be a tensor on the device"},
		{"output datatype", "datatype: INT32, shape: [-1, 1]", "datatype: BYTES, shape: [-1, 1]", "outputs[1].datatype: BYTES (strings) cannot be a tensor"},
		{"variable output", "{name: logits, datatype: FP32, shape: [-1, 10]}", "{name: logits, datatype: FP32, shape: [-1, -1]}", "outputs[0].shape"},
		{"pad without a variable dimension", "shape: [-1, 1, 8, 8]}", "shape: [-1, 1, 8, 8], pad: 2}", `inputs[0].pad: input "image" has no variable dimension to pad`},
		{"variable dimension without seq buckets", "seq: [32]", "", "buckets.seq: an input has a variable second dimension"},
		{"cpu engine", "buckets:", "engine: cpu\nbuckets:", "engine: cpu (the Go engine) cannot run architecture torch; use torch or rbln"},
		{"mlp section too", "torch: {", "mlp: {sizes: [1, 2]}\ntorch: {", "torch takes a torch section only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Contains(t, base, tc.from)
			_, err := ParseConfig(strings.NewReader(strings.Replace(base, tc.from, tc.to, 1)))
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrConfig)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestDatatypeEncode(t *testing.T) {
	assert.Equal(t, []byte{1, 0, 0, 0, 0, 0, 0, 0}, INT64.Encode(1))
	assert.Equal(t, []byte{0xff, 0xff, 0xff, 0xff}, INT32.Encode(-1))
	assert.Equal(t, []byte{1}, BOOL.Encode(3))
	assert.Equal(t, []byte{0, 0, 0x80, 0x3f}, FP32.Encode(1))
	assert.Equal(t, []byte{0, 0x3c}, FP16.Encode(1))
	assert.Equal(t, []byte{0x80, 0x3f}, BF16.Encode(1))
	assert.Equal(t, []byte{0, 0xc0}, FP16.Encode(-2))
}

// TestUnneededIntegerTensorsAreSkipped: a checkpoint's I64 tensor that the
// architecture does not take (BERT's embeddings.position_ids) is left
// unread; one it takes is refused by name.
func TestUnneededIntegerTensorsAreSkipped(t *testing.T) {
	var buf bytes.Buffer
	header := `{"layers.0.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},` +
		`"layers.0.bias":{"dtype":"F32","shape":[2],"data_offsets":[24,32]},` +
		`"embeddings.position_ids":{"dtype":"I64","shape":[1,4],"data_offsets":[32,64]}}`
	binary.Write(&buf, binary.LittleEndian, uint64(len(header)))
	buf.WriteString(header)
	buf.Write(make([]byte, 64))
	w, err := ParseSafetensors(buf.Bytes())
	require.NoError(t, err)
	_, err = NewMLP(&MLPConfig{Sizes: []int{3, 2}, Activation: "relu"}, w)
	require.NoError(t, err, "the I64 tensor nobody asked for is skipped")
	_, err = w.Tensor("embeddings.position_ids", 1, 4)
	assert.ErrorContains(t, err, `tensor "embeddings.position_ids" is I64; want F32, F16 or BF16`)
}

// TestTorchSaveFilesAreNamed: a torch.save file given as safetensors says
// what it is instead of reading its first bytes as a header length.
func TestTorchSaveFilesAreNamed(t *testing.T) {
	zip := append([]byte("PK\x03\x04"), make([]byte, 60)...)
	_, err := ParseSafetensors(zip)
	assert.ErrorContains(t, err, "this is a zip archive, as torch.save writes, not safetensors")
	pickle := append([]byte{0x80, 0x02}, make([]byte, 60)...)
	_, err = ParseSafetensors(pickle)
	assert.ErrorContains(t, err, "this is a Python pickle (an old torch.save), not safetensors")
}
