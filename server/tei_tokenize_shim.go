package server

// A stand-in for Model.Tokenizer.Tokenize (issue 18's contract: tok's
// branch adds it, with models.Token) until that branch merges. When it
// does, delete this file and write, in tei.go's place of use:
//
//	type textToken = models.Token
//	func tokenize(m *models.Model, text string) ([]textToken, error) { return m.Tokenizer.Tokenize(text) }

import (
	"math"
	"strings"
	"unicode/utf8"

	"github.com/stepserve/stepserve/models"
)

// textToken is models.Token: a token's id, its text, its byte offsets in
// the text (Start == Stop for a special token) and whether it is special.
type textToken struct {
	ID          int64
	Text        string
	Start, Stop int
	Special     bool
}

// tokenize splits text as the model's tokenizer does, special tokens
// included. The offsets are found by looking for each piece (without its
// ## continuation mark) a short way past the last one, case-insensitively:
// a piece the text does not spell out ([UNK], accents stripped) gets an
// empty span there.
func tokenize(m *models.Model, text string) ([]textToken, error) {
	tk := m.Tokenizer
	ids, err := tk.AppendEncode(nil, text, math.MaxInt, false)
	if err != nil {
		return nil, err
	}
	pieces := tk.Tokens(text)
	if len(pieces) != len(ids)-2 {
		pieces = nil // cannot happen: both read the same text
	}
	out := make([]textToken, 0, len(ids))
	out = append(out, textToken{ID: ids[0], Text: "[CLS]", Special: true})
	at := 0
	for i, id := range ids[1 : len(ids)-1] {
		tok := textToken{ID: id, Start: at, Stop: at}
		if pieces != nil {
			tok.Text = pieces[i]
			if start, stop, ok := findFold(text, at, strings.TrimPrefix(pieces[i], "##")); ok {
				tok.Start, tok.Stop, at = start, stop, stop
			}
		}
		out = append(out, tok)
	}
	return append(out, textToken{ID: ids[len(ids)-1], Text: "[SEP]", Start: len(text), Stop: len(text), Special: true}), nil
}

// findFold finds piece in text at or a little past from (the window keeps
// a text of many unmatched pieces linear), ignoring case.
func findFold(text string, from int, piece string) (start, stop int, ok bool) {
	const window = 64
	for i := from; i < len(text) && i <= from+window; {
		j, k := i, 0
		for j < len(text) && k < len(piece) {
			a, na := utf8.DecodeRuneInString(text[j:])
			b, nb := utf8.DecodeRuneInString(piece[k:])
			if a != b && !strings.EqualFold(string(a), string(b)) {
				break
			}
			j, k = j+na, k+nb
		}
		if k == len(piece) && k > 0 {
			return i, j, true
		}
		_, n := utf8.DecodeRuneInString(text[i:])
		i += n
	}
	return 0, 0, false
}
