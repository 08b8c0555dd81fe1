package tokenizers

import (
	"encoding/json"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// preTokenizer splits normalized text into the words the model tokenizes
// one at a time, and may rewrite them (Metaspace, ByteLevel).
type preTokenizer interface {
	preTokenize(pieces []text) []text
}

type preTokenizerConfig struct {
	Type string `json:"type"`
	// Metaspace
	Replacement    *string `json:"replacement"`
	PrependScheme  string  `json:"prepend_scheme"`
	Split          *bool   `json:"split"`
	AddPrefixSpace *bool   `json:"add_prefix_space"`
	// ByteLevel
	UseRegex *bool `json:"use_regex"`
	// Punctuation, Split
	Behavior string `json:"behavior"`
	// Split
	Pattern patternConfig `json:"pattern"`
	Invert  bool          `json:"invert"`
	// Digits
	IndividualDigits bool `json:"individual_digits"`
	// CharDelimiterSplit
	Delimiter string `json:"delimiter"`
	// Sequence
	PreTokenizers []json.RawMessage `json:"pretokenizers"`
}

func parsePreTokenizer(raw json.RawMessage, depth int) (preTokenizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	if depth > maxNesting {
		return nil, fmt.Errorf("Sequence nested more than %d deep", maxNesting)
	}
	var c preTokenizerConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	switch c.Type {
	case "BertPreTokenizer":
		return bertPreTokenizer{}, nil
	case "Whitespace":
		return whitespace{}, nil
	case "WhitespaceSplit":
		return whitespaceSplit{}, nil
	case "Metaspace":
		m := metaspace{replacement: "▁", prepend: "always", split: true}
		if c.Replacement != nil {
			if utf8.RuneCountInString(*c.Replacement) != 1 {
				return nil, fmt.Errorf("Metaspace: replacement %q; want one character", *c.Replacement)
			}
			m.replacement = *c.Replacement
		}
		if c.Split != nil {
			m.split = *c.Split
		}
		switch {
		case c.PrependScheme != "":
			m.prepend = c.PrependScheme
		case c.AddPrefixSpace != nil && !*c.AddPrefixSpace: // the format before prepend_scheme
			m.prepend = "never"
		}
		if m.prepend != "always" && m.prepend != "first" && m.prepend != "never" {
			return nil, fmt.Errorf("Metaspace: prepend_scheme %q; want always, first or never", m.prepend)
		}
		return m, nil
	case "ByteLevel":
		b := byteLevelPre{prefixSpace: true, regex: true}
		if c.AddPrefixSpace != nil {
			b.prefixSpace = *c.AddPrefixSpace
		}
		if c.UseRegex != nil {
			b.regex = *c.UseRegex
		}
		return b, nil
	case "Punctuation":
		b, err := parseBehavior(c.Behavior)
		if err != nil {
			return nil, fmt.Errorf("Punctuation: %w", err)
		}
		return runeSplit{isPunct, b}, nil
	case "Digits":
		if c.IndividualDigits {
			return runeSplit{unicode.IsDigit, splitIsolated}, nil
		}
		return runeSplit{unicode.IsDigit, splitContiguous}, nil
	case "CharDelimiterSplit":
		if utf8.RuneCountInString(c.Delimiter) != 1 {
			return nil, fmt.Errorf("CharDelimiterSplit: delimiter %q; want one character", c.Delimiter)
		}
		d, _ := utf8.DecodeRuneInString(c.Delimiter)
		return runeSplit{func(r rune) bool { return r == d }, splitRemoved}, nil
	case "Split":
		m, err := compilePattern(c.Pattern)
		if err != nil {
			return nil, fmt.Errorf("Split: %w", err)
		}
		b, err := parseBehavior(c.Behavior)
		if err != nil {
			return nil, fmt.Errorf("Split: %w", err)
		}
		return patternSplit{m, b, c.Invert}, nil
	case "Sequence":
		var seq sequencePreTokenizer
		for i, r := range c.PreTokenizers {
			p, err := parsePreTokenizer(r, depth+1)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			if p != nil {
				seq = append(seq, p)
			}
		}
		return seq, nil
	}
	return nil, fmt.Errorf("type %q is not supported; want BertPreTokenizer, Whitespace, WhitespaceSplit, Metaspace, ByteLevel, Punctuation, Digits, CharDelimiterSplit, Split or Sequence", c.Type)
}

type sequencePreTokenizer []preTokenizer

func (s sequencePreTokenizer) preTokenize(pieces []text) []text {
	for _, p := range s {
		pieces = p.preTokenize(pieces)
	}
	return pieces
}

// runeMatches are the runs of runes of t that is matches, each rune its
// own match.
func runeMatches(t text, is func(rune) bool) [][2]int {
	var out [][2]int
	for i := 0; i < len(t.s); {
		r, n := utf8.DecodeRune(t.s[i:])
		if is(r) {
			out = append(out, [2]int{i, i + n})
		}
		i += n
	}
	return out
}

// runeSplit splits at the runes is matches.
type runeSplit struct {
	is       func(rune) bool
	behavior splitBehavior
}

func (s runeSplit) preTokenize(pieces []text) []text {
	var out []text
	for _, p := range pieces {
		out = splitByMatches(out, p, runeMatches(p, s.is), s.behavior, false)
	}
	return out
}

// isPunct is BERT's punctuation, which tokenizers' Punctuation and
// BertPreTokenizer split at.
func isPunct(r rune) bool { return IsPunctuation(r) }

type whitespaceSplit struct{}

func (whitespaceSplit) preTokenize(pieces []text) []text {
	return runeSplit{unicode.IsSpace, splitRemoved}.preTokenize(pieces)
}

// bertPreTokenizer splits at whitespace (dropped) and punctuation (each
// a word).
type bertPreTokenizer struct{}

func (bertPreTokenizer) preTokenize(pieces []text) []text {
	pieces = runeSplit{unicode.IsSpace, splitRemoved}.preTokenize(pieces)
	return runeSplit{isPunct, splitIsolated}.preTokenize(pieces)
}

// whitespace is the regex \w+|[^\w\s]+: runs of word characters, and
// runs of other non-space characters.
type whitespace struct{}

func isWordChar(r rune) bool {
	return unicode.In(r, unicode.L, unicode.N, unicode.M, unicode.Pc) || r == 0x200C || r == 0x200D
}

func (whitespace) preTokenize(pieces []text) []text {
	var out []text
	for _, p := range pieces {
		start, class := 0, 0 // class 0 space, 1 word, 2 other
		for i := 0; i <= len(p.s); {
			c, n := 0, 0
			if i < len(p.s) {
				var r rune
				r, n = utf8.DecodeRune(p.s[i:])
				switch {
				case isWordChar(r):
					c = 1
				case !unicode.IsSpace(r):
					c = 2
				}
			}
			if i == len(p.s) || c != class {
				if class != 0 && start < i {
					out = append(out, p.slice(start, i))
				}
				start, class = i, c
			}
			if i == len(p.s) {
				break
			}
			i += n
		}
	}
	return out
}

// patternSplit is the Split pre-tokenizer.
type patternSplit struct {
	pattern  matcher
	behavior splitBehavior
	invert   bool
}

func (s patternSplit) preTokenize(pieces []text) []text {
	var out []text
	for _, p := range pieces {
		out = splitByMatches(out, p, s.pattern.findAll(p.s), s.behavior, s.invert)
	}
	return out
}

// metaspace makes spaces the replacement character (▁), prepends one
// (spanning the piece's first character, as tokenizers' Rust does) to a
// piece as prepend_scheme says (always; first: only to the piece at the
// start of the text; never) unless it starts with one, and with split
// cuts before each.
type metaspace struct {
	replacement string
	prepend     string
	split       bool
}

func (m metaspace) preTokenize(pieces []text) []text {
	var out []text
	for _, p := range pieces {
		if len(p.s) == 0 {
			continue
		}
		b := builder{text{make([]byte, 0, len(p.s)+len(m.replacement)), make([]span, 0, len(p.s)+len(m.replacement))}}
		startsWith := len(p.s) > 0 && (p.s[0] == ' ' || string(p.s[:min(len(p.s), len(m.replacement))]) == m.replacement)
		if !startsWith && (m.prepend == "always" || m.prepend == "first" && p.al[0].start == 0) {
			b.addString(m.replacement, p.firstRune())
		}
		for i, c := range p.s {
			if c == ' ' {
				b.addString(m.replacement, p.al[i])
			} else {
				b.add(p.s[i:i+1], p.al[i])
			}
		}
		if !m.split {
			out = append(out, b.t)
			continue
		}
		out = splitByMatches(out, b.t, literal(m.replacement).findAll(b.t.s), splitMergedWithNext, false)
	}
	return out
}

// byteLevelPre is GPT-2's pre-tokenizer: a space prepended to each piece
// that lacks one (add_prefix_space), GPT-2's pattern (use_regex), then
// every byte written in the byte-level alphabet.
type byteLevelPre struct{ prefixSpace, regex bool }

func (bl byteLevelPre) preTokenize(pieces []text) []text {
	var split []text
	for _, p := range pieces {
		if len(p.s) == 0 {
			continue
		}
		if bl.prefixSpace && p.s[0] != ' ' {
			b := builder{text{make([]byte, 0, len(p.s)+1), make([]span, 0, len(p.s)+1)}}
			b.addString(" ", p.firstRune())
			b.copyFrom(p, 0, len(p.s))
			p = b.t
		}
		if bl.regex {
			split = splitByMatches(split, p, gpt2Matcher{}.findAll(p.s), splitIsolated, false)
		} else {
			split = append(split, p)
		}
	}
	// One buffer for every piece's bytes: at most 2 bytes a byte.
	total := 0
	for _, p := range split {
		total += len(p.s)
	}
	b := builder{text{make([]byte, 0, 2*total), make([]span, 0, 2*total)}}
	out := make([]text, len(split))
	for i, p := range split {
		start := len(b.t.s)
		byteLevel(&b, p)
		out[i] = b.t.slice(start, len(b.t.s))
	}
	return out
}
