package models

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEncoderFamilyKeys: each family's defaults, and the encoder keys'
// errors.
func TestEncoderFamilyKeys(t *testing.T) {
	withEncoder := func(keys string) string {
		return strings.Replace(validEncoder, "max_position: 64}", "max_position: 66"+keys+"}", 1)
	}
	c, err := ParseConfig(strings.NewReader(withEncoder(", family: xlm-roberta")))
	require.NoError(t, err)
	e := c.Encoder
	assert.Equal(t, []any{1, 2, 1e-5, 1, "gelu", HeadNone, 64}, []any{e.PadID(), e.PositionOffset(), e.LayerNormEps, e.TypeVocabSize, e.HiddenAct, e.Head, e.MaxSeq()})
	c, err = ParseConfig(strings.NewReader(withEncoder(", family: distilbert")))
	require.NoError(t, err)
	assert.Equal(t, []any{0, 0, 1e-12, false}, []any{c.Encoder.PadID(), c.Encoder.PositionOffset(), c.Encoder.LayerNormEps, c.Encoder.TokenTypes()})

	for _, tc := range []struct{ keys, outputs, want string }{
		{", family: gpt2", "", `encoder.family: "gpt2" is not supported; want bert or roberta or xlm-roberta or camembert or distilbert`},
		{", hidden_act: swish", "", `encoder.hidden_act: "swish" is not supported`},
		{", pooling: max", "", `encoder.pooling: "max" is not supported; want cls or mean or last`},
		{", head: classification", "", `encoder.num_labels: 0 must be in 1..`},
		{", head: classification, num_labels: 2", "", `outputs: an encoder with encoder.num_labels 2 gives exactly one FP32 output of shape [-1, 2]`},
		{", head: classification, num_labels: 2, pooling: mean", "[-1, 2]", `a classification head reads the first token`},
		{", num_labels: 2", "", `encoder.num_labels: 2 needs encoder.head: classification`},
		{", family: roberta, max_position: 65", "", `buckets.seq: 64 exceeds 63, encoder.max_position 65 less the roberta position offset 2`},
		{", pad_token_id: 10", "", `encoder.pad_token_id: 10 is outside the vocabulary; want 0..9`},
	} {
		doc := withEncoder(tc.keys)
		if strings.Contains(tc.keys, "max_position: 65") {
			doc = strings.Replace(validEncoder, "max_position: 64}", "max_position: 65"+strings.Replace(tc.keys, ", max_position: 65", "", 1)+"}", 1)
		}
		if tc.outputs != "" {
			doc = strings.Replace(doc, "[-1, 8]", tc.outputs, 1)
		}
		_, err := ParseConfig(strings.NewReader(doc))
		require.Error(t, err, tc.keys)
		assert.Contains(t, err.Error(), tc.want, tc.keys)
	}

	pair := strings.Replace(withEncoder(", head: classification, num_labels: 1"), "  - {name: text, datatype: BYTES, shape: [-1]}",
		"  - {name: text, datatype: BYTES, shape: [-1]}\n  - {name: text_pair, datatype: BYTES, shape: [-1]}", 1)
	pair = strings.Replace(pair, "[-1, 8]", "[-1, 1]", 1)
	_, err = ParseConfig(strings.NewReader(pair))
	assert.NoError(t, err, "a classification head takes text and text_pair")
	_, err = ParseConfig(strings.NewReader(strings.Replace(strings.Replace(pair, ", head: classification, num_labels: 1", "", 1), "[-1, 1]", "[-1, 8]", 1)))
	assert.NoError(t, err, "an embedder may take (title, body) pairs")
	_, err = ParseConfig(strings.NewReader(strings.Replace(pair, "name: text_pair", "name: second", 1)))
	assert.ErrorContains(t, err, "(and optionally text_pair, BYTES [-1])", "only text_pair is a second text input")
}
