package grammar

import (
	"fmt"
	"regexp/syntax"
	"unicode"
	"unicode/utf8"
)

// maxRepeat bounds a counted repetition ({m,n}) in a pattern.
const maxRepeat = 1000

// FromRegex is the constraint that the whole output matches pattern
// (anchored at both ends whether or not it says ^ and $). The subset:
// literals and escapes, classes ([a-z], [^...], \d \w \s, ., Unicode
// classes), groups, alternation, ? * + {m,n}. Refused: word boundaries,
// and ^ or $ anywhere but at the ends.
func FromRegex(pattern string) (*Grammar, error) {
	e, err := regexExpr(pattern, false, false)
	if err != nil {
		return nil, err
	}
	var b builder
	r := b.rule("regex")
	b.define(r, e)
	return b.build(r)
}

// Choice is the constraint that the output is exactly one of options.
func Choice(options []string) (*Grammar, error) {
	if len(options) == 0 {
		return nil, fmt.Errorf("grammar: a choice needs at least one option")
	}
	alts := make([]*expr, len(options))
	for i, o := range options {
		alts[i] = lit(o)
	}
	var b builder
	r := b.rule("choice")
	b.define(r, alt(alts...))
	return b.build(r)
}

// regexExpr parses pattern. With inJSON the characters are written as
// JSON string content (escaped where JSON needs it), and the match is a
// search as JSON Schema's pattern is: a side without its anchor (^ or $)
// may have anything more on it.
func regexExpr(pattern string, inJSON, search bool) (*expr, error) {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return nil, fmt.Errorf("grammar: pattern %q: %w", pattern, err)
	}
	rc := regexCompiler{inJSON: inJSON}
	body, err := rc.expr(re, true, true)
	if err != nil {
		return nil, fmt.Errorf("grammar: pattern %q: %w", pattern, err)
	}
	if !search {
		return body, nil
	}
	anyChars := star(rc.char([]runeRange{{0, utf8.MaxRune}}))
	parts := []*expr{body}
	if !anchored(re, true) {
		parts = append([]*expr{anyChars}, parts...)
	}
	if !anchored(re, false) {
		parts = append(parts, anyChars)
	}
	return seq(parts...), nil
}

// anchored reports whether re begins (atStart) or ends with its anchor.
func anchored(re *syntax.Regexp, atStart bool) bool {
	switch re.Op {
	case syntax.OpBeginText, syntax.OpBeginLine:
		return atStart
	case syntax.OpEndText, syntax.OpEndLine:
		return !atStart
	case syntax.OpCapture:
		return anchored(re.Sub[0], atStart)
	case syntax.OpConcat:
		if len(re.Sub) == 0 {
			return false
		}
		if atStart {
			return anchored(re.Sub[0], true)
		}
		return anchored(re.Sub[len(re.Sub)-1], false)
	case syntax.OpAlternate:
		for _, s := range re.Sub {
			if !anchored(s, atStart) {
				return false
			}
		}
		return true
	}
	return false
}

type regexCompiler struct{ inJSON bool }

// char matches one code point of rs.
func (rc regexCompiler) char(rs []runeRange) *expr {
	if rc.inJSON {
		return jsonCharExpr(rs)
	}
	return utf8Expr(rs)
}

// expr lowers re; first and last say whether re may touch the start and
// the end of the pattern (where ^ and $ are allowed).
func (rc regexCompiler) expr(re *syntax.Regexp, first, last bool) (*expr, error) {
	switch re.Op {
	case syntax.OpNoMatch:
		return none(), nil
	case syntax.OpEmptyMatch:
		return eps(), nil
	case syntax.OpBeginText, syntax.OpBeginLine:
		if !first {
			return nil, fmt.Errorf("^ only at the start is supported")
		}
		return eps(), nil
	case syntax.OpEndText, syntax.OpEndLine:
		if !last {
			return nil, fmt.Errorf("$ only at the end is supported")
		}
		return eps(), nil
	case syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return nil, fmt.Errorf("word boundaries are not supported")
	case syntax.OpLiteral:
		subs := make([]*expr, len(re.Rune))
		for i, r := range re.Rune {
			rs := []runeRange{{r, r}}
			if re.Flags&syntax.FoldCase != 0 {
				for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
					rs = append(rs, runeRange{f, f})
				}
			}
			subs[i] = rc.char(rs)
		}
		return seq(subs...), nil
	case syntax.OpCharClass:
		var rs []runeRange
		for i := 0; i+1 < len(re.Rune); i += 2 {
			rs = append(rs, runeRange{re.Rune[i], re.Rune[i+1]})
		}
		return rc.char(rs), nil
	case syntax.OpAnyCharNotNL:
		return rc.char([]runeRange{{0, '\n' - 1}, {'\n' + 1, utf8.MaxRune}}), nil
	case syntax.OpAnyChar:
		return rc.char([]runeRange{{0, utf8.MaxRune}}), nil
	case syntax.OpCapture:
		return rc.expr(re.Sub[0], first, last)
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest:
		sub, err := rc.expr(re.Sub[0], false, false)
		if err != nil {
			return nil, err
		}
		switch re.Op {
		case syntax.OpStar:
			return star(sub), nil
		case syntax.OpPlus:
			return rep(sub, 1, -1), nil
		}
		return opt(sub), nil
	case syntax.OpRepeat:
		if re.Max > maxRepeat || re.Min > maxRepeat {
			return nil, fmt.Errorf("repetition {%d,%d} above %d", re.Min, re.Max, maxRepeat)
		}
		sub, err := rc.expr(re.Sub[0], false, false)
		if err != nil {
			return nil, err
		}
		return rep(sub, re.Min, re.Max), nil
	case syntax.OpConcat:
		subs := make([]*expr, len(re.Sub))
		for i, s := range re.Sub {
			var err error
			if subs[i], err = rc.expr(s, first && i == 0, last && i == len(re.Sub)-1); err != nil {
				return nil, err
			}
		}
		return seq(subs...), nil
	case syntax.OpAlternate:
		subs := make([]*expr, len(re.Sub))
		for i, s := range re.Sub {
			var err error
			if subs[i], err = rc.expr(s, first, last); err != nil {
				return nil, err
			}
		}
		return alt(subs...), nil
	}
	return nil, fmt.Errorf("unsupported construct %v", re.Op)
}
