package models

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const validMLP = `
architecture: mlp
mlp:
  sizes: [4, 8, 3]
inputs:
  - {name: x, datatype: FP32, shape: [-1, 4]}
outputs:
  - {name: y, datatype: FP32, shape: [-1, 3]}
buckets:
  batch: [1, 2, 8]
`

func TestParseConfigDefaults(t *testing.T) {
	c, err := ParseConfig(strings.NewReader(validMLP))
	require.NoError(t, err)
	assert.Equal(t, "1", c.Version)
	assert.Equal(t, "float16", c.DeviceDtype)
	assert.Equal(t, "relu", c.MLP.Activation)
	assert.Equal(t, "none", c.MLP.OutputActivation)
	assert.Equal(t, []int{1, 2, 8}, c.Buckets.Batch)
	assert.Equal(t, 16, c.Inputs[0].RowBytes(0))
	assert.Equal(t, "eager", c.Warmup)
	assert.Nil(t, c.Batching.MaxQueueDelay, "unset batching keys take the server's defaults")

	c, err = ParseConfig(strings.NewReader(validMLP + "warmup: lazy\nbatching:\n  max_queue_delay: 2ms\n  priority_levels: 3\n  default_priority_level: 2\n"))
	require.NoError(t, err)
	assert.Equal(t, "lazy", c.Warmup)
	assert.Equal(t, 2*time.Millisecond, *c.Batching.MaxQueueDelay)
	assert.Equal(t, 2, *c.Batching.DefaultPriorityLevel)

	// The ranges are batching.Policy.Validate's (batching/policy_test.go):
	// models keeps the values as written for it to check.
	c, err = ParseConfig(strings.NewReader(validMLP + "batching: {max_queue_size: 0, priority_levels: 2, default_priority_level: 3}\n"))
	require.NoError(t, err)
	assert.Equal(t, 0, *c.Batching.MaxQueueSize)
	assert.Equal(t, 3, *c.Batching.DefaultPriorityLevel)
}

func TestParseConfigErrors(t *testing.T) {
	tests := []struct {
		name, old, new, want string
	}{
		{"unknown key", "architecture: mlp", "architecture: mlp\nbatch_size: 4", `line 3: unknown key "batch_size"`},
		{"misspelt key", "architecture: mlp", "architecture: mlp\nbukets: {batch: [1]}", `line 3: unknown key "bukets"; did you mean "buckets"?`},
		{"misspelt nested key", "architecture: mlp", "architecture: mlp\nbatching: {max_queue_dely: 1ms}", `line 3: unknown key "max_queue_dely"; did you mean "max_queue_delay"?`},
		{"no architecture", "architecture: mlp", "", "architecture: is required"},
		{"bad architecture", "architecture: mlp", "architecture: cnn", `architecture: "cnn" is not supported`},
		{"no mlp section", "mlp:\n  sizes: [4, 8, 3]", "", "mlp: is required"},
		{"one size", "sizes: [4, 8, 3]", "sizes: [4]", "mlp.sizes: [4] needs at least"},
		{"zero width", "sizes: [4, 8, 3]", "sizes: [4, 0, 3]", "widths must be in 1..262144"},
		{"bad activation", "sizes: [4, 8, 3]", "sizes: [4, 8, 3]\n  activation: tanh", `mlp.activation: "tanh" is not supported; want relu or gelu`},
		{"bad output activation", "sizes: [4, 8, 3]", "sizes: [4, 8, 3]\n  output_activation: sigmoid", `mlp.output_activation: "sigmoid"`},
		{"input width", "shape: [-1, 4]", "shape: [-1, 5]", "inputs: an mlp with mlp.sizes [4 8 3] takes exactly one FP32 input of shape [-1, 4]"},
		{"output width", "shape: [-1, 3]", "shape: [-1, 2]", "outputs: an mlp"},
		{"input datatype", "{name: x, datatype: FP32", "{name: x, datatype: FP64", "inputs: an mlp"},
		{"unknown datatype", "{name: x, datatype: FP32", "{name: x, datatype: FLOAT", `inputs[0].datatype: unknown datatype "FLOAT"`},
		{"no batch dim", "shape: [-1, 4]", "shape: [4]", "inputs[0].shape: [4] must start with -1"},
		{"bad name", "{name: x,", "{name: ../x,", `inputs[0].name: "../x" is not a valid tensor name`},
		{"no buckets", "batch: [1, 2, 8]", "batch: []", "buckets.batch: is required"},
		{"unsorted buckets", "batch: [1, 2, 8]", "batch: [1, 8, 2]", "must be strictly increasing"},
		{"zero bucket", "batch: [1, 2, 8]", "batch: [0, 2]", "buckets.batch: 0 is not a valid batch size"},
		{"bad engine", "architecture: mlp", "architecture: mlp\nengine: gpu", `engine: "gpu" is not supported; want cpu or torch or rbln`},
		{"bad dtype", "architecture: mlp", "architecture: mlp\ndevice_dtype: int8", `device_dtype: "int8" is not supported`},
		{"bad quantization", "architecture: mlp", "architecture: mlp\nquantization: q5_1", `quantization: "q5_1" is not supported; want none or q8_0 or q4_0`},
		{"q4_0 off the CPU", "architecture: mlp", "architecture: mlp\nengine: rbln\nquantization: q4_0", "quantization: q4_0 runs on the CPU engine; engine rbln computes in device_dtype"},
		{"bad float16_overflow", "architecture: mlp", "architecture: mlp\nfloat16_overflow: wrap", `float16_overflow: "wrap" is not supported`},
		{"bad warmup", "architecture: mlp", "architecture: mlp\nwarmup: sometimes", `warmup: "sometimes" is not supported; want eager or lazy`},
		{"bad delay", "architecture: mlp", "architecture: mlp\nbatching: {max_queue_delay: soon}", `line 3: want a duration such as 5ms, found a string ("soon")`},
		{"bad version", "architecture: mlp", "architecture: mlp\nversion: a/b", `version: "a/b" is not a valid version`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := strings.Replace(validMLP, tt.old, tt.new, 1)
			require.NotEqual(t, validMLP, doc, "the case must change the document")
			_, err := ParseConfig(strings.NewReader(doc))
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrConfig))
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	_, err := ParseConfig(strings.NewReader(""))
	assert.ErrorContains(t, err, "the file is empty")
}

// tp_failover is read from model.yaml (off unless written).
func TestTPFailoverKey(t *testing.T) {
	cfg, err := ParseConfig(strings.NewReader(validMLP))
	require.NoError(t, err)
	assert.False(t, cfg.TPFailover)
	cfg, err = ParseConfig(strings.NewReader(strings.Replace(validMLP, "architecture: mlp", "architecture: mlp\ntp_failover: true", 1)))
	require.NoError(t, err)
	assert.True(t, cfg.TPFailover)
	_, err = ParseConfig(strings.NewReader(strings.Replace(validMLP, "architecture: mlp", "architecture: mlp\ntp_failover: sometimes", 1)))
	assert.Error(t, err)
}

func TestValidName(t *testing.T) {
	for _, ok := range []string{"digits", "bge-small_v1.5", "A1"} {
		assert.True(t, ValidName(ok), ok)
	}
	for _, bad := range []string{"", "..", ".hidden", "a/b", "a..b", "a b", "-x", strings.Repeat("a", 129)} {
		assert.False(t, ValidName(bad), bad)
	}
}

func writeModel(t *testing.T, root, name, yaml string, tensors []*Tensor) string {
	t.Helper()
	dir := filepath.Join(root, name)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, ConfigFile), []byte(yaml), 0o644))
	f, err := os.Create(filepath.Join(dir, WeightsFile))
	require.NoError(t, err)
	require.NoError(t, WriteSafetensors(f, tensors, nil))
	require.NoError(t, f.Close())
	return dir
}

func mlpTensors() []*Tensor {
	return []*Tensor{
		{Name: "layers.0.weight", Shape: []int{8, 4}, Data: make([]float32, 32)},
		{Name: "layers.0.bias", Shape: []int{8}, Data: make([]float32, 8)},
		{Name: "layers.1.weight", Shape: []int{3, 8}, Data: make([]float32, 24)},
		{Name: "layers.1.bias", Shape: []int{3}, Data: make([]float32, 3)},
	}
}

func TestListAndLoad(t *testing.T) {
	root := t.TempDir()
	writeModel(t, root, "b-model", validMLP, mlpTensors())
	writeModel(t, root, "a-model", validMLP, mlpTensors())
	require.NoError(t, os.MkdirAll(filepath.Join(root, "not-a-model"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "README"), []byte("x"), 0o644))

	names, err := List(root)
	require.NoError(t, err)
	assert.Equal(t, []string{"a-model", "b-model"}, names)
	m, err := Load(filepath.Join(root, "a-model"))
	require.NoError(t, err)
	assert.Equal(t, "a-model", m.Name)
	require.NotNil(t, m.MLP)
	assert.Len(t, m.MLP.Layers, 2)
	assert.Equal(t, 8, m.MLP.Layers[1].In)
	assert.Equal(t, []float32{0, 0, 0}, m.MLP.Layers[1].Bias)

	names, err = List(t.TempDir())
	require.NoError(t, err)
	assert.Empty(t, names)
}

func TestLoadErrorsNameTheProblem(t *testing.T) {
	root := t.TempDir()
	dir := writeModel(t, root, "m", validMLP, mlpTensors()[:3])
	_, err := Load(dir)
	assert.ErrorContains(t, err, `m/weights.safetensors: tensor "layers.1.bias" is missing (want shape [3])`)
	assert.NotContains(t, err.Error(), root, "errors name files by their path in the repository")

	bad := mlpTensors()
	bad[2].Shape, bad[2].Data = []int{8, 3}, make([]float32, 24)
	dir = writeModel(t, root, "m2", validMLP, bad)
	_, err = Load(dir)
	assert.ErrorContains(t, err, `tensor "layers.1.weight" has shape [8 3], want [3 8]`)

	dir = writeModel(t, root, "m3", "name: other\n"+validMLP, mlpTensors())
	_, err = Load(dir)
	assert.ErrorContains(t, err, `name: "other" differs from the directory name "m3"`)

	dir = writeModel(t, root, "m4", "architecture: [\n", mlpTensors())
	_, err = Load(dir)
	assert.ErrorContains(t, err, "m4/model.yaml")

	_, err = Open(root, "missing")
	assert.ErrorIs(t, err, ErrNoModel)
	assert.ErrorContains(t, err, "the repository has no missing/model.yaml")
}

func TestShippedDigitsModelLoads(t *testing.T) {
	m, err := Load(filepath.Join("../model_repository", "digits"))
	require.NoError(t, err)
	assert.Equal(t, "digits", m.Name)
	assert.Equal(t, []int{64, 128, 10}, m.Config.MLP.Sizes)
	assert.Equal(t, "softmax", m.MLP.OutputActivation)
}

// FuzzParseConfig checks that no model.yaml panics the loader, and that
// whatever it accepts is a usable signature.
func FuzzParseConfig(f *testing.F) {
	f.Add(validMLP)
	f.Add("architecture: mlp\nmlp: {sizes: [1, 1]}\ninputs: [{name: a, datatype: FP32, shape: [-1, 1]}]\noutputs: [{name: b, datatype: FP32, shape: [-1, 1]}]\nbuckets: {batch: [1]}")
	f.Add("inputs: [{shape: []}]")
	f.Fuzz(func(t *testing.T, doc string) {
		c, err := ParseConfig(strings.NewReader(doc))
		if err != nil {
			return
		}
		for _, s := range append(c.Inputs, c.Outputs...) {
			if s.Shape[0] != -1 || s.RowElements(1) <= 0 {
				t.Fatalf("accepted a bad signature: %+v", s)
			}
		}
	})
}

const validEncoder = `
architecture: encoder
encoder: {vocab_size: 10, hidden: 8, layers: 1, heads: 2, intermediate: 16, max_position: 64}
inputs:
  - {name: text, datatype: BYTES, shape: [-1]}
outputs:
  - {name: embedding, datatype: FP32, shape: [-1, 8]}
buckets: {batch: [1, 4], seq: [32, 64]}
`

func TestEncoderConfig(t *testing.T) {
	c, err := ParseConfig(strings.NewReader(validEncoder))
	require.NoError(t, err)
	assert.Equal(t, "cls", c.Encoder.Pooling)
	assert.True(t, *c.Encoder.Lowercase)
	assert.Equal(t, 2, c.Encoder.TypeVocabSize)
	assert.True(t, c.TextInput())
	assert.Equal(t, 32*64, c.TextLimit(), "by default 32 bytes per token of the largest seq bucket")
	assert.Equal(t, []string{"input_ids", "attention_mask", "token_type_ids"}, []string{c.StepInputs()[0].Name, c.StepInputs()[1].Name, c.StepInputs()[2].Name})
	assert.Equal(t, 8*48, c.StepInputs()[0].RowBytes(48))

	for _, tc := range []struct{ old, new, want string }{
		{"seq: [32, 64]", "seq: [32, 48]", "buckets.seq: 48 is not a multiple of 32: the NPU's fused attention kernel"},
		{"seq: [32, 64]", "seq: [64, 32]", "buckets.seq: [64 32] must be strictly increasing"},
		{", seq: [32, 64]", "", "buckets.seq: is required for an encoder"},
		{"seq: [32, 64]", "seq: [32, 128]", "buckets.seq: 128 exceeds encoder.max_position 64"},
		{"heads: 2", "heads: 3", "encoder.heads: 3 heads do not divide hidden 8"},
		{"max_position: 64}", "max_position: 64, max_text_bytes: -1}", "encoder.max_text_bytes: -1 must not be negative; 0 takes the default"},
		{"layers: 1", "layers: 0", "encoder.layers: 0 must be positive"},
		{"max_position: 64}", "max_position: 64, pooling: max}", `encoder.pooling: "max" is not supported; want cls or mean`},
		{"shape: [-1, 8]", "shape: [-1, 9]", "outputs: an encoder with hidden 8 gives exactly one FP32 output of shape [-1, 8]"},
		{"{name: text, datatype: BYTES, shape: [-1]}", "{name: input_ids, datatype: INT64, shape: [-1, -1]}", "inputs: an encoder takes input_ids and attention_mask"},
		{"{name: text, datatype: BYTES, shape: [-1]}", "{name: x, datatype: FP32, shape: [-1, -1, -1]}", "only the second dimension may be -1"},
	} {
		doc := strings.Replace(validEncoder, tc.old, tc.new, 1)
		require.NotEqual(t, validEncoder, doc)
		_, err := ParseConfig(strings.NewReader(doc))
		assert.ErrorContains(t, err, tc.want)
	}
	c, err = ParseConfig(strings.NewReader(strings.Replace(validEncoder, "max_position: 64}", "max_position: 64, max_text_bytes: 100}", 1)))
	require.NoError(t, err)
	assert.Equal(t, 100, c.TextLimit())
	ids := strings.Replace(validEncoder, "  - {name: text, datatype: BYTES, shape: [-1]}", "  - {name: input_ids, datatype: INT64, shape: [-1, -1]}\n  - {name: attention_mask, datatype: INT64, shape: [-1, -1]}", 1)
	c, err = ParseConfig(strings.NewReader(ids))
	require.NoError(t, err)
	assert.False(t, c.TextInput())
	_, err = ParseConfig(strings.NewReader(validMLP + "  seq: [32]\n"))
	assert.ErrorContains(t, err, "an mlp has no sequence dimension")
}

func TestEncoderWeightsNameTheMissingTensor(t *testing.T) {
	c, err := ParseConfig(strings.NewReader(validEncoder))
	require.NoError(t, err)
	w := &Weights{Path: "w.safetensors", Tensors: map[string]*Tensor{
		"bert.embeddings.word_embeddings.weight": {Shape: []int{10, 8}, Data: make([]float32, 80)},
	}}
	_, err = NewEncoder(c.Encoder, w)
	assert.ErrorContains(t, err, `tensor "bert.embeddings.position_embeddings.weight" is missing (want shape [64 8])`)
	w.Tensors["bert.embeddings.position_embeddings.weight"] = &Tensor{Shape: []int{32, 8}, Data: make([]float32, 256)}
	_, err = NewEncoder(c.Encoder, w)
	assert.ErrorContains(t, err, `tensor "bert.embeddings.position_embeddings.weight" has shape [32 8], want [64 8]`)
}

// An input's format is an image layout, read with or without Triton's
// FORMAT_ prefix; anything else, a format on an output, or one on an
// input that is not an image batch is refused, naming the key.
func TestInputFormat(t *testing.T) {
	image := func(format, shape string) string {
		return "architecture: torch\ntorch: {module: model.py}\nengine: torch\n" +
			"inputs:\n  - {name: image, datatype: FP32, shape: " + shape + ", format: " + format + "}\n" +
			"outputs:\n  - {name: y, datatype: FP32, shape: [-1, 10]}\nbuckets: {batch: [1]}\n"
	}
	for format, want := range map[string]string{"NCHW": "NCHW", "FORMAT_NHWC": "NHWC", "nchw": "NCHW", "FORMAT_NONE": "NONE"} {
		c, err := ParseConfig(strings.NewReader(image(format, "[-1, 3, 8, 8]")))
		require.NoError(t, err, format)
		assert.Equal(t, want, c.Inputs[0].Format)
	}
	for _, tc := range []struct{ doc, want string }{
		{image("CHW", "[-1, 3, 8, 8]"), `inputs[0].format: "CHW"; want NCHW, NHWC or NONE`},
		{image("NCHW", "[-1, 64]"), "inputs[0].format: NCHW needs a shape of 4 dimensions"},
		{strings.Replace(image("NONE", "[-1, 3, 8, 8]"), "shape: [-1, 10]}", "shape: [-1, 10], format: NCHW}", 1), "outputs[0].format: a format describes an input image's layout"},
	} {
		_, err := ParseConfig(strings.NewReader(tc.doc))
		assert.ErrorContains(t, err, tc.want)
	}
}
