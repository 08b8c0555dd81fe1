package models

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/internal/clip"
	"github.com/stepserve/stepserve/internal/suggest"
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

// The entries of a *yaml.TypeError: "line N:" and what went wrong, which
// quotes the file.
var (
	yamlCannot = regexp.MustCompile(`^line (\d+): cannot unmarshal (!!\w+)( .*)? into (.+)$`)
	// yamlWord is a value short and plain enough to quote: a typo such as
	// "soon", not a line of some other file.
	yamlWord    = regexp.MustCompile("^ `([A-Za-z0-9_.+-]{1,10})`$")
	yamlUnknown = regexp.MustCompile(`^line (\d+): field (.*) not found in type (.*)$`)
	yamlTwice   = regexp.MustCompile(`^line (\d+): (?:field .* already set in type .*|mapping key .* already defined at line \d+)$`)
)

// yamlKeys are the keys each struct type of model.yaml takes, by the type's
// name as the YAML decoder names it (models.Config, models.Buckets, ...):
// the names an unknown key may be a misspelling of.
var yamlKeys = sync.OnceValue(func() map[string][]string {
	keys := map[string][]string{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map || t.Kind() == reflect.Array {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		if _, seen := keys[t.String()]; seen {
			return
		}
		keys[t.String()] = nil
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" || !f.IsExported() {
				continue
			}
			keys[t.String()] = append(keys[t.String()], name)
			walk(f.Type)
		}
	}
	walk(reflect.TypeFor[Config]())
	return keys
})

// yamlError rewrites a YAML decoding error for a reader of model.yaml:
// what was found and what is wanted, by line, quoting at most a key name
// (clipped) or a short plain word, so that a file that is not a model.yaml
// is not echoed back.
func yamlError(err error) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		// A syntax error: "yaml: line 3: did not find expected key". The
		// few that quote the file (an anchor's name) lose the quote.
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		if i := strings.IndexAny(msg, "'\"`"); i >= 0 {
			msg = strings.TrimSpace(msg[:i])
		}
		return msg
	}
	const most = 5
	out := make([]string, 0, most+1)
	for _, e := range te.Errors[:min(len(te.Errors), most)] {
		if m := yamlCannot.FindStringSubmatch(e); m != nil {
			found := yamlKind(m[2])
			if w := yamlWord.FindStringSubmatch(m[3]); w != nil {
				found += fmt.Sprintf(" (%q)", w[1])
			}
			out = append(out, fmt.Sprintf("line %s: want %s, found %s", m[1], yamlWant(m[4]), found))
		} else if m := yamlUnknown.FindStringSubmatch(e); m != nil {
			msg := fmt.Sprintf("line %s: unknown key %q", m[1], clip.Clip(m[2], maxNameInError))
			if near := suggest.Nearest(m[2], yamlKeys()[m[3]]); near != "" {
				msg += fmt.Sprintf("; did you mean %q?", near)
			}
			out = append(out, msg)
		} else if m := yamlTwice.FindStringSubmatch(e); m != nil {
			out = append(out, fmt.Sprintf("line %s: a key appears twice", m[1]))
		} else if i := strings.Index(e, ":"); i >= 0 {
			out = append(out, e[:i]+": malformed value")
		}
	}
	if len(te.Errors) > most {
		out = append(out, fmt.Sprintf("and %d more", len(te.Errors)-most))
	}
	if len(out) == 0 {
		return "malformed YAML"
	}
	return strings.Join(out, "; ")
}

// yamlKind names a YAML tag as a reader says it.
func yamlKind(tag string) string {
	switch tag {
	case "!!str":
		return "a string"
	case "!!int":
		return "an integer"
	case "!!float":
		return "a number"
	case "!!bool":
		return "a boolean"
	case "!!seq":
		return "a list"
	case "!!map":
		return "a mapping"
	case "!!null":
		return "nothing"
	default:
		return "a " + strings.TrimPrefix(tag, "!!")
	}
}

// yamlWant names the Go type a value decodes into as model.yaml's reader
// says it.
func yamlWant(goType string) string {
	switch goType {
	case "models.Config":
		return "a mapping of model.yaml's keys"
	case "int", "*int":
		return "an integer"
	case "float64":
		return "a number"
	case "bool":
		return "true or false"
	case "string", "models.Datatype":
		return "a string"
	case "time.Duration", "*time.Duration":
		return "a duration such as 5ms"
	case "[]int":
		return "a list of integers"
	case "[]models.TensorSpec":
		return "a list of tensors ({name, datatype, shape})"
	}
	if strings.HasPrefix(goType, "*models.") || strings.HasPrefix(goType, "models.") {
		return "a mapping"
	}
	return strings.TrimPrefix(goType, "*")
}

func (c *Config) validate() error {
	bad := func(key string, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrConfig, key, fmt.Sprintf(format, args...))
	}
	if c.Version == "" {
		c.Version = "1"
	}
	if !ValidName(c.Version) {
		return bad("version", "%q is not a valid version; use letters, digits, '_', '.' or '-'", clip.Clip(c.Version, maxNameInError))
	}
	if c.Name != "" && !ValidName(c.Name) {
		return bad("name", "%q is not a valid model name; use letters, digits, '_', '.' or '-'", clip.Clip(c.Name, maxNameInError))
	}
	if c.Engine != "" {
		if err := oneOf(bad, "engine", &c.Engine, "", "cpu", "torch", "rbln"); err != nil {
			return err
		}
	}
	if err := oneOf(bad, "device_dtype", &c.DeviceDtype, "float16", "float16", "bfloat16"); err != nil {
		return err
	}
	if err := oneOf(bad, "float16_overflow", &c.Float16Overflow, "refuse", "refuse", "clamp"); err != nil {
		return err
	}
	if err := oneOf(bad, "warmup", &c.Warmup, "eager", "eager", "lazy"); err != nil {
		return err
	}
	if err := c.Instances.validate(bad); err != nil {
		return err
	}

	if err := validateSpecs("inputs", c.Inputs); err != nil {
		return err
	}
	if err := validateSpecs("outputs", c.Outputs); err != nil {
		return err
	}

	if c.Architecture == "decoder" {
		// Its buckets default from its generation keys.
		if err := c.validateDecoder(bad); err != nil {
			return err
		}
	}
	if n := len(c.Buckets.Batch) * (max(len(c.Buckets.Seq), 1) + len(c.Buckets.Context)); n > maxBuckets {
		if len(c.Buckets.Context) > 0 {
			return bad("buckets", "%d batch sizes, %d sequence lengths and %d context partitions make %d buckets, above the limit of %d",
				len(c.Buckets.Batch), len(c.Buckets.Seq), len(c.Buckets.Context), n, maxBuckets)
		}
		return bad("buckets", "%d batch sizes and %d sequence lengths make %d buckets, above the limit of %d",
			len(c.Buckets.Batch), len(c.Buckets.Seq), n, maxBuckets)
	}
	if err := bucketing.ValidateSeq(c.Buckets.Seq); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err := bucketing.ValidateBatch(c.Buckets.Batch); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}

	if c.Generation != nil && c.Architecture != "decoder" {
		return bad("generation", "is for decoder language models; remove it")
	}
	if len(c.Buckets.Context) > 0 && c.Architecture != "decoder" {
		return bad("buckets.context", "is for decoder language models' decode steps; remove it")
	}
	switch c.Architecture {
	case "mlp":
		if len(c.Buckets.Seq) > 0 {
			return bad("buckets.seq", "an mlp has no sequence dimension; remove buckets.seq")
		}
		return c.validateMLP(bad)
	case "encoder":
		return c.validateEncoder(bad)
	case "torch":
		return c.validateTorch(bad)
	case "decoder":
		return nil // checked above
	case "":
		return bad("architecture", "is required; want mlp, encoder or torch (or a Hugging Face folder: encoder or decoder)")
	default:
		return bad("architecture", "%q is not supported; want mlp, encoder or torch (or a Hugging Face folder: encoder or decoder)", clip.Clip(c.Architecture, maxNameInError))
	}
}

// oneOf checks an enumerated key: empty takes def, anything else must be
// one of allowed.
func oneOf(bad func(string, string, ...any) error, key string, v *string, def string, allowed ...string) error {
	if *v == "" {
		*v = def
	}
	if !slices.Contains(allowed, *v) {
		return bad(key, "%q is not supported; want %s", clip.Clip(*v, maxNameInError), strings.Join(allowed, " or "))
	}
	return nil
}

// clipInts is a list as an error shows it: the first few values of a long
// one.
func clipInts(v []int) string {
	if len(v) <= 8 {
		return fmt.Sprint(v)
	}
	return strings.TrimSuffix(fmt.Sprint(v[:8]), "]") + fmt.Sprintf(" ... (%d values)]", len(v))
}

func validateSpecs(key string, specs []TensorSpec) error {
	if len(specs) == 0 {
		return fmt.Errorf("%w: %s: at least one is required", ErrConfig, key)
	}
	seen := make(map[string]bool, len(specs))
	for i, s := range specs {
		at := fmt.Sprintf("%s[%d]", key, i)
		if !ValidName(s.Name) {
			return fmt.Errorf("%w: %s.name: %q is not a valid tensor name", ErrConfig, at, clip.Clip(s.Name, maxNameInError))
		}
		if seen[s.Name] {
			return fmt.Errorf("%w: %s.name: %q appears twice", ErrConfig, at, s.Name)
		}
		seen[s.Name] = true
		if !s.Datatype.Valid() {
			_, err := ParseDatatype(clip.Clip(string(s.Datatype), maxNameInError))
			return fmt.Errorf("%w: %s.datatype: %v", ErrConfig, at, err)
		}
		if len(s.Shape) < 1 || s.Shape[0] != -1 {
			return fmt.Errorf("%w: %s.shape: %v must start with -1, the batch dimension", ErrConfig, at, clipInts(s.Shape))
		}
		for i, d := range s.Shape[1:] {
			if d <= 0 && !(d == -1 && i == 0) {
				return fmt.Errorf("%w: %s.shape: %v: after the batch, only the second dimension may be -1 (the sequence); the others must be positive", ErrConfig, at, clipInts(s.Shape))
			}
		}
		if s.Format != "" {
			f := strings.TrimPrefix(strings.ToUpper(s.Format), "FORMAT_")
			switch {
			case key != "inputs":
				return fmt.Errorf("%w: %s.format: a format describes an input image's layout; remove it from the output", ErrConfig, at)
			case f != FormatNone && f != FormatNCHW && f != FormatNHWC:
				return fmt.Errorf("%w: %s.format: %q; want NCHW, NHWC or NONE", ErrConfig, at, clip.Clip(s.Format, maxNameInError))
			case f != FormatNone && len(s.Shape) != 4:
				return fmt.Errorf("%w: %s.format: %s needs a shape of 4 dimensions (batch and 3 more), not %v", ErrConfig, at, f, clipInts(s.Shape))
			}
			specs[i].Format = f
		}
		if s.Labels != "" {
			if key == "inputs" {
				return fmt.Errorf("%w: %s.labels: labels name an output's classes; remove it from the input", ErrConfig, at)
			}
			if err := validateLabels(at, s); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *Config) validateEncoder(bad func(string, string, ...any) error) error {
	e := c.Encoder
	if e == nil {
		return bad("encoder", "is required for architecture encoder; give vocab_size, hidden, layers, heads, intermediate")
	}
	if err := oneOf(bad, "encoder.family", &e.Family, FamilyBERT, encoderFamilyNames...); err != nil {
		return err
	}
	fam := encoderFamilies[e.Family]
	if e.PadTokenID == nil {
		p := fam.pad
		e.PadTokenID = &p
	}
	if e.MaxPosition == 0 {
		e.MaxPosition = 512 + fam.positionOffset(*e.PadTokenID)
	}
	if e.TypeVocabSize == 0 {
		e.TypeVocabSize = fam.types
	}
	if e.LayerNormEps == 0 {
		e.LayerNormEps = fam.eps
	}
	if e.Lowercase == nil {
		t := true
		e.Lowercase = &t
	}
	for _, k := range []struct {
		key   string
		v, hi int
	}{
		{"vocab_size", e.VocabSize, maxVocab}, {"hidden", e.Hidden, maxWidth}, {"layers", e.Layers, maxLayers},
		{"heads", e.Heads, maxWidth}, {"intermediate", e.Intermediate, maxWidth},
		{"max_position", e.MaxPosition, maxPosition}, {"type_vocab_size", e.TypeVocabSize, maxTypeVocab},
	} {
		if k.v <= 0 {
			return bad("encoder."+k.key, "%d must be positive", k.v)
		}
		if k.v > k.hi {
			return bad("encoder."+k.key, "%d is above the limit of %d", k.v, k.hi)
		}
	}
	if e.Hidden%e.Heads != 0 {
		return bad("encoder.heads", "%d heads do not divide hidden %d", e.Heads, e.Hidden)
	}
	if e.MaxTextBytes < 0 {
		return bad("encoder.max_text_bytes", "%d must not be negative; 0 takes the default", e.MaxTextBytes)
	}
	if e.LayerNormEps < 0 {
		return bad("encoder.layer_norm_eps", "%v must be positive", e.LayerNormEps)
	}
	if p := *e.PadTokenID; p < 0 || p >= e.VocabSize {
		return bad("encoder.pad_token_id", "%d is outside the vocabulary; want 0..%d", p, e.VocabSize-1)
	}
	if err := oneOf(bad, "encoder.hidden_act", &e.HiddenAct, "gelu", HiddenActs...); err != nil {
		return err
	}
	if err := oneOf(bad, "encoder.head", &e.Head, HeadNone, HeadNone, HeadClassification); err != nil {
		return err
	}
	if e.Head == HeadClassification {
		// The head reads the first token, as every family's
		// *ForSequenceClassification does.
		if e.Pooling != "" && e.Pooling != "cls" {
			return bad("encoder.pooling", "%q: a classification head reads the first token; remove encoder.pooling or set cls", clip.Clip(e.Pooling, maxNameInError))
		}
		if e.Normalize {
			return bad("encoder.normalize", "a classification head's logits are not normalized; remove encoder.normalize")
		}
		if e.NumLabels <= 0 || e.NumLabels > maxWidth {
			return bad("encoder.num_labels", "%d must be in 1..%d for a classification head", e.NumLabels, maxWidth)
		}
	} else if e.NumLabels != 0 {
		return bad("encoder.num_labels", "%d needs encoder.head: classification", e.NumLabels)
	}
	if err := oneOf(bad, "encoder.pooling", &e.Pooling, "cls", "cls", "mean", "last"); err != nil {
		return err
	}
	if len(c.Buckets.Seq) == 0 {
		return bad("buckets.seq", "is required for an encoder; list the sequence lengths to compile, e.g. [32, 64, 128]")
	}
	if last, most := c.Buckets.Seq[len(c.Buckets.Seq)-1], e.MaxSeq(); last > most {
		if off := e.PositionOffset(); off > 0 {
			return bad("buckets.seq", "%d exceeds %d, encoder.max_position %d less the %s position offset %d (pad_token_id + 1)", last, most, e.MaxPosition, e.Family, off)
		}
		return bad("buckets.seq", "%d exceeds encoder.max_position %d", last, e.MaxPosition)
	}
	ids := func(i int, name string) bool {
		return c.Inputs[i].Name == name && c.Inputs[i].Datatype == INT64 && slices.Equal(c.Inputs[i].Shape, []int{-1, -1})
	}
	text := func(i int, name string) bool {
		return c.Inputs[i].Name == name && c.Inputs[i].Datatype == BYTES && slices.Equal(c.Inputs[i].Shape, []int{-1})
	}
	switch {
	case len(c.Inputs) == 1 && text(0, TextInput):
	case len(c.Inputs) == 2 && text(0, TextInput) && text(1, TextPairInput):
		// Pairs: a cross-encoder's (query, passage), NLI's (premise,
		// hypothesis); an embedder may embed (title, body) pairs too.
	case len(c.Inputs) >= 2 && len(c.Inputs) <= 3 && ids(0, "input_ids") && ids(1, "attention_mask") && (len(c.Inputs) == 2 || ids(2, "token_type_ids")):
	default:
		return bad("inputs", "an encoder takes input_ids and attention_mask (and optionally token_type_ids), INT64 [-1, -1], in that order; or text, BYTES [-1] (and optionally text_pair, BYTES [-1]), with a tokenizer.json or vocab.txt")
	}
	if width, what := e.OutputWidth(), "hidden"; len(c.Outputs) != 1 || c.Outputs[0].Datatype != FP32 || !slices.Equal(c.Outputs[0].Shape, []int{-1, width}) {
		if e.Head == HeadClassification {
			what = "encoder.num_labels"
		}
		return bad("outputs", "an encoder with %s %d gives exactly one FP32 output of shape [-1, %d]", what, width, width)
	}
	return nil
}

func (c *Config) validateMLP(bad func(string, string, ...any) error) error {
	m := c.MLP
	if m == nil {
		return bad("mlp", "is required for architecture mlp; give at least mlp.sizes")
	}
	if len(m.Sizes) < 2 {
		return bad("mlp.sizes", "%v needs at least an input and an output width", m.Sizes)
	}
	if len(m.Sizes) > maxLayers+1 {
		return bad("mlp.sizes", "%d widths are %d layers, above the limit of %d", len(m.Sizes), len(m.Sizes)-1, maxLayers)
	}
	for _, s := range m.Sizes {
		if s <= 0 || s > maxWidth {
			return bad("mlp.sizes", "%v: widths must be in 1..%d", clipInts(m.Sizes), maxWidth)
		}
	}
	if err := oneOf(bad, "mlp.activation", &m.Activation, "relu", "relu", "gelu"); err != nil {
		return err
	}
	if err := oneOf(bad, "mlp.output_activation", &m.OutputActivation, "none", "none", "softmax"); err != nil {
		return err
	}
	in, out := m.Sizes[0], m.Sizes[len(m.Sizes)-1]
	if len(c.Inputs) != 1 || c.Inputs[0].Datatype != FP32 || !slices.Equal(c.Inputs[0].Shape, []int{-1, in}) {
		return bad("inputs", "an mlp with mlp.sizes %v takes exactly one FP32 input of shape [-1, %d]", clipInts(m.Sizes), in)
	}
	if len(c.Outputs) != 1 || c.Outputs[0].Datatype != FP32 || !slices.Equal(c.Outputs[0].Shape, []int{-1, out}) {
		return bad("outputs", "an mlp with mlp.sizes %v gives exactly one FP32 output of shape [-1, %d]", clipInts(m.Sizes), out)
	}
	return nil
}

// Validate checks the configuration as model.yaml is checked (defaults
// filled in), for one changed after it was read.
func (c *Config) Validate() error { return c.validate() }
