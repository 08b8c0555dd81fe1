package tokenizers

import "strings"

// VocabBytes is every token's bytes as it stands inside a text, by id:
// what constrained decoding matches tokens against (a grammar engine
// walks them byte by byte). A special token has none (nil): it is no
// text. Byte-level and byte-fallback tokens are their raw bytes (part of
// a character, for some); the others are their text as the decoder
// renders it after another token (SentencePiece's ▁ is a space there,
// which a text's first token loses), so that a text's tokens' bytes
// joined are its text.
func (t *Tokenizer) VocabBytes() [][]byte {
	out := make([][]byte, t.VocabSize())
	anchor, prefix := t.anchor()
	for i := range out {
		id := int64(i)
		if t.Special(id) || t.TokenText(id) == "" {
			continue
		}
		if raw := rawBytes(t.decoder, t.TokenText(id)); raw != nil {
			out[i] = raw
			continue
		}
		if anchor < 0 {
			out[i] = []byte(t.Decode([]int64{id}, false))
			continue
		}
		out[i] = []byte(strings.TrimPrefix(t.Decode([]int64{anchor, id}, false), prefix))
	}
	return out
}

// anchor is a token that decodes alone to one ASCII letter, and that
// letter: decoded after it, a token is rendered as inside a text. -1
// when the vocabulary has none.
func (t *Tokenizer) anchor() (int64, string) {
	for _, s := range []string{"a", "e", "t", "x"} {
		if id, ok := t.ID(s); ok && !t.Special(id) && t.Decode([]int64{id}, false) == s {
			return id, s
		}
	}
	for i := range t.VocabSize() {
		id := int64(i)
		if t.Special(id) {
			continue
		}
		if s := t.Decode([]int64{id}, false); len(s) == 1 && 'a' <= s[0] && s[0] <= 'z' {
			return id, s
		}
	}
	return -1, ""
}
