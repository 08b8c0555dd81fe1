// Package tokenizers reads the Hugging Face tokenizers format
// (tokenizer.json) and tokenizes text as that library does: added tokens,
// then a normalizer, a pre-tokenizer, a model (WordPiece, Unigram or BPE)
// and a post-processor that adds the special tokens and token types.
//
// Every stage runs in time linear in the text (a constant factor bounded by
// the vocabulary's longest token or the added tokens' longest content) and
// keeps, for each byte of the text it works on, the byte span of the
// original text it came from: each token has byte offsets into the text it
// was read from.
package tokenizers

import (
	"unicode/utf8"
)

// span is a byte range [start, end) of the original text.
type span struct{ start, end int32 }

// text is a piece of (normalized, pre-tokenized) text: its bytes, and for
// each byte the span of the original text it came from. Bytes inserted
// before a piece (a prepended "▁") span its first character.
type text struct {
	s  []byte
	al []span
}

// newText is s as the original text, each byte its own span, offset by
// base. A byte that is not UTF-8 reads as U+FFFD, spanning that byte.
func newText(s string, base int) text {
	t := text{s: make([]byte, 0, len(s)), al: make([]span, 0, len(s))}
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			t.s = append(t.s, "\uFFFD"...)
			for range 3 {
				t.al = append(t.al, span{int32(base + i), int32(base + i + 1)})
			}
			i++
			continue
		}
		for k := range n {
			t.s = append(t.s, s[i+k])
			t.al = append(t.al, span{int32(base + i + k), int32(base + i + k + 1)})
		}
		i += n
	}
	return t
}

// slice is the bytes [i, j) of t, sharing its storage.
func (t text) slice(i, j int) text { return text{t.s[i:j:j], t.al[i:j:j]} }

// origin is the span of the original text that bytes [i, j) of t came
// from; for an empty range, the point where it is.
func (t text) origin(i, j int) (int, int) {
	if i >= j {
		switch {
		case len(t.al) == 0:
			return 0, 0
		case i < len(t.al):
			return int(t.al[i].start), int(t.al[i].start)
		default:
			e := int(t.al[len(t.al)-1].end)
			return e, e
		}
	}
	return int(t.al[i].start), int(t.al[j-1].end)
}

// builder appends to a new text.
type builder struct{ t text }

func (b *builder) grow(n int) {
	if cap(b.t.s)-len(b.t.s) < n {
		s := make([]byte, len(b.t.s), 2*cap(b.t.s)+n)
		copy(s, b.t.s)
		al := make([]span, len(b.t.al), 2*cap(b.t.s)+n)
		copy(al, b.t.al)
		b.t.s, b.t.al = s, al
	}
}

// add appends s, every byte of it from sp.
func (b *builder) add(s []byte, sp span) {
	b.grow(len(s))
	b.t.s = append(b.t.s, s...)
	for range s {
		b.t.al = append(b.t.al, sp)
	}
}

func (b *builder) addString(s string, sp span) {
	b.grow(len(s))
	b.t.s = append(b.t.s, s...)
	for range len(s) {
		b.t.al = append(b.t.al, sp)
	}
}

// addRune appends r from sp.
func (b *builder) addRune(r rune, sp span) {
	var enc [utf8.UTFMax]byte
	b.add(enc[:utf8.EncodeRune(enc[:], r)], sp)
}

// copyFrom appends bytes [i, j) of t with their own spans.
func (b *builder) copyFrom(t text, i, j int) {
	b.grow(j - i)
	b.t.s = append(b.t.s, t.s[i:j]...)
	b.t.al = append(b.t.al, t.al[i:j]...)
}

// runeSpan is the span of the rune of t at bytes [i, j).
func (t text) runeSpan(i, j int) span {
	return span{t.al[i].start, t.al[j-1].end}
}

// mapRunes rewrites t rune by rune: f appends the replacement of r, read
// from bytes [i, j) of t, to b (or nothing to drop it).
func mapRunes(t text, f func(b *builder, r rune, sp span)) text {
	b := builder{text{make([]byte, 0, len(t.s)), make([]span, 0, len(t.s))}}
	for i := 0; i < len(t.s); {
		r, n := utf8.DecodeRune(t.s[i:])
		f(&b, r, t.runeSpan(i, i+n))
		i += n
	}
	return b.t
}

// firstRune is the span of t's first rune, which text inserted before it
// takes.
func (t text) firstRune() span {
	_, n := utf8.DecodeRune(t.s)
	return t.runeSpan(0, n)
}
