package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTokenizeKeepsUnknownText: tiny-xlmr's Unigram model answers a
// character outside its vocabulary with <unk>, which /tokenize reports as
// "special": true with null offsets (it is in added_tokens as special),
// and add_special_tokens: false then deletes it: the text "一丁" (bytes
// 1..7) vanishes from the answer. Hugging Face marks only the tokens the
// post-processor adds as special; an <unk> the model produced stands for
// text and keeps its offsets. The same confusion makes cutToTokens
// (truncation_direction Left) count <unk> tokens as special ones.
func TestTokenizeKeepsUnknownText(t *testing.T) {
	p := start(t)
	resp, out := post(t, p.base+"/tokenize", []byte(`{"model":"tiny-xlmr","inputs":"x\u4e00\u4e01y","add_special_tokens":false}`))
	require.Equal(t, 200, resp.StatusCode, string(out))
	var toks [][]struct {
		ID      int64  `json:"id"`
		Text    string `json:"text"`
		Special bool   `json:"special"`
		Start   *int   `json:"start"`
		Stop    *int   `json:"stop"`
	}
	require.NoError(t, json.Unmarshal(out, &toks))
	covered := make([]bool, len("x\u4e00\u4e01y"))
	for _, tok := range toks[0] {
		assert.False(t, tok.Special, "no special tokens were asked for: %+v", tok)
		if tok.Start != nil && tok.Stop != nil {
			for i := *tok.Start; i < *tok.Stop && i < len(covered); i++ {
				covered[i] = true
			}
		}
	}
	for i, c := range covered {
		assert.True(t, c, "byte %d of the text is in no token: %s", i, out)
	}
}
