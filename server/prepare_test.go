package server

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/models"
)

func loadModel(t *testing.T, dir string) *models.Model {
	m, err := models.Load(dir)
	require.NoError(t, err)
	return m
}

func decodeAndPrepare(t *testing.T, m *models.Model, body string, headerLen int) (*inferRequest, error) {
	req, err := decodeRequest([]byte(body), headerLen, m, 1<<24)
	if err != nil {
		return nil, err
	}
	sr, err := prepare(m, req)
	if err != nil {
		return nil, err
	}
	req.inputs = nil
	tokens := int64sOf(sr.Inputs[0])
	mask := int64sOf(sr.Inputs[1])
	require.Len(t, tokens, sr.Rows*sr.Seq)
	require.Len(t, mask, sr.Rows*sr.Seq)
	req.inputs = []tensor{{shape: []int64{int64(sr.Rows), int64(sr.Seq)}, data: sr.Inputs[0]}, {data: sr.Inputs[1]}, {data: sr.Inputs[2]}}
	return req, nil
}

func TestTextIsTokenized(t *testing.T) {
	m := loadModel(t, "../model_repository/tiny-encoder")
	texts := []string{"The water is warm.", "hello"}
	req, err := decodeAndPrepare(t, m, `{"inputs":[{"name":"text","datatype":"BYTES","shape":[2],"data":["The water is warm.","hello"]}]}`, -1)
	require.NoError(t, err)
	ids := int64sOf(req.inputs[0].data)
	mask := int64sOf(req.inputs[1].data)
	seq := int(req.inputs[0].shape[1])
	assert.Equal(t, []string{"the", "water", "is", "warm", "."}, m.Tokenizer.Tokens(texts[0]))
	require.Equal(t, 7, seq, "the request is padded to its longest text: [CLS] + 5 + [SEP]")
	for row, text := range texts {
		want, err := m.Tokenizer.Encode(text, 128, false)
		require.NoError(t, err)
		got := ids[row*seq : (row+1)*seq]
		assert.Equal(t, want, got[:len(want)], text)
		for j := range seq {
			if j < len(want) {
				assert.Equal(t, int64(1), mask[row*seq+j])
			} else {
				assert.Equal(t, int64(0), mask[row*seq+j], "padding is masked")
				assert.Equal(t, m.Tokenizer.PAD, got[j])
			}
		}
	}
	assert.Equal(t, make([]byte, 8*2*seq), req.inputs[2].data, "token types are zero")
}

func TestTextBinaryAndErrors(t *testing.T) {
	m := loadModel(t, "../model_repository/tiny-encoder")
	var blob []byte
	for _, s := range []string{"one", "two words"} {
		blob = binary.LittleEndian.AppendUint32(blob, uint32(len(s)))
		blob = append(blob, s...)
	}
	header := fmt.Sprintf(`{"inputs":[{"name":"text","datatype":"BYTES","shape":[2],"parameters":{"binary_data_size":%d}}]}`, len(blob))
	req, err := decodeAndPrepare(t, m, header+string(blob), len(header))
	require.NoError(t, err)
	assert.Equal(t, []string{"two", "word", "##s"}, m.Tokenizer.Tokens("two words"))
	assert.Equal(t, int64(5), req.inputs[0].shape[1], "[CLS] two word ##s [SEP]")

	long := strings.Repeat("word ", 300)
	m.Config.Encoder.Truncate = false
	_, err = decodeAndPrepare(t, m, `{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":["`+long+`"]}]}`, -1)
	require.Error(t, err)
	assert.Equal(t, 400, statusOf(err))
	assert.Contains(t, err.Error(), `input "text": element 0: text is longer than the largest sequence bucket: 302 tokens with [CLS] and [SEP], the limit is 128`)
	m.Config.Encoder.Truncate = true
	req, err = decodeAndPrepare(t, m, `{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":["`+long+`"]}]}`, -1)
	require.NoError(t, err)
	assert.Equal(t, int64(128), req.inputs[0].shape[1])

	bad := []struct{ body, want string }{
		{`{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":["caf` + "\xe9" + `"]}]}`, `input "text": data is not valid UTF-8`},
		{`{"inputs":[{"name":"text","datatype":"BYTES","shape":[2],"data":["a"]}]}`, "shape [2] needs 2 strings, data has 1"},
		{`{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":[7]}]}`, "element 0 is 7; want a string"},
		{`{"inputs":[{"name":"text","datatype":"FP32","shape":[1],"data":[7]}]}`, "datatype FP32, want BYTES"},
	}
	for _, tc := range bad {
		_, err := decodeAndPrepare(t, m, tc.body, -1)
		require.Error(t, err, tc.body)
		assert.Equal(t, 400, statusOf(err))
		assert.Contains(t, err.Error(), tc.want)
	}
	lying := `{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":8}}]}`
	_, err = decodeAndPrepare(t, m, lying+"\x09\x00\x00\x00abcd", len(lying))
	assert.ErrorContains(t, err, "element 0: length 9 runs past the 4 bytes of binary data left")
}

func TestTokenInputs(t *testing.T) {
	m := loadModel(t, "../engine/cpufallback/testdata/encoder")
	ids := func(shape string, ids, mask, types string) string {
		b := `{"inputs":[{"name":"input_ids","datatype":"INT64","shape":` + shape + `,"data":` + ids + `},` +
			`{"name":"attention_mask","datatype":"INT64","shape":` + shape + `,"data":` + mask + `}`
		if types != "" {
			b += `,{"name":"token_type_ids","datatype":"INT64","shape":` + shape + `,"data":` + types + `}`
		}
		return b + `]}`
	}
	req, err := decodeAndPrepare(t, m, ids("[2,3]", "[[5,6,7],[8,9,0]]", "[[1,1,1],[1,1,0]]", ""), -1)
	require.NoError(t, err)
	assert.Equal(t, []int64{5, 6, 7, 8, 9, 0}, int64sOf(req.inputs[0].data))
	assert.Equal(t, make([]byte, 48), req.inputs[2].data, "token_type_ids may be left out")

	seq65 := "[" + strings.TrimSuffix(strings.Repeat("1,", 65), ",") + "]"
	for _, tc := range []struct{ body, want string }{
		{ids("[1,3]", "[5,6,100]", "[1,1,1]", ""), `input "input_ids": element 2 is 100; token ids must be in 0..99`},
		{ids("[1,3]", "[5,6,7]", "[1,2,1]", ""), `input "attention_mask": element 1 is 2; want 0 or 1`},
		{ids("[1,3]", "[5,6,7]", "[1,1,1]", "[0,0,2]"), `input "token_type_ids": element 2 is 2; want 0..1`},
		{ids("[1,65]", seq65, seq65, ""), `input "input_ids": sequence length 65 exceeds the largest seq bucket 64`},
		{ids("[1,0]", "[]", "[]", ""), `dimension 1 (the sequence) must be at least 1`},
		{`{"inputs":[{"name":"input_ids","datatype":"INT64","shape":[1,2],"data":[1,2]},{"name":"attention_mask","datatype":"INT64","shape":[1,3],"data":[1,1,1]}]}`, `input shapes [1 2] and [1 3] differ`},
		{`{"inputs":[{"name":"input_ids","datatype":"INT64","shape":[1,2],"data":[1,2]}]}`, `missing input "attention_mask"`},
		{`{"inputs":[{"name":"input_ids","datatype":"INT64","shape":[1,2],"data":[1,2.5]},{"name":"attention_mask","datatype":"INT64","shape":[1,2],"data":[1,1]}]}`, `element 1: 2.5 is not an integer in the INT64 range`},
	} {
		_, err := decodeAndPrepare(t, m, tc.body, -1)
		require.Error(t, err, tc.body)
		assert.Equal(t, 400, statusOf(err), tc.body)
		assert.Contains(t, err.Error(), tc.want)
	}
}
