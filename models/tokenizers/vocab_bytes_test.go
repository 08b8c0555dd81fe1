package tokenizers

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A text's tokens' bytes, joined, are the text (up to the space a
// SentencePiece tokenizer puts before it), for every kind of vocabulary;
// special tokens have none.
func TestVocabBytesJoinToTheText(t *testing.T) {
	const text = "Hello world, {\"key\": [1, 2.5e3]} ünïcödé 🙂 tabs\tand\nlines"
	for _, name := range []string{"bpe", "bytefallback", "unigram", "wordpiece"} {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(testdata, name+".json"))
			require.NoError(t, err)
			tok, err := Parse(data)
			require.NoError(t, err)
			vb := tok.VocabBytes()
			require.Len(t, vb, tok.VocabSize())
			for _, id := range tok.SpecialIDs() {
				assert.Nil(t, vb[id], "special token %d", id)
			}
			if name == "wordpiece" {
				return // lowercases and splits off punctuation: its text is not the input's
			}
			text := text
			if name == "unigram" {
				// Its vocabulary has no brackets: they are its unknown
				// token, which is special.
				text = strings.NewReplacer("{", "", "}", "", "[", "", "]", "").Replace(text)
			}
			toks, err := tok.Encode(text, "", false, Options{})
			require.NoError(t, err)
			var joined []byte
			for _, tk := range toks {
				if tok.Special(tk.ID) {
					continue
				}
				joined = append(joined, vb[tk.ID]...)
			}
			assert.Equal(t, text, string(bytes.TrimPrefix(joined, []byte(" "))), "the tokens' bytes join to the text")
		})
	}
}
