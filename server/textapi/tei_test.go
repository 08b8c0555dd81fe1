package textapi

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stepserve/stepserve/models"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The cut itself: whole characters, within the bucket, either side.
func TestCutToTokens(t *testing.T) {
	long := strings.Repeat("héllo 😀😀 wörld 日本語のテキスト ", 40)
	m, err := models.Load("../../model_repository/tiny-encoder")
	require.NoError(t, err)
	for _, left := range []bool{true, false} {
		for _, maxSeq := range []int{5, 6, 7, 12, 24, 31, 32, 64} {
			cut, err := cutToTokens(m, long, maxSeq, left)
			require.NoError(t, err)
			assert.True(t, utf8.ValidString(cut), "left %v, %d tokens: %q", left, maxSeq, cut)
			ids, err := m.Tokenizer.AppendEncode(nil, cut, 1<<20, false)
			require.NoError(t, err)
			assert.LessOrEqual(t, len(ids), maxSeq, "left %v: %q", left, cut)
		}
	}
}
