package models

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Input is one request input as a protocol decoded it, before the model
// prepares it for a step.
type Input struct {
	// Shape is the shape the request declared; the first dimension is the
	// batch. Nil for an optional input the request left out.
	Shape []int64
	// Data holds the elements packed little-endian, for every datatype but
	// BYTES.
	Data []byte
	// Strings holds the elements of a BYTES input.
	Strings []string
}

// ShapeElements is the element count of shape, and false when a
// dimension is negative or the count overflows an int64.
func ShapeElements(shape []int64) (int64, bool) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 || (d > 0 && n > math.MaxInt64/d) {
			return 0, false
		}
		n *= d
	}
	return n, true
}

// ErrInput is matched by every error [Model.PrepareInputs] returns for a
// request's values (as opposed to the caller's mistakes): a protocol answers
// it as a bad request.
var ErrInput = errors.New("models: bad input")

// InputError is a request input the model refuses. Its message names the
// input and says what is accepted; errors.Is(err, ErrInput) holds.
type InputError struct {
	// Input is the name of the input at fault; empty when inputs disagree
	// with each other.
	Input string
	Err   error
}

func (e *InputError) Error() string {
	if e.Input == "" {
		return e.Err.Error()
	}
	return fmt.Sprintf("input %q: %v", e.Input, e.Err)
}

func (e *InputError) Unwrap() error { return e.Err }

// Is makes every InputError match [ErrInput].
func (e *InputError) Is(target error) bool { return target == ErrInput }

// The encoder's step inputs, by their index in [Config.StepInputs] and in
// the staging buffer. Every engine reads the token tensors by these.
const (
	EncoderInputIDs = iota
	EncoderAttentionMask
	EncoderTokenTypeIDs
)

// encoderStepInputs are the tensors an encoder step takes, whatever the
// model's API inputs are: text is tokenized into them. This is the one
// statement of their order; the torch worker's encoder step body
// (engine/rbln/worker/stepserve_worker/nets.py) follows it.
var encoderStepInputs = []TensorSpec{
	EncoderInputIDs:      {Name: "input_ids", Datatype: INT64, Shape: []int{-1, -1}},
	EncoderAttentionMask: {Name: "attention_mask", Datatype: INT64, Shape: []int{-1, -1}},
	EncoderTokenTypeIDs:  {Name: "token_type_ids", Datatype: INT64, Shape: []int{-1, -1}},
}

// StepInputs are the tensors packed into a step's input staging, in order:
// the model's inputs as sent for an mlp, the token tensors for an encoder.
func (c *Config) StepInputs() []TensorSpec {
	if c.Architecture == "encoder" {
		return encoderStepInputs
	}
	return c.Inputs
}

// OptionalInput reports whether a request may leave the named input out:
// an encoder's token_type_ids, which default to zeros, and its text_pair
// (texts then go alone).
func (c *Config) OptionalInput(name string) bool {
	return c.Architecture == "encoder" && (name == encoderStepInputs[EncoderTokenTypeIDs].Name || name == TextPairInput)
}

// Platform names the runtime that serves the model, for the platform field
// of a protocol's model metadata: "stepserve_" and the architecture.
func (m *Model) Platform() string {
	if m.Config.Architecture == "torch" {
		return "pytorch_libtorch" // Triton's name for a PyTorch model
	}
	return "stepserve_" + m.Config.Architecture
}

// PrepareInputs turns a request's decoded inputs into the model's step
// inputs ([Config.StepInputs], in order), appended to dst, and returns them
// with the request's sequence length (0 for a model without one).
//
// in holds one Input per Config.Inputs, in order, each already checked
// against its spec (datatype, rank, fixed dimensions, element count, a
// batch dimension shared by all); an optional input left out is the zero
// Input. A model without a sequence takes the inputs' Data as they are,
// without a copy. An encoder tokenizes text, padded to the request's
// longest, or range-checks token tensors, so that no engine indexes past an
// embedding table; the step inputs may alias in's Data.
//
// An error about the request's values matches [ErrInput]; any other error
// is the caller's.
func (m *Model) PrepareInputs(dst [][]byte, in []Input) (inputs [][]byte, seq int, err error) {
	cfg := m.Config
	if len(in) != len(cfg.Inputs) {
		return dst, 0, fmt.Errorf("models: model %s takes %d inputs, got %d", m.Name, len(cfg.Inputs), len(in))
	}
	if cfg.Architecture != "encoder" {
		for _, t := range in {
			dst = append(dst, t.Data)
		}
		if len(cfg.Buckets.Seq) == 0 {
			return dst, 0, nil
		}
		seq, err := m.variableLength(in)
		return dst, seq, err
	}
	if cfg.Encoder == nil || len(cfg.Buckets.Seq) == 0 {
		return dst, 0, fmt.Errorf("models: model %s: an encoder needs its encoder config and seq buckets", m.Name)
	}
	if cfg.TextInput() {
		return m.prepareText(dst, in)
	}
	return m.prepareTokens(dst, in)
}

// variableLength is the length of the variable (second) dimension the
// inputs that have one share (architecture torch), checked against the
// largest bucket.
func (m *Model) variableLength(in []Input) (int, error) {
	seq, from := 0, ""
	for i, s := range m.Config.Inputs {
		if !s.HasSeq() || len(in[i].Shape) < 2 {
			continue
		}
		n := int(in[i].Shape[1])
		if from != "" && n != seq {
			return 0, &InputError{Err: fmt.Errorf("inputs %q and %q have variable dimensions of %d and %d; they must be equal", from, s.Name, seq, n)}
		}
		seq, from = n, s.Name
	}
	if max := m.Config.maxSeq(); seq > max {
		return 0, &InputError{Input: from, Err: fmt.Errorf("variable dimension %d is longer than the largest bucket, %d (buckets.seq)", seq, max)}
	}
	return seq, nil
}

// maxSeq is the longest sequence a step takes: the largest seq bucket.
func (c *Config) maxSeq() int { return c.Buckets.Seq[len(c.Buckets.Seq)-1] }

// textBytesPerToken sizes the default limit on a text element without
// truncation: 32 bytes a token is several times what natural text takes
// (English about 4 with its spaces, CJK 3), so text over the limit would
// not have fit the largest bucket anyway, and tokenizing what is under it
// costs microseconds.
const textBytesPerToken = 32

// TextLimit is the longest text element a text encoder accepts, in bytes,
// or 0 for no limit: encoder.max_text_bytes, or by default
// textBytesPerToken times the largest seq bucket. With encoder.truncate
// the default is no limit: truncating, the tokenizer stops at the largest
// bucket, so long text costs a scan of its bytes, as decoding the request
// body did.
func (c *Config) TextLimit() int {
	switch e := c.Encoder; {
	case e.MaxTextBytes > 0:
		return e.MaxTextBytes
	case e.Truncate:
		return 0
	default:
		return textBytesPerToken * c.maxSeq()
	}
}

// prepareText tokenizes every text (with its text_pair when the request
// sends one) and packs the token tensors, each row padded to the longest
// of the request with the tokenizer's pad id; token types come from the
// tokenizer (1 for a BERT pair's second text), else zero.
func (m *Model) prepareText(dst [][]byte, in []Input) ([][]byte, int, error) {
	cfg := m.Config
	if m.Tokenizer == nil {
		return dst, 0, fmt.Errorf("models: model %s takes text but has no %s or %s", m.Name, TokenizerFile, VocabFile)
	}
	texts := in[0].Strings
	var pairs []string
	if len(in) > 1 && in[1].Shape != nil {
		if pairs = in[1].Strings; len(pairs) != len(texts) {
			return dst, 0, &InputError{cfg.Inputs[1].Name, fmt.Errorf("%d elements for the %d of %q; send one per text", len(pairs), len(texts), cfg.Inputs[0].Name)}
		}
	}
	if limit := cfg.TextLimit(); limit > 0 {
		for k, list := range [][]string{texts, pairs} {
			for i, text := range list {
				if len(text) > limit {
					return dst, 0, &InputError{cfg.Inputs[k].Name, textTooLong(i, len(text), limit, cfg.Encoder)}
				}
			}
		}
	}
	// Every row's ids (and types, for pairs) in one slice, ends[i] the end
	// of row i's, sized for a token per byte (more than text takes, but
	// for the odd decomposed character): one allocation for a request of
	// many texts.
	maxSeq := cfg.maxSeq()
	size := 0
	for i, text := range texts {
		n := 3 + len(text)
		if pairs != nil {
			n += 2 + len(pairs[i])
		}
		size += min(maxSeq, n)
	}
	flat := make([]int64, 0, size)
	var flatTypes []int64
	if pairs != nil {
		flatTypes = make([]int64, 0, size)
	}
	ends := make([]int, len(texts))
	seq := 0
	for i, text := range texts {
		start := len(flat)
		var err error
		if pairs == nil {
			flat, err = m.Tokenizer.AppendEncode(flat, text, maxSeq, cfg.Encoder.Truncate)
		} else {
			flat, flatTypes, err = m.Tokenizer.AppendEncodePair(flat, flatTypes, text, pairs[i], maxSeq, cfg.Encoder.Truncate)
		}
		if err != nil {
			what := fmt.Sprintf("element %d", i)
			if pairs != nil {
				what = fmt.Sprintf("element %d with its %s", i, cfg.Inputs[1].Name)
			}
			return dst, 0, &InputError{cfg.Inputs[0].Name,
				fmt.Errorf("%s: %w (the largest seq bucket); shorten it, or set encoder.truncate: true", what, err)}
		}
		ends[i] = len(flat)
		seq = max(seq, len(flat)-start)
	}
	// The three tensors in one allocation.
	n := 8 * len(texts) * seq
	buf := make([]byte, 3*n)
	ids, mask, types := buf[:n:n], buf[n:2*n:2*n], buf[2*n:]
	pad := m.Tokenizer.PadID()
	start := 0
	for i, end := range ends {
		toks := flat[start:end]
		for j := range seq {
			at := 8 * (i*seq + j)
			id := pad
			if j < len(toks) {
				id = toks[j]
				binary.LittleEndian.PutUint64(mask[at:], 1)
				if flatTypes != nil {
					binary.LittleEndian.PutUint64(types[at:], uint64(flatTypes[start+j]))
				}
			}
			binary.LittleEndian.PutUint64(ids[at:], uint64(id))
		}
		start = end
	}
	return append(dst, ids, mask, types), seq, nil
}

// textTooLong says which text element is over the limit, and the ways
// out.
func textTooLong(i, n, limit int, e *EncoderConfig) error {
	msg := fmt.Sprintf("element %d is %d bytes, more than the %d of encoder.max_text_bytes", i, n, limit)
	if e.MaxTextBytes == 0 {
		msg += fmt.Sprintf(" (by default %d bytes per token of the largest seq bucket)", textBytesPerToken)
	}
	if e.Truncate {
		return errors.New(msg + "; shorten it or raise encoder.max_text_bytes")
	}
	return errors.New(msg + "; shorten it, raise encoder.max_text_bytes, or set encoder.truncate: true")
}

// prepareTokens checks token tensors sent as they are, and hands them on
// without a copy; token_type_ids left out are zeros.
func (m *Model) prepareTokens(dst [][]byte, in []Input) ([][]byte, int, error) {
	cfg := m.Config
	ids, mask := in[EncoderInputIDs], in[EncoderAttentionMask]
	if len(ids.Shape) != 2 {
		return dst, 0, fmt.Errorf("models: model %s: input %q has shape %v; want [rows, seq]", m.Name, cfg.Inputs[0].Name, ids.Shape)
	}
	seq := int(ids.Shape[1])
	if maxSeq := cfg.maxSeq(); seq > maxSeq {
		return dst, 0, &InputError{cfg.Inputs[0].Name, fmt.Errorf("sequence length %d exceeds the largest seq bucket %d", seq, maxSeq)}
	}
	for _, t := range in[1:] {
		if t.Shape != nil && (len(t.Shape) != 2 || t.Shape[1] != ids.Shape[1]) {
			return dst, 0, &InputError{Err: fmt.Errorf("input shapes %v and %v differ; %s, %s and %s must have the same shape",
				ids.Shape, t.Shape, encoderStepInputs[0].Name, encoderStepInputs[1].Name, encoderStepInputs[2].Name)}
		}
	}
	var types []byte
	if len(in) > EncoderTokenTypeIDs && in[EncoderTokenTypeIDs].Shape != nil {
		types = in[EncoderTokenTypeIDs].Data
	} else {
		types = make([]byte, len(ids.Data))
	}
	if want := 8 * int(ids.Shape[0]) * seq; len(ids.Data) != want || len(mask.Data) != want || len(types) != want {
		return dst, 0, fmt.Errorf("models: model %s: token tensors of %d, %d and %d bytes; shape %v needs %d",
			m.Name, len(ids.Data), len(mask.Data), len(types), ids.Shape, want)
	}
	if err := checkTokens(ids.Data, mask.Data, types, cfg.Encoder); err != nil {
		return dst, 0, err
	}
	return append(dst, ids.Data, mask.Data, types), seq, nil
}

// checkTokens keeps every id inside the embedding table it indexes. The
// tensors are packed little-endian INT64 of one length.
func checkTokens(ids, mask, types []byte, enc *EncoderConfig) error {
	name := func(i int) string { return encoderStepInputs[i].Name }
	for i := 0; i < len(ids)/8; i++ {
		id := int64(binary.LittleEndian.Uint64(ids[8*i:]))
		m := int64(binary.LittleEndian.Uint64(mask[8*i:]))
		tt := int64(binary.LittleEndian.Uint64(types[8*i:]))
		switch {
		case id < 0 || id >= int64(enc.VocabSize):
			return &InputError{name(EncoderInputIDs), fmt.Errorf("element %d is %d; token ids must be in 0..%d", i, id, enc.VocabSize-1)}
		case m != 0 && m != 1:
			return &InputError{name(EncoderAttentionMask), fmt.Errorf("element %d is %d; want 0 or 1", i, m)}
		case tt < 0 || tt >= int64(enc.TypeVocabSize):
			return &InputError{name(EncoderTokenTypeIDs), fmt.Errorf("element %d is %d; want 0..%d", i, tt, enc.TypeVocabSize-1)}
		}
	}
	return nil
}
