package models

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func packInt64s(v ...int64) []byte {
	b := make([]byte, 0, 8*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, uint64(x))
	}
	return b
}

func int64sOf(b []byte) []int64 {
	out := make([]int64, len(b)/8)
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out
}

// tokenModel is an encoder that takes token tensors: 100 ids, 2 types,
// sequences up to 64.
func tokenModel(t *testing.T, inputs int) *Model {
	names := []string{"input_ids", "attention_mask", "token_type_ids"}
	yaml := `
architecture: encoder
encoder: {vocab_size: 100, hidden: 8, layers: 1, heads: 2, intermediate: 16, max_position: 64}
outputs: [{name: embedding, datatype: FP32, shape: [-1, 8]}]
buckets: {batch: [1, 4], seq: [32, 64]}
inputs:
`
	for _, n := range names[:inputs] {
		yaml += "  - {name: " + n + ", datatype: INT64, shape: [-1, -1]}\n"
	}
	cfg, err := ParseConfig(strings.NewReader(yaml))
	require.NoError(t, err)
	return &Model{Name: "tokens", Config: cfg}
}

func TestStepInputsFollowTheIndices(t *testing.T) {
	c := &Config{Architecture: "encoder"}
	in := c.StepInputs()
	require.Len(t, in, 3)
	assert.Equal(t, "input_ids", in[EncoderInputIDs].Name)
	assert.Equal(t, "attention_mask", in[EncoderAttentionMask].Name)
	assert.Equal(t, "token_type_ids", in[EncoderTokenTypeIDs].Name)
	assert.True(t, c.OptionalInput("token_type_ids"))
	assert.False(t, c.OptionalInput("attention_mask"))

	mlp := &Config{Architecture: "mlp", Inputs: []TensorSpec{{Name: "x", Datatype: FP32, Shape: []int{-1, 4}}}}
	assert.Equal(t, mlp.Inputs, mlp.StepInputs())
	assert.Equal(t, "stepserve_mlp", (&Model{Config: mlp}).Platform())
}

func TestPrepareInputsPassesPlainTensorsThrough(t *testing.T) {
	m := &Model{Name: "plain", Config: &Config{Architecture: "mlp",
		Inputs: []TensorSpec{{Name: "x", Datatype: FP32, Shape: []int{-1, 1}}}}}
	data := []byte{1, 2, 3, 4}
	var buf [3][]byte
	got, seq, err := m.PrepareInputs(buf[:0], []Input{{Shape: []int64{1, 1}, Data: data}})
	require.NoError(t, err)
	assert.Zero(t, seq)
	require.Len(t, got, 1)
	assert.Same(t, &data[0], &got[0][0], "the decoded data is the step input, not a copy")
	assert.Same(t, &buf[0], &got[:1][0], "appended to dst")

	_, _, err = m.PrepareInputs(nil, nil)
	assert.ErrorContains(t, err, "model plain takes 1 inputs, got 0")
	assert.False(t, errors.Is(err, ErrInput), "the caller's mistake is not the request's")
}

func TestTextIsTokenized(t *testing.T) {
	m, err := Load("../model_repository/tiny-encoder")
	require.NoError(t, err)
	texts := []string{"The water is warm.", "hello"}
	in, seq, err := m.PrepareInputs(nil, []Input{{Shape: []int64{2}, Strings: texts}})
	require.NoError(t, err)
	require.Len(t, in, 3)
	ids, mask := int64sOf(in[EncoderInputIDs]), int64sOf(in[EncoderAttentionMask])
	wp := m.Tokenizer.(*Tokenizer)
	assert.Equal(t, []string{"the", "water", "is", "warm", "."}, wp.Tokens(texts[0]))
	require.Equal(t, 7, seq, "the request is padded to its longest text: [CLS] + 5 + [SEP]")
	require.Len(t, ids, 2*seq)
	require.Len(t, mask, 2*seq)
	for row, text := range texts {
		want, err := wp.Encode(text, 128, false)
		require.NoError(t, err)
		got := ids[row*seq : (row+1)*seq]
		assert.Equal(t, want, got[:len(want)], text)
		for j := range seq {
			if j < len(want) {
				assert.Equal(t, int64(1), mask[row*seq+j])
			} else {
				assert.Equal(t, int64(0), mask[row*seq+j], "padding is masked")
				assert.Equal(t, wp.PAD, got[j])
			}
		}
	}
	assert.Equal(t, make([]byte, 8*2*seq), in[EncoderTokenTypeIDs], "token types are zero")

	_, seq, err = m.PrepareInputs(nil, []Input{{Shape: []int64{1}, Strings: []string{"two words"}}})
	require.NoError(t, err)
	assert.Equal(t, []string{"two", "word", "##s"}, wp.Tokens("two words"))
	assert.Equal(t, 5, seq, "[CLS] two word ##s [SEP]")
}

func TestLongTextIsTruncatedOrRefused(t *testing.T) {
	m, err := Load("../model_repository/tiny-encoder")
	require.NoError(t, err)
	long := []Input{{Shape: []int64{1}, Strings: []string{strings.Repeat("word ", 300)}}}

	m.Config.Encoder.Truncate = false
	_, _, err = m.PrepareInputs(nil, long)
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrInput))
	assert.True(t, errors.Is(err, ErrTooLong))
	assert.Equal(t, `input "text": element 0: text is longer than the largest sequence bucket: 302 tokens with [CLS] and [SEP], the limit is 128 (the largest seq bucket); shorten it, or set encoder.truncate: true`, err.Error())

	m.Config.Encoder.Truncate = true
	_, seq, err := m.PrepareInputs(nil, long)
	require.NoError(t, err)
	assert.Equal(t, 128, seq)
}

func TestTextBytesAreBoundedBeforeTokenizing(t *testing.T) {
	m, err := Load("../model_repository/tiny-encoder")
	require.NoError(t, err)
	enc := m.Config.Encoder
	over := strings.Repeat("a", 4097)
	words := strings.Repeat("word ", 200) // 1000 bytes, 202 tokens

	enc.Truncate = false
	require.Equal(t, 4096, m.Config.TextLimit(), "32 bytes a token of the largest seq bucket, 128")
	_, _, err = m.PrepareInputs(nil, []Input{{Shape: []int64{2}, Strings: []string{words, over}}})
	assert.True(t, errors.Is(err, ErrInput))
	assert.Equal(t, `input "text": element 1 is 4097 bytes, more than the 4096 of encoder.max_text_bytes (by default 32 bytes per token of the largest seq bucket); shorten it, raise encoder.max_text_bytes, or set encoder.truncate: true`,
		err.Error(), "every element's length is checked before any is tokenized")
	_, _, err = m.PrepareInputs(nil, []Input{{Shape: []int64{1}, Strings: []string{over[1:]}}})
	assert.NoError(t, err, "4096 bytes are accepted")

	enc.Truncate = true
	assert.Zero(t, m.Config.TextLimit(), "truncating, the tokenizer reads only the tokens it keeps")
	_, seq, err := m.PrepareInputs(nil, []Input{{Shape: []int64{1}, Strings: []string{strings.Repeat(words, 1000)}}})
	require.NoError(t, err)
	assert.Equal(t, 128, seq)

	enc.MaxTextBytes = 999
	_, _, err = m.PrepareInputs(nil, []Input{{Shape: []int64{1}, Strings: []string{words}}})
	assert.Equal(t, `input "text": element 0 is 1000 bytes, more than the 999 of encoder.max_text_bytes; shorten it or raise encoder.max_text_bytes`, err.Error())
}

func TestTokenInputs(t *testing.T) {
	m := tokenModel(t, 3)
	ids, mask := packInt64s(5, 6, 7, 8, 9, 0), packInt64s(1, 1, 1, 1, 1, 0)
	in, seq, err := m.PrepareInputs(nil, []Input{{Shape: []int64{2, 3}, Data: ids}, {Shape: []int64{2, 3}, Data: mask}, {}})
	require.NoError(t, err)
	assert.Equal(t, 3, seq)
	assert.Equal(t, []int64{5, 6, 7, 8, 9, 0}, int64sOf(in[EncoderInputIDs]))
	assert.Same(t, &ids[0], &in[EncoderInputIDs][0], "checked, not copied")
	assert.Equal(t, make([]byte, 48), in[EncoderTokenTypeIDs], "token_type_ids may be left out")

	two := tokenModel(t, 2)
	in, _, err = two.PrepareInputs(nil, []Input{{Shape: []int64{2, 3}, Data: ids}, {Shape: []int64{2, 3}, Data: mask}})
	require.NoError(t, err)
	assert.Equal(t, make([]byte, 48), in[EncoderTokenTypeIDs], "a model without token_type_ids steps with zeros")

	row := func(v ...int64) Input { return Input{Shape: []int64{1, int64(len(v))}, Data: packInt64s(v...)} }
	ones65 := make([]int64, 65)
	for i := range ones65 {
		ones65[i] = 1
	}
	for _, tc := range []struct {
		name string
		in   []Input
		want string
	}{
		{"id outside the vocabulary", []Input{row(5, 6, 100), row(1, 1, 1), {}}, `input "input_ids": element 2 is 100; token ids must be in 0..99`},
		{"negative id", []Input{row(-1), row(1), {}}, `input "input_ids": element 0 is -1; token ids must be in 0..99`},
		{"mask not 0 or 1", []Input{row(5, 6, 7), row(1, 2, 1), {}}, `input "attention_mask": element 1 is 2; want 0 or 1`},
		{"type outside its table", []Input{row(5, 6, 7), row(1, 1, 1), row(0, 0, 2)}, `input "token_type_ids": element 2 is 2; want 0..1`},
		{"longer than the largest bucket", []Input{row(ones65...), row(ones65...), {}}, `input "input_ids": sequence length 65 exceeds the largest seq bucket 64`},
		{"shapes differ", []Input{row(1, 2), row(1, 1, 1), {}}, `input shapes [1 2] and [1 3] differ; input_ids, attention_mask and token_type_ids must have the same shape`},
	} {
		_, _, err := m.PrepareInputs(nil, tc.in)
		require.Error(t, err, tc.name)
		assert.True(t, errors.Is(err, ErrInput), tc.name)
		var ie *InputError
		assert.True(t, errors.As(err, &ie), tc.name)
		assert.Equal(t, tc.want, err.Error(), tc.name)
	}

	_, _, err = m.PrepareInputs(nil, []Input{{Shape: []int64{1, 3}, Data: packInt64s(1, 2)}, row(1, 1, 1), {}})
	assert.ErrorContains(t, err, "shape [1 3] needs 24", "data that disagrees with its shape is the caller's mistake")
	assert.False(t, errors.Is(err, ErrInput))
}

// StepBytes bounds what PrepareInputs builds, at the model's longest
// sequence, for any text.
func TestStepBytesBoundsPrepareInputs(t *testing.T) {
	m, err := Load("../model_repository/tiny-encoder")
	require.NoError(t, err)
	maxSeq := m.Config.MaxSeq()
	require.Equal(t, 128, maxSeq)
	texts := []string{"The water is warm.", "", strings.Repeat("word ", 300)}
	in, _, err := m.PrepareInputs(nil, []Input{{Shape: []int64{3}, Strings: texts}})
	require.NoError(t, err)
	packed := int64(len(in[0]) + len(in[1]) + len(in[2]))
	ids := int64(3 * (24 + 8*maxSeq)) // each row's ids before packing
	assert.GreaterOrEqual(t, m.StepBytes(3, maxSeq), packed+ids)

	tokens := tokenModel(t, 2)
	assert.Equal(t, int64(8*4*10), tokens.StepBytes(4, 10), "the zero token types of 4 rows of 10")
	mlp := &Model{Config: &Config{Architecture: "mlp"}}
	assert.Zero(t, mlp.StepBytes(1000, 0), "an mlp's inputs go to the step as they are")
	assert.Zero(t, mlp.Config.MaxSeq())
}
