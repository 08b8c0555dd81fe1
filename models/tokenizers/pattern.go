package tokenizers

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"regexp/syntax"
	"strings"
	"unicode/utf8"
)

// matcher finds the non-overlapping matches of a pattern, leftmost first,
// in time linear in the text.
type matcher interface {
	// findAll returns the byte ranges [start, end) of the matches in s.
	findAll(s []byte) [][2]int
	// minLen is the fewest bytes a match spans (0: it may match the
	// empty string).
	minLen() int
}

// patternConfig is a tokenizer.json pattern: {"String": "..."} or
// {"Regex": "..."}.
type patternConfig struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

// compilePattern builds a pattern's matcher. A string matches itself. A
// regex is Oniguruma syntax in tokenizer.json; it is run by Go's regexp
// (RE2: linear time, so no backtracking constructs), after translating
// Oniguruma's Unicode \s, \d and \w, which RE2 reads as ASCII. GPT-2's,
// Llama 3's and Qwen2's patterns, whose lookahead RE2 lacks, are matched
// by hand (gpt2Matcher, llama3Matcher).
func compilePattern(p patternConfig) (matcher, error) {
	switch {
	case p.String != nil && p.Regex == nil:
		if *p.String == "" {
			return nil, errors.New("an empty String pattern; want at least one character")
		}
		return literal(*p.String), nil
	case p.Regex != nil && p.String == nil:
		switch *p.Regex {
		case gpt2Pattern:
			return gpt2Matcher{}, nil
		case llama3Pattern:
			return llama3Matcher{digits: 3}, nil
		case qwen2Pattern:
			return llama3Matcher{digits: 1}, nil
		}
		src, err := translateRegex(*p.Regex)
		if err != nil {
			return nil, err
		}
		re, err := regexp.Compile(src)
		if err != nil {
			return nil, fmt.Errorf("the Regex pattern %q is not supported (RE2 syntax without lookaround or backreferences is): %v", *p.Regex, err)
		}
		return regexMatcher{re}, nil
	default:
		return nil, errors.New(`a pattern needs exactly one of "String" or "Regex"`)
	}
}

type literal string

func (l literal) findAll(s []byte) [][2]int {
	var out [][2]int
	for at := 0; at <= len(s)-len(l); {
		i := bytes.Index(s[at:], []byte(l))
		if i < 0 {
			break
		}
		out = append(out, [2]int{at + i, at + i + len(l)})
		at += i + len(l)
	}
	return out
}

type regexMatcher struct{ re *regexp.Regexp }

func (l literal) minLen() int { return len(l) }

func (m regexMatcher) minLen() int {
	re, err := syntax.Parse(m.re.String(), syntax.Perl)
	if err != nil {
		return 0
	}
	return minMatch(re.Simplify())
}

// minMatch is the fewest bytes re matches.
func minMatch(re *syntax.Regexp) int {
	switch re.Op {
	case syntax.OpLiteral:
		n := 0
		for _, r := range re.Rune {
			n += utf8.RuneLen(r)
		}
		return n
	case syntax.OpCharClass, syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		return 1
	case syntax.OpCapture:
		return minMatch(re.Sub[0])
	case syntax.OpPlus:
		return minMatch(re.Sub[0])
	case syntax.OpRepeat:
		return min(re.Min*minMatch(re.Sub[0]), 1<<20)
	case syntax.OpConcat:
		n := 0
		for _, sub := range re.Sub {
			n = min(n+minMatch(sub), 1<<20)
		}
		return n
	case syntax.OpAlternate:
		n := 1 << 20
		for _, sub := range re.Sub {
			n = min(n, minMatch(sub))
		}
		return n
	}
	return 0 // empty, star, quest, anchors and boundaries
}

func (m regexMatcher) findAll(s []byte) [][2]int {
	var out [][2]int
	for _, loc := range m.re.FindAllIndex(s, -1) {
		if loc[0] < loc[1] { // an empty match splits nothing
			out = append(out, [2]int{loc[0], loc[1]})
		}
	}
	return out
}

// unicodeSpace is Unicode's White_Space, which Oniguruma's \s matches.
const unicodeSpace = `\t\n\v\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}`

// translateRegex rewrites Oniguruma's Unicode shorthands for RE2 and
// refuses what RE2 would read differently.
func translateRegex(src string) (string, error) {
	shorthands := map[byte]string{
		's': unicodeSpace,
		'd': `\p{Nd}`,
		'w': `\p{L}\p{N}\p{M}\p{Pc}`,
	}
	var b strings.Builder
	inClass := false
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch {
		case c == '\\' && i+1 < len(src):
			n := src[i+1]
			i++
			lower := n | 0x20
			if set, ok := shorthands[lower]; ok {
				negated := n != lower
				switch {
				case !negated && inClass:
					b.WriteString(set)
				case !negated:
					b.WriteString("[" + set + "]")
				case inClass:
					return "", fmt.Errorf("the Regex pattern %q negates \\%c inside a class, which RE2 cannot; write the class out", src, n)
				default:
					b.WriteString("[^" + set + "]")
				}
				continue
			}
			b.WriteByte('\\')
			b.WriteByte(n)
		case c == '[' && !inClass:
			inClass = true
			b.WriteByte(c)
			// A ']' or '^]' right after '[' is a literal.
			if i+1 < len(src) && src[i+1] == '^' {
				b.WriteByte('^')
				i++
			}
			if i+1 < len(src) && src[i+1] == ']' {
				b.WriteString(`\]`)
				i++
			}
		case c == ']' && inClass:
			inClass = false
			b.WriteByte(c)
		case c == '[' && inClass:
			return "", fmt.Errorf("the Regex pattern %q nests character classes, which RE2 cannot", src)
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// splitBehavior is what a split does with the matches of its pattern.
type splitBehavior int

const (
	splitRemoved splitBehavior = iota
	splitIsolated
	splitMergedWithPrevious
	splitMergedWithNext
	splitContiguous
)

func parseBehavior(s string) (splitBehavior, error) {
	switch s {
	case "Removed":
		return splitRemoved, nil
	case "Isolated", "":
		return splitIsolated, nil
	case "MergedWithPrevious":
		return splitMergedWithPrevious, nil
	case "MergedWithNext":
		return splitMergedWithNext, nil
	case "Contiguous":
		return splitContiguous, nil
	}
	return 0, fmt.Errorf("behavior %q; want Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous", s)
}

// splitByMatches cuts t at matches (ordered, not overlapping) as behavior
// says, appending the non-empty pieces to out. With invert the matches are
// the pieces kept and what lies between them the delimiters.
func splitByMatches(out []text, t text, matches [][2]int, behavior splitBehavior, invert bool) []text {
	// Every stretch of t, delimiter or not, in order.
	type part struct {
		i, j  int
		delim bool
	}
	var parts []part
	at := 0
	for _, m := range matches {
		if at < m[0] {
			parts = append(parts, part{at, m[0], invert})
		}
		parts = append(parts, part{m[0], m[1], !invert})
		at = m[1]
	}
	if at < len(t.s) {
		parts = append(parts, part{at, len(t.s), invert})
	}
	emit := func(i, j int) []text {
		if i < j {
			out = append(out, t.slice(i, j))
		}
		return out
	}
	switch behavior {
	case splitRemoved:
		for _, p := range parts {
			if !p.delim {
				out = emit(p.i, p.j)
			}
		}
	case splitIsolated:
		for _, p := range parts {
			out = emit(p.i, p.j)
		}
	case splitMergedWithPrevious:
		start := 0
		for _, p := range parts {
			if p.delim {
				out = emit(start, p.j)
				start = p.j
			}
		}
		out = emit(start, len(t.s))
	case splitMergedWithNext:
		start := 0
		for _, p := range parts {
			if p.delim && start < p.i {
				out = emit(start, p.i)
				start = p.i
			}
		}
		out = emit(start, len(t.s))
	case splitContiguous:
		start := 0
		for k, p := range parts {
			if k > 0 && p.delim != parts[k-1].delim || k > 0 && !p.delim {
				out = emit(start, p.i)
				start = p.i
			}
		}
		out = emit(start, len(t.s))
	}
	return out
}
