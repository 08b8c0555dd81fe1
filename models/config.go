package models

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Config is the schema of a model.yaml file.
type Config struct {
	// Name, when set, must equal the model's directory name.
	Name string `yaml:"name"`
	// Version is the one version the directory serves; "1" when unset.
	Version     string `yaml:"version"`
	Description string `yaml:"description"`
	// Architecture selects the layer stack the weights fill and how
	// requests are prepared for it: "mlp" or "encoder", built in; or
	// "torch", the user's own torch.nn.Module (Torch says where).
	Architecture string         `yaml:"architecture"`
	MLP          *MLPConfig     `yaml:"mlp"`
	Encoder      *EncoderConfig `yaml:"encoder"`
	Torch        *TorchConfig   `yaml:"torch"`
	// Decoder is a decoder language model's shape, read from its Hugging
	// Face folder's config.json (architecture decoder); Generation is
	// model.yaml's generation: keys over it.
	Decoder    *DecoderConfig     `yaml:"-"`
	Generation *GenerationOptions `yaml:"generation"`

	Inputs  []TensorSpec `yaml:"inputs"`
	Outputs []TensorSpec `yaml:"outputs"`
	Buckets Buckets      `yaml:"buckets"`

	// Batching is the model's dynamic batching policy; unset keys take the
	// server's defaults.
	Batching Batching `yaml:"batching"`
	// Warmup is eager (default: every bucket compiled and run twice before
	// the model is ready) or lazy (a bucket is compiled on first use).
	Warmup string `yaml:"warmup"`

	// Engine is "cpu", "torch" or "rbln"; empty means the server's default engine.
	Engine string `yaml:"engine"`
	// DeviceDtype is the dtype the rbln engine computes in: float16 or
	// bfloat16. The CPU engine computes in float32, except that bfloat16
	// there opts in to bfloat16 weights and products (float32 sums) on a
	// CPU with AVX512_BF16, and is refused on one without.
	DeviceDtype string `yaml:"device_dtype"`
	// Quantization is how the CPU engine keeps the weights of the
	// model's products: "none" (as device_dtype says), "q8_0" (int8
	// with a float16 scale per block of 32 along the inputs, GGUF's Q8_0,
	// quantized at load; activations are quantized the same way for each
	// product) or "q4_0" (4-bit values with a float16 scale per block of
	// 32, GGUF's Q4_0; activations in Q8_0 blocks). The torch and rbln
	// engines refuse both.
	Quantization string `yaml:"quantization"`
	// Float16Overflow is what a float input beyond float16's range
	// (finite values above 65504 in magnitude) gets where the model's
	// engine computes in float16: "refuse" (400 naming the input and the
	// range) or "clamp" (to ±65504). Staging would make it infinite.
	Float16Overflow string `yaml:"float16_overflow"`
	// TPFailover: on an RSD group (an rbln device of several NPUs), a
	// bucket whose program fails across the group is compiled again for
	// one NPU and runs on the group's first (torch-rbln's
	// TORCH_RBLN_USE_TP_FAILOVER, for this model alone). Other engines
	// have no groups and ignore it.
	TPFailover bool `yaml:"tp_failover"`
	// Instances places the model on its engine's devices: which, how many
	// replicas each, and how many must be healthy for it to be ready.
	Instances Instances `yaml:"instances"`
}

// TensorSpec is one input or output of the model's signature. A -1 in the
// shape is a variable dimension; the first is always the batch.
type TensorSpec struct {
	Name     string   `yaml:"name" json:"name"`
	Datatype Datatype `yaml:"datatype" json:"datatype"`
	Shape    []int    `yaml:"shape" json:"shape"`
	// Pad is the value a shorter request's variable dimension is padded
	// with up to its bucket (architecture torch inputs); 0 when unset.
	Pad *float64 `yaml:"pad" json:"-"`
	// Labels names an output's labels file in the model directory: one
	// class name per element of a row, for the classification extension
	// (labels.go). Outputs only; optional.
	Labels string `yaml:"labels" json:"-"`
	// Format is an image input's layout as Triton's model configuration
	// names it: NCHW or NHWC (FORMAT_NCHW, FORMAT_NHWC accepted), NONE
	// (the default) for any other input. Triton's image clients read it
	// to lay out what they send. Inputs only.
	Format string `yaml:"format" json:"-"`
}

// Input formats (Triton's ModelInput.Format, without its prefix).
const (
	FormatNone = "NONE"
	FormatNCHW = "NCHW"
	FormatNHWC = "NHWC"
)

// TorchConfig says where an architecture torch model's module comes from:
// Factory in the Python file Module of the model's directory, called with
// Config, returns the torch.nn.Module, whose state_dict Weights (a
// safetensors file in the directory, optional) then fills strictly.
type TorchConfig struct {
	Module  string         `yaml:"module"`
	Factory string         `yaml:"factory"` // default "build"
	Config  map[string]any `yaml:"config"`
	Weights string         `yaml:"weights"`
}

// RowElements is the number of elements in one batch row of sequences seq
// long: the product of every dimension after the first, with the sequence
// dimension (-1) taken as seq.
func (s TensorSpec) RowElements(seq int) int {
	n := 1
	for _, d := range s.Shape[1:] {
		if d < 0 {
			d = seq
		}
		n *= d
	}
	return n
}

// RowBytes is the packed size of one batch row of sequences seq long.
func (s TensorSpec) RowBytes(seq int) int { return s.RowElements(seq) * s.Datatype.Size() }

// Equal reports whether s and o describe the same tensor.
func (s TensorSpec) Equal(o TensorSpec) bool {
	return s.Name == o.Name && s.Datatype == o.Datatype && slices.Equal(s.Shape, o.Shape)
}

// HasSeq reports whether the tensor has a sequence dimension.
func (s TensorSpec) HasSeq() bool { return slices.Contains(s.Shape[1:], -1) }

// Buckets is the grid of shapes compiled at load.
type Buckets struct {
	Batch []int `yaml:"batch"`
	// Seq are the sequence lengths of sequence models, multiples of 32.
	Seq []int `yaml:"seq"`
	// Context are a decoder's context partitions: the key positions a
	// decode step reads, multiples of generation.block_size, ascending;
	// the last is max_model_len (rounded up to a block), added when
	// missing. A decode step runs in the least partition that holds its
	// longest sequence, so that its work grows with the context, not
	// with max_model_len (default 128, then 4 times more up to
	// max_model_len).
	Context []int `yaml:"context"`
}

// Batching is a model's batching policy, with Triton's names. Nil fields
// take the server-wide defaults. Only the syntax is checked here: the
// ranges are batching.Policy's rules, checked once the keys are merged over
// those defaults.
type Batching struct {
	MaxQueueDelay        *time.Duration `yaml:"max_queue_delay"`
	MaxQueueSize         *int           `yaml:"max_queue_size"`
	PriorityLevels       *int           `yaml:"priority_levels"`
	DefaultPriorityLevel *int           `yaml:"default_priority_level"`
	DefaultTimeout       *time.Duration `yaml:"default_timeout"`
	// MaxBatchTokens bounds a batch's padded tokens (batch bucket rows x
	// seq bucket), for models with seq buckets; 0 is no bound.
	MaxBatchTokens *int `yaml:"max_batch_tokens"`
}

// EncoderConfig holds the encoder architecture's hyper-parameters: a
// post-norm transformer encoder of one of the Hugging Face families (BERT,
// RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT), read from tensors with
// that family's names, and optionally a sequence classification head.
type EncoderConfig struct {
	// Family is the checkpoint's layout: bert (default), roberta,
	// xlm-roberta, camembert or distilbert (see encoderFamilies).
	Family        string  `yaml:"family"`
	VocabSize     int     `yaml:"vocab_size"`
	Hidden        int     `yaml:"hidden"`
	Layers        int     `yaml:"layers"`
	Heads         int     `yaml:"heads"`
	Intermediate  int     `yaml:"intermediate"`
	MaxPosition   int     `yaml:"max_position"`    // default 512 (514 for the RoBERTa family)
	TypeVocabSize int     `yaml:"type_vocab_size"` // default 2 (BERT), 1 (RoBERTa, DistilBERT)
	LayerNormEps  float64 `yaml:"layer_norm_eps"`  // default 1e-12 (BERT, DistilBERT), 1e-5 (RoBERTa)
	// HiddenAct is the feed-forward's activation: gelu (erf, default),
	// gelu_new or gelu_pytorch_tanh (the tanh approximation), or relu.
	HiddenAct string `yaml:"hidden_act"`
	// PadTokenID is the padding token's id: 0 by default (BERT,
	// DistilBERT), 1 for the RoBERTa family. The RoBERTa family numbers
	// the positions of real tokens from PadTokenID+1.
	PadTokenID *int `yaml:"pad_token_id"`
	// Head is none (default: the pooled embedding is the output) or
	// classification (the family's *ForSequenceClassification head on the
	// first token: logits, [-1, NumLabels]).
	Head      string `yaml:"head"`
	NumLabels int    `yaml:"num_labels"`
	// Pooling is cls (the first token's state), mean (over the attention
	// mask) or last (the last real token's state).
	Pooling string `yaml:"pooling"`
	// Normalize scales each embedding to unit L2 norm.
	Normalize bool `yaml:"normalize"`
	// Lowercase lowercases and strips accents before WordPiece (uncased
	// vocabularies); default true.
	Lowercase *bool `yaml:"lowercase"`
	// Truncate cuts text longer than the largest seq bucket instead of
	// rejecting it.
	Truncate bool `yaml:"truncate"`
	// MaxTextBytes is the longest text element accepted, in bytes: longer
	// text is refused before it is tokenized. 0 takes the default
	// ([Config.TextLimit]).
	MaxTextBytes int `yaml:"max_text_bytes"`
}

// TextInput reports whether the model takes a text BYTES input (and
// optionally a second, text_pair), which [Model.PrepareInputs] tokenizes.
func (c *Config) TextInput() bool {
	pair := len(c.Inputs) == 2 && c.Inputs[1].Name == TextPairInput && c.Inputs[1].Datatype == BYTES
	return (len(c.Inputs) == 1 || pair) && c.Inputs[0].Datatype == BYTES
}

// MLPConfig holds the mlp architecture's hyper-parameters. Layer i reads the
// tensors layers.{i}.weight [out, in] and layers.{i}.bias [out], as
// torch.nn.Linear stores them.
type MLPConfig struct {
	// Sizes are the widths from input to output: [64, 128, 10] is two
	// Linear layers, 64->128 and 128->10.
	Sizes []int `yaml:"sizes"`
	// Activation follows every layer but the last: relu (default) or gelu.
	Activation string `yaml:"activation"`
	// OutputActivation follows the last layer: none (default) or softmax.
	OutputActivation string `yaml:"output_activation"`
}

// ErrConfig is wrapped by every model.yaml validation error.
var ErrConfig = errors.New("models: invalid model.yaml")

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// ValidName reports whether s can name a model or a version: letters,
// digits, '_', '.' and '-', not starting with a punctuation mark, so that a
// name can never step outside the repository directory.
func ValidName(s string) bool { return nameRE.MatchString(s) && !strings.Contains(s, "..") }

// The upper bounds of model.yaml's sizes. The weights bound a model
// anyway (every tensor's shape is checked against these keys from the
// file's header, before anything grows with them); these name a typo
// before the weights are opened.
const (
	maxLayers    = 1024
	maxWidth     = 1 << 18 // hidden, intermediate, an mlp's widths
	maxVocab     = 1 << 22
	maxPosition  = 1 << 17
	maxTypeVocab = 1 << 16
	// maxBuckets bounds the grid: every bucket is a compiled program and
	// a pair of staging buffers.
	maxBuckets = 1024
)

// ParseConfig decodes model.yaml strictly (an unknown key is an error, so a
// misspelt key is never silently ignored), fills defaults and validates.
// It reads at most 1 MiB. Its errors quote no more of the file than a key
// name or a short value: a file that is not a model.yaml at all (a
// password file, a binary) is not echoed back.
func ParseConfig(r io.Reader) (*Config, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if len(b) > maxConfigBytes {
		return nil, fmt.Errorf("%w: larger than the %d-byte limit", ErrConfig, maxConfigBytes)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var c Config
	if err := dec.Decode(&c); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: the file is empty; want at least architecture, inputs, outputs and buckets", ErrConfig)
		}
		return nil, fmt.Errorf("%w: %s", ErrConfig, yamlError(err))
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// ReadConfig reads and validates a model.yaml file, a regular file of at
// most 1 MiB; errors name the file.
func ReadConfig(path string) (*Config, error) {
	root, err := os.OpenRoot(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	defer root.Close()
	b, err := readFile(root, filepath.Base(path), maxConfigBytes)
	if err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	c, err := ParseConfig(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}
