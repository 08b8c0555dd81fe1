package randweights

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/models/tokenizers"
)

// The tokenizer has exactly the ids asked for, each decodes to text, and
// text round-trips through it.
func TestByteLevelTokenizer(t *testing.T) {
	b, err := ByteLevelTokenizer(8192)
	require.NoError(t, err)
	tok, err := tokenizers.Parse(b)
	require.NoError(t, err)
	assert.Equal(t, 8192, tok.VocabSize())
	for _, id := range []int64{3, 300, 4000, 8191} {
		assert.NotEmpty(t, tok.TokenBytes(id), "id %d", id)
	}
	const text = "the quick brown fox, 42 times: ünïcode"
	enc, err := tok.Encode(text, "", false, tokenizers.Options{})
	require.NoError(t, err)
	assert.Less(t, len(enc), len(text), "merges shorten the text")
	var ids []int64
	for _, e := range enc {
		ids = append(ids, e.ID)
	}
	assert.Equal(t, text, tok.Decode(ids, true))
	_, err = ByteLevelTokenizer(100)
	assert.ErrorContains(t, err, "at least 259")
}
