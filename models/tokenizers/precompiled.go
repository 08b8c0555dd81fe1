package tokenizers

import (
	"bytes"
	"encoding/binary"
	"unicode"
	"unicode/utf8"
)

// precompiled is SentencePiece's precompiled charsmap (the Precompiled
// normalizer of XLM-R, T5 and other SentencePiece conversions): a
// darts-clone double-array trie from UTF-8 strings to their normalized
// forms. It normalizes as tokenizers' Rust Precompiled does: each
// grapheme cluster shorter than 6 bytes is looked up whole, and otherwise
// (or when the whole is not in the map) character by character.
//
// Grapheme clusters are approximated: a character with the combining
// marks, joiners, variation selectors and emoji modifiers after it.
//
// A charsmap that is empty or does not decode is replaced by
// [nmtNFKC], the nmt_nfkc rules (which XLM-R's charsmap compiles): NFKC
// with control characters dropped and odd spaces made ' '; that is what
// transformers.js does for every Precompiled normalizer.
type precompiled struct {
	trie       []uint32
	normalized []byte // NUL-terminated strings; the trie's values index it
	longest    int    // the longest of them, in bytes
}

// nmtFallback is Precompiled without a usable charsmap.
type nmtFallback struct{}

func (nmtFallback) normalize(t text) text { return nmtNFKC(t) }

func newPrecompiled(charsmap []byte) normalizer {
	if len(charsmap) < 4 {
		return nmtFallback{}
	}
	size := int(binary.LittleEndian.Uint32(charsmap))
	rest := charsmap[4:]
	if size%4 != 0 || size == 0 || size > len(rest) {
		return nmtFallback{}
	}
	p := &precompiled{trie: make([]uint32, size/4), normalized: rest[size:]}
	for i := range p.trie {
		p.trie[i] = binary.LittleEndian.Uint32(rest[4*i:])
	}
	if len(p.normalized) > 0 && p.normalized[len(p.normalized)-1] != 0 {
		return nmtFallback{}
	}
	// The longest replacement bounds the growth of one byte of text.
	for _, r := range bytes.Split(p.normalized, []byte{0}) {
		p.longest = max(p.longest, len(r))
	}
	return p
}

// The fields of a darts-clone unit.
func dartsHasLeaf(u uint32) bool  { return (u>>8)&1 == 1 }
func dartsValue(u uint32) int     { return int(u & (1<<31 - 1)) }
func dartsLabel(u uint32) uint32  { return u & (1<<31 | 0xFF) }
func dartsOffset(u uint32) uint32 { return (u >> 10) << ((u & (1 << 9)) >> 6) }

// transform is the normalized form of chunk: the value of the first
// (shortest) key that prefixes it, as tokenizers' Rust does; ok is false
// when no key does.
func (p *precompiled) transform(chunk []byte) (out []byte, ok bool) {
	node := uint32(0)
	if len(p.trie) == 0 {
		return nil, false
	}
	node ^= dartsOffset(p.trie[0])
	for _, c := range chunk {
		if c == 0 {
			break
		}
		node ^= uint32(c)
		if int(node) >= len(p.trie) {
			return nil, false
		}
		u := p.trie[node]
		if dartsLabel(u) != uint32(c) {
			return nil, false
		}
		node ^= dartsOffset(u)
		if int(node) >= len(p.trie) {
			return nil, false
		}
		if dartsHasLeaf(u) {
			v := dartsValue(p.trie[node])
			if v >= len(p.normalized) {
				return nil, false
			}
			end := bytes.IndexByte(p.normalized[v:], 0)
			if end < 0 {
				return nil, false
			}
			return p.normalized[v : v+end], true
		}
	}
	return nil, false
}

func (p *precompiled) normalize(t text) text {
	b := builder{text{make([]byte, 0, len(t.s)), make([]span, 0, len(t.s))}}
	for i := 0; i < len(t.s); {
		j := graphemeEnd(t.s, i)
		if j-i < 6 {
			if out, ok := p.transform(t.s[i:j]); ok {
				b.add(out, t.runeSpan(i, j))
				i = j
				continue
			}
		}
		for i < j {
			_, n := utf8.DecodeRune(t.s[i:])
			if out, ok := p.transform(t.s[i : i+n]); ok {
				b.add(out, t.runeSpan(i, i+n))
			} else {
				b.copyFrom(t, i, i+n)
			}
			i += n
		}
	}
	return b.t
}

// graphemeEnd is the end of the grapheme cluster starting at i, as
// precompiled approximates it.
func graphemeEnd(s []byte, i int) int {
	_, n := utf8.DecodeRune(s[i:])
	i += n
	for i < len(s) {
		r, n := utf8.DecodeRune(s[i:])
		switch {
		case unicode.In(r, unicode.Mn, unicode.Me, unicode.Mc),
			r >= 0xFE00 && r <= 0xFE0F, r >= 0xE0100 && r <= 0xE01EF, r >= 0x1F3FB && r <= 0x1F3FF:
			i += n
		case r == 0x200D: // a zero-width joiner takes the character after it
			i += n
			if i < len(s) {
				_, n = utf8.DecodeRune(s[i:])
				i += n
			}
		default:
			return i
		}
	}
	return i
}
