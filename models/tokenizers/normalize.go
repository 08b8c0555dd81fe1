package tokenizers

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites text, keeping each byte's origin.
type normalizer interface {
	normalize(t text) text
}

// maxGrowth bounds how many bytes a normalizer chain may make of one byte
// of text, worst case, as a tokenizer.json describes it. The normalizers
// real tokenizers use stay far below it (NFKC at most 11 in UTF-8: U+FDFA
// is 3 bytes and becomes 33; BERT's CJK spacing and lowercasing; a
// Replace of a space by U+2581), while a chain of Replaces each turning
// one character into a hundred would make a 700-byte request 10^8 bytes.
const maxGrowth = 256

// growth is the most bytes n may make of one byte of text (and of the
// empty text: a Prepend adds bytes to any), a bound, not an estimate.
func growth(n normalizer) (perByte, added int) {
	switch n := n.(type) {
	case sequenceNormalizer:
		perByte = 1
		for _, m := range n {
			p, a := growth(m)
			perByte, added = min(perByte*p, 1<<30), min(added*p+a, 1<<30)
		}
		return perByte, added
	case bertNormalizer:
		return 2 * 4 * 2, 0 // CJK spacing, NFD, lowercasing
	case unicodeForm:
		if n.form == norm.NFKC || n.form == norm.NFKD {
			return 18, 0 // U+FDFA: one character, 18 in NFKD
		}
		return 4, 0
	case lowercase:
		return 2, 0
	case replace:
		return n.growth(), 0
	case prepend:
		return 1, len(n)
	case *precompiled:
		return n.longest, 0
	case nmtFallback:
		return 18, 0
	}
	return 1, 0
}

// growthError refuses a normalizer chain that could expand text more than
// maxGrowth-fold.
func growthError(n normalizer) error {
	if p, a := growth(n); p > maxGrowth || a > maxGrowth*64 {
		return fmt.Errorf("the normalizers could make up to %d bytes of each byte of text (and add %d); stepserve serves at most %d-fold growth", p, a, maxGrowth)
	}
	return nil
}

// normalizerConfig is a tokenizer.json normalizer, every type's fields.
type normalizerConfig struct {
	Type string `json:"type"`
	// BertNormalizer
	CleanText          *bool `json:"clean_text"`
	HandleChineseChars *bool `json:"handle_chinese_chars"`
	StripAccents       *bool `json:"strip_accents"`
	Lowercase          *bool `json:"lowercase"`
	// Strip
	StripLeft  bool `json:"strip_left"`
	StripRight bool `json:"strip_right"`
	// Replace
	Pattern patternConfig `json:"pattern"`
	Content string        `json:"content"`
	// Prepend
	Prepend string `json:"prepend"`
	// Precompiled
	PrecompiledCharsmap []byte `json:"precompiled_charsmap"` // base64 in JSON
	// Sequence
	Normalizers []json.RawMessage `json:"normalizers"`
}

func parseNormalizer(raw json.RawMessage, depth int) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	if depth > maxNesting {
		return nil, fmt.Errorf("Sequence nested more than %d deep", maxNesting)
	}
	var c normalizerConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	or := func(p *bool, def bool) bool {
		if p == nil {
			return def
		}
		return *p
	}
	switch c.Type {
	case "BertNormalizer":
		lower := or(c.Lowercase, true)
		return bertNormalizer{
			clean:   or(c.CleanText, true),
			chinese: or(c.HandleChineseChars, true),
			strip:   or(c.StripAccents, lower),
			lower:   lower,
		}, nil
	case "NFC":
		return unicodeForm{norm.NFC}, nil
	case "NFD":
		return unicodeForm{norm.NFD}, nil
	case "NFKC":
		return unicodeForm{norm.NFKC}, nil
	case "NFKD":
		return unicodeForm{norm.NFKD}, nil
	case "Lowercase":
		return lowercase{}, nil
	case "Strip":
		return strip{c.StripLeft, c.StripRight}, nil
	case "StripAccents":
		return stripAccents{}, nil
	case "Replace":
		m, err := compilePattern(c.Pattern)
		if err != nil {
			return nil, fmt.Errorf("Replace: %w", err)
		}
		return replace{m, c.Content}, nil
	case "Prepend":
		return prepend(c.Prepend), nil
	case "Precompiled":
		return newPrecompiled(c.PrecompiledCharsmap), nil
	case "Sequence":
		var seq sequenceNormalizer
		for i, r := range c.Normalizers {
			n, err := parseNormalizer(r, depth+1)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		return seq, nil
	}
	return nil, fmt.Errorf("type %q is not supported; want BertNormalizer, NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Replace, Prepend, Precompiled or Sequence", c.Type)
}

type sequenceNormalizer []normalizer

func (s sequenceNormalizer) normalize(t text) text {
	for _, n := range s {
		t = n.normalize(t)
	}
	return t
}

// bertNormalizer is BERT's cleanup, in the order of tokenizers' Rust
// BertNormalizer: control characters dropped and whitespace made ' ', CJK
// ideographs spaced, accents stripped (NFD, then no Mn), lowercased.
type bertNormalizer struct{ clean, chinese, strip, lower bool }

func (n bertNormalizer) normalize(t text) text {
	if n.clean || n.chinese {
		t = mapRunes(t, func(b *builder, r rune, sp span) {
			switch {
			case n.clean && (r == 0 || r == utf8.RuneError || IsControl(r)):
			case n.clean && IsWhitespace(r):
				b.addRune(' ', sp)
			case n.chinese && IsCJK(r):
				b.addRune(' ', sp)
				b.addRune(r, sp)
				b.addRune(' ', sp)
			default:
				b.addRune(r, sp)
			}
		})
	}
	if n.strip {
		t = stripAccents{}.normalize(unicodeForm{norm.NFD}.normalize(t))
	}
	if n.lower {
		t = lowercase{}.normalize(t)
	}
	return t
}

// IsWhitespace is BERT's whitespace: tab, newline, carriage return, and
// Unicode's White_Space.
func IsWhitespace(r rune) bool { return unicode.IsSpace(r) }

// IsControl is BERT's control character: every category starting with C
// but tab, newline and carriage return.
func IsControl(r rune) bool {
	if r == '\t' || r == '\n' || r == '\r' {
		return false
	}
	return unicode.In(r, unicode.C)
}

// IsCJK covers the CJK Unified Ideographs blocks BERT splits per character
// (not Hangul or kana, which are written with spaces).
func IsCJK(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) ||
		(r >= 0x20000 && r <= 0x2A6DF) || (r >= 0x2A700 && r <= 0x2B73F) ||
		(r >= 0x2B740 && r <= 0x2B81F) || (r >= 0x2B820 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) || (r >= 0x2F800 && r <= 0x2FA1F)
}

// IsPunctuation is BERT's: every non-alphanumeric printable ASCII
// character, and Unicode punctuation.
func IsPunctuation(r rune) bool {
	if (r >= 33 && r <= 47) || (r >= 58 && r <= 64) || (r >= 91 && r <= 96) || (r >= 123 && r <= 126) {
		return true
	}
	return unicode.IsPunct(r)
}

// unicodeForm applies a Unicode normalization form, segment by segment (a
// starter and its combining marks). A changed segment's bytes that agree
// with the input at its ends keep their own origin; the rest span the
// segment's.
//
// Go's norm cuts a run of more than 30 combining marks with a CGJ
// (U+034F, Unicode's Stream-Safe Text Format), which keeps it linear;
// unicodeForm drops those CGJs, so only the order of marks past the 30th
// may differ from an unbounded normalization.
type unicodeForm struct{ form norm.Form }

var cgj = []byte(norm.GraphemeJoiner)

func (u unicodeForm) normalize(t text) text {
	if u.form.IsNormal(t.s) {
		return t
	}
	b := builder{text{make([]byte, 0, len(t.s)+len(t.s)/4), make([]span, 0, len(t.s)+len(t.s)/4)}}
	var it norm.Iter
	it.Init(u.form, t.s)
	prev := 0
	for !it.Done() {
		seg := it.Next()
		pos := it.Pos()
		in := t.s[prev:pos]
		if bytes.HasPrefix(seg, cgj) && !bytes.HasPrefix(in, cgj) {
			seg = seg[len(cgj):]
		}
		switch {
		case bytes.Equal(seg, in):
			b.copyFrom(t, prev, pos)
		case prev == pos:
			if len(seg) > 0 {
				b.add(seg, span{t.al[min(prev, len(t.al)-1)].start, t.al[min(prev, len(t.al)-1)].start})
			}
		default:
			// The bytes both ends share keep their origin.
			head := 0
			for head < len(seg) && head < len(in) && seg[head] == in[head] {
				head++
			}
			for head > 0 && head < len(seg) && !utf8.RuneStart(seg[head]) {
				head--
			}
			tail := 0
			for tail < len(seg)-head && tail < len(in)-head && seg[len(seg)-1-tail] == in[len(in)-1-tail] {
				tail++
			}
			for tail > 0 && !utf8.RuneStart(seg[len(seg)-tail]) {
				tail--
			}
			b.copyFrom(t, prev, prev+head)
			if mid := seg[head : len(seg)-tail]; len(mid) > 0 {
				from := t.runeSpan(prev, pos)
				if prev+head < pos-tail {
					from = t.runeSpan(prev+head, pos-tail)
				}
				b.add(mid, from)
			}
			b.copyFrom(t, pos-tail, pos)
		}
		prev = pos
	}
	return b.t
}

// lowercase is Unicode's full lowercase mapping, character by character
// (as tokenizers' Rust Lowercase: no final-sigma rule).
type lowercase struct{}

func (lowercase) normalize(t text) text {
	return mapRunes(t, func(b *builder, r rune, sp span) {
		if r == 'İ' { // the one rune whose lowercase is two
			b.addString("i\u0307", sp)
			return
		}
		b.addRune(unicode.ToLower(r), sp)
	})
}

// stripAccents drops nonspacing marks (Mn): accents once NFD has
// decomposed them.
type stripAccents struct{}

func (stripAccents) normalize(t text) text {
	return mapRunes(t, func(b *builder, r rune, sp span) {
		if !unicode.Is(unicode.Mn, r) {
			b.addRune(r, sp)
		}
	})
}

type strip struct{ left, right bool }

func (s strip) normalize(t text) text {
	i, j := 0, len(t.s)
	if s.left {
		for i < j {
			r, n := utf8.DecodeRune(t.s[i:j])
			if !unicode.IsSpace(r) {
				break
			}
			i += n
		}
	}
	if s.right {
		for j > i {
			r, n := utf8.DecodeLastRune(t.s[i:j])
			if !unicode.IsSpace(r) {
				break
			}
			j -= n
		}
	}
	return t.slice(i, j)
}

// replace replaces each match of a pattern with content, which spans the
// match's origin.
type replace struct {
	pattern matcher
	content string
}

// growth is the most bytes one byte of text may become: the content for
// each byte of the shortest match (every position, for a pattern that
// matches the empty string).
func (r replace) growth() int {
	return len(r.content)/max(r.pattern.minLen(), 1) + 1
}

func (r replace) normalize(t text) text {
	matches := r.pattern.findAll(t.s)
	if len(matches) == 0 {
		return t
	}
	b := builder{text{make([]byte, 0, len(t.s)), make([]span, 0, len(t.s))}}
	at := 0
	for _, m := range matches {
		b.copyFrom(t, at, m[0])
		b.addString(r.content, t.runeSpan(m[0], m[1]))
		at = m[1]
	}
	b.copyFrom(t, at, len(t.s))
	return b.t
}

// prepend puts a string before non-empty text, spanning its first
// character (as tokenizers' Rust aligns it).
type prepend string

func (p prepend) normalize(t text) text {
	if len(t.s) == 0 || p == "" {
		return t
	}
	b := builder{text{make([]byte, 0, len(t.s)+len(p)), make([]span, 0, len(t.s)+len(p))}}
	b.addString(string(p), t.firstRune())
	b.copyFrom(t, 0, len(t.s))
	return b.t
}

// nmtSpace are the characters SentencePiece's nmt_nfkc rules make a
// space, before NFKC.
func nmtSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\f', '\r', 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x2581, 0x3000, 0xFEFF, 0xFFFD:
		return true
	}
	return r >= 0x2000 && r <= 0x200F
}

// nmtDrop are the control characters nmt_nfkc removes.
func nmtDrop(r rune) bool {
	return r >= 0x1 && r <= 0x8 || r == 0xB || r >= 0xE && r <= 0x1F || r == 0x7F || r == 0x8F || r == 0x9F
}

// nmtNFKC is SentencePiece's nmt_nfkc rule set as transformers.js writes
// it: controls dropped, odd spaces made ' ', then NFKC (U+FF5E, the
// fullwidth tilde, kept as it is). It stands in for a Precompiled charsmap
// that is absent or cannot be decoded.
func nmtNFKC(t text) text {
	t = mapRunes(t, func(b *builder, r rune, sp span) {
		switch {
		case nmtDrop(r):
		case nmtSpace(r):
			b.addRune(' ', sp)
		default:
			b.addRune(r, sp)
		}
	})
	if !bytes.Contains(t.s, []byte("\uFF5E")) {
		return unicodeForm{norm.NFKC}.normalize(t)
	}
	// NFKC each stretch between the tildes.
	b := builder{text{make([]byte, 0, len(t.s)), make([]span, 0, len(t.s))}}
	at := 0
	for _, m := range literal("\uFF5E").findAll(t.s) {
		part := unicodeForm{norm.NFKC}.normalize(t.slice(at, m[0]))
		b.copyFrom(part, 0, len(part.s))
		b.copyFrom(t, m[0], m[1])
		at = m[1]
	}
	part := unicodeForm{norm.NFKC}.normalize(t.slice(at, len(t.s)))
	b.copyFrom(part, 0, len(part.s))
	return b.t
}

// isNull reports whether raw is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}
