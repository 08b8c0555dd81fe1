// model.yaml's validation: defaults, ranges and the rules across keys.

package models

import (
	"fmt"
	"slices"
	"strings"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/internal/clip"
)

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
	if err := oneOf(bad, "quantization", &c.Quantization, "none", "none", "q8_0", "q4_0"); err != nil {
		return err
	}
	if c.Quantization != "none" && c.Engine != "" && c.Engine != "cpu" {
		return bad("quantization", "%s runs on the CPU engine; engine %s computes in device_dtype: remove quantization or set engine: cpu", c.Quantization, c.Engine)
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
