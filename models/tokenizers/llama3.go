package tokenizers

import (
	"unicode"
	"unicode/utf8"
)

// llama3Pattern and qwen2Pattern are Llama 3's and Qwen2's
// pre-tokenization regexes (their tokenizer.json's Split), which differ in
// how many digits a number's piece takes: up to 3, or 1.
const (
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// llama3Matcher matches llama3Pattern (digits 3) or qwen2Pattern (digits
// 1) by hand, in one pass, as gpt2Matcher does GPT-2's: the lookahead
// (?!\S) is outside RE2. Its matches tile the text.
type llama3Matcher struct{ digits int }

func (llama3Matcher) minLen() int { return 1 }

func (m llama3Matcher) findAll(s []byte) [][2]int {
	var out [][2]int
	for i := 0; i < len(s); {
		j := m.next(s, i)
		out = append(out, [2]int{i, j})
		i = j
	}
	return out
}

func isNewline(r rune) bool { return r == '\r' || r == '\n' }

// next is the end of the match that starts at i: the pattern's
// alternatives tried in order, the first that matches taken.
func (m llama3Matcher) next(s []byte, i int) int {
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if s[i] == '\'' {
		if n := contraction(s[i+1:]); n > 0 {
			return i + 1 + n
		}
	}
	r, n := utf8.DecodeRune(s[i:])
	class := classify(r)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if class == gpt2Letter {
		return runOf(s, i+n, gpt2Letter)
	}
	if class != gpt2Number && !isNewline(r) && i+n < len(s) {
		if r2, n2 := utf8.DecodeRune(s[i+n:]); classify(r2) == gpt2Letter {
			return runOf(s, i+n+n2, gpt2Letter)
		}
	}
	// \p{N}{1,3}
	if class == gpt2Number {
		j := i + n
		for k := 1; k < m.digits && j < len(s); k++ {
			r2, n2 := utf8.DecodeRune(s[j:])
			if classify(r2) != gpt2Number {
				break
			}
			j += n2
		}
		return j
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	start := i
	if r == ' ' && i+1 < len(s) {
		if r2, _ := utf8.DecodeRune(s[i+1:]); classify(r2) == gpt2Other {
			start = i + 1
		}
	}
	if r2, n2 := utf8.DecodeRune(s[start:]); classify(r2) == gpt2Other {
		j := runOf(s, start+n2, gpt2Other)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	// Whitespace from here (class is gpt2Space).
	j := runOf(s, i, gpt2Space)
	// \s*[\r\n]+: to the run's last newline.
	for k := j - 1; k >= i; k-- {
		if s[k] == '\r' || s[k] == '\n' {
			return k + 1
		}
	}
	return spaceRunEnd(s, i, j)
}

// contraction is the length of the contraction (?i:s|t|re|ve|m|ll|d)
// that b starts with, 0 for none. Case folds as Unicode folds it: ſ (long
// s, U+017F) is an s too.
func contraction(b []byte) int {
	for _, c := range [...]string{"s", "t", "re", "ve", "m", "ll", "d"} {
		n, ok := 0, true
		for k := range len(c) {
			r, size := utf8.DecodeRune(b[n:])
			if unicode.ToLower(r) != rune(c[k]) && !(c[k] == 's' && r == 'ſ') {
				ok = false
				break
			}
			n += size
		}
		if ok {
			return n
		}
	}
	return 0
}
