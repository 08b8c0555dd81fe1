package tokenizers

import (
	"unicode"
	"unicode/utf8"
)

// gpt2Pattern is GPT-2's pre-tokenization regex, which ByteLevel applies
// (use_regex) and Split may name.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// gpt2Matcher matches gpt2Pattern by hand, in one pass: its lookahead
// (?!\S) is outside RE2. Its matches tile the text.
type gpt2Matcher struct{}

func (gpt2Matcher) minLen() int { return 1 }

func (gpt2Matcher) findAll(s []byte) [][2]int {
	var out [][2]int
	for i := 0; i < len(s); {
		j := gpt2Next(s, i)
		out = append(out, [2]int{i, j})
		i = j
	}
	return out
}

// gpt2Class is which of the pattern's runs a rune extends.
type gpt2Class int

const (
	gpt2Letter gpt2Class = iota
	gpt2Number
	gpt2Other
	gpt2Space
)

func classify(r rune) gpt2Class {
	switch {
	case unicode.IsLetter(r):
		return gpt2Letter
	case unicode.IsNumber(r):
		return gpt2Number
	case unicode.IsSpace(r):
		return gpt2Space
	}
	return gpt2Other
}

// gpt2Next is the end of the match that starts at i, trying the pattern's
// alternatives in order.
func gpt2Next(s []byte, i int) int {
	if s[i] == '\'' {
		for _, c := range [...]string{"s", "t", "re", "ve", "m", "ll", "d"} {
			if len(s)-i-1 >= len(c) && string(s[i+1:i+1+len(c)]) == c {
				return i + 1 + len(c)
			}
		}
	}
	start := i
	if s[i] == ' ' && i+1 < len(s) {
		if r, _ := utf8.DecodeRune(s[i+1:]); classify(r) != gpt2Space {
			start = i + 1 // " ?" takes the space
		}
	}
	r, n := utf8.DecodeRune(s[start:])
	class := classify(r)
	if class != gpt2Space {
		return runOf(s, start+n, class)
	}
	return spaceRunEnd(s, i, runOf(s, i+n, gpt2Space))
}

// spaceRunEnd is where \s+(?!\S)|\s+ ends a match of the whitespace run
// [i, j): the run but its last character, which goes with the word after
// it; the run whole at the text's end; a single space before a word.
func spaceRunEnd(s []byte, i, j int) int {
	if j == len(s) {
		return j
	}
	_, last := utf8.DecodeLastRune(s[i:j])
	if j-last > i {
		return j - last
	}
	return j
}

// runOf is the end of the run of class starting at i.
func runOf(s []byte, i int, class gpt2Class) int {
	for i < len(s) {
		r, n := utf8.DecodeRune(s[i:])
		if classify(r) != class {
			break
		}
		i += n
	}
	return i
}

// byteChars maps each byte to the printable rune GPT-2's byte-level
// alphabet writes it as: printable Latin-1 as itself, the rest from
// U+0100 on.
var byteChars = func() [256]rune {
	var m [256]rune
	n := 0
	for b := range 256 {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF {
			m[b] = rune(b)
		} else {
			m[b] = rune(256 + n)
			n++
		}
	}
	return m
}()

// byteLevel rewrites t's bytes in the byte-level alphabet, each char
// keeping its byte's span.
func byteLevel(b *builder, t text) {
	for i, c := range t.s {
		b.addRune(byteChars[c], t.al[i])
	}
}
