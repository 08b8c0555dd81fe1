package grammar

import (
	"slices"
	"unicode/utf8"
)

// byteSet is a set of bytes, bit b of word b/64.
type byteSet [4]uint64

func (s *byteSet) add(b byte) { s[b>>6] |= 1 << (b & 63) }
func (s *byteSet) addRange(lo, hi byte) {
	for c := int(lo); c <= int(hi); c++ {
		s.add(byte(c))
	}
}

// exprOp is the kind of an expr node.
type exprOp uint8

const (
	opEmpty exprOp = iota // matches the empty string
	opNone                // matches nothing
	opByte                // one byte of set
	opSeq                 // subs one after the other
	opAlt                 // any one of subs
	opRep                 // subs[0] between min and max times (max < 0: unbounded)
	opCall                // the rule numbered rule
	opGraph               // the paths of graph from its first node to its last
)

// expr is a node of a rule's body: a regular expression whose symbols
// are bytes and calls to rules.
type expr struct {
	op       exprOp
	set      byteSet
	subs     []*expr
	min, max int
	rule     int
	graph    *graph
}

// graph is an expression as a graph whose edges match expressions: what
// a regular expression would spell with its parts copied many times (the
// members of an object, optional ones skipped, written once each).
type graph struct {
	nodes int // node 0 is the first, nodes-1 the last
	edges []graphEdge
}

type graphEdge struct {
	from, to int
	e        *expr // nil: an empty move
}

func eps() *expr  { return &expr{op: opEmpty} }
func none() *expr { return &expr{op: opNone} }

func byteIn(set byteSet) *expr { return &expr{op: opByte, set: set} }

func byteRange(lo, hi byte) *expr {
	var s byteSet
	s.addRange(lo, hi)
	return byteIn(s)
}

// anyOfBytes matches one byte among chars.
func anyOfBytes(chars string) *expr {
	var s byteSet
	for i := 0; i < len(chars); i++ {
		s.add(chars[i])
	}
	return byteIn(s)
}

// lit matches the bytes of s.
func lit(s string) *expr {
	subs := make([]*expr, len(s))
	for i := 0; i < len(s); i++ {
		subs[i] = byteRange(s[i], s[i])
	}
	return seq(subs...)
}

func seq(subs ...*expr) *expr {
	if len(subs) == 1 {
		return subs[0]
	}
	return &expr{op: opSeq, subs: subs}
}

func alt(subs ...*expr) *expr {
	if len(subs) == 0 {
		return none()
	}
	if len(subs) == 1 {
		return subs[0]
	}
	return &expr{op: opAlt, subs: subs}
}

func rep(e *expr, min, max int) *expr { return &expr{op: opRep, subs: []*expr{e}, min: min, max: max} }
func opt(e *expr) *expr               { return rep(e, 0, 1) }
func star(e *expr) *expr              { return rep(e, 0, -1) }
func call(rule int) *expr             { return &expr{op: opCall, rule: rule} }

// runeRange is an inclusive range of code points.
type runeRange struct{ lo, hi rune }

// normRanges sorts and merges rs, clipped to valid code points.
func normRanges(rs []runeRange) []runeRange {
	out := make([]runeRange, 0, len(rs))
	for _, r := range rs {
		r.lo, r.hi = max(r.lo, 0), min(r.hi, utf8.MaxRune)
		if r.lo <= r.hi {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b runeRange) int { return int(a.lo - b.lo) })
	merged := out[:0]
	for _, r := range out {
		if n := len(merged); n > 0 && r.lo <= merged[n-1].hi+1 {
			merged[n-1].hi = max(merged[n-1].hi, r.hi)
			continue
		}
		merged = append(merged, r)
	}
	return merged
}

// subtractRanges is rs without the code points of cut (both normalized).
func subtractRanges(rs, cut []runeRange) []runeRange {
	var out []runeRange
	for _, r := range rs {
		lo := r.lo
		for _, c := range cut {
			if c.hi < lo || c.lo > r.hi {
				continue
			}
			if c.lo > lo {
				out = append(out, runeRange{lo, c.lo - 1})
			}
			lo = c.hi + 1
		}
		if lo <= r.hi {
			out = append(out, runeRange{lo, r.hi})
		}
	}
	return out
}

// utf8Expr matches the UTF-8 encoding of one code point in rs (surrogates
// excluded): an alternation of byte-range sequences.
func utf8Expr(rs []runeRange) *expr {
	var alts []*expr
	for _, r := range normRanges(rs) {
		alts = appendUTF8(alts, r.lo, r.hi)
	}
	return alt(alts...)
}

// appendUTF8 splits [lo, hi] into ranges whose encodings differ only
// byte by byte within a range, each becoming a sequence of byte ranges.
func appendUTF8(alts []*expr, lo, hi rune) []*expr {
	if lo > hi {
		return alts
	}
	if lo <= 0xDFFF && hi >= 0xD800 { // surrogates have no UTF-8 form
		alts = appendUTF8(alts, lo, 0xD7FF)
		return appendUTF8(alts, 0xE000, hi)
	}
	for _, m := range [...]rune{0x7F, 0x7FF, 0xFFFF} { // split by encoded length
		if lo <= m && hi > m {
			alts = appendUTF8(alts, lo, m)
			return appendUTF8(alts, m+1, hi)
		}
	}
	if hi <= 0x7F {
		return append(alts, byteRange(byte(lo), byte(hi)))
	}
	for i := 1; i < utf8.RuneLen(lo); i++ {
		m := rune(1)<<(6*i) - 1
		if lo&^m != hi&^m {
			if lo&m != 0 {
				alts = appendUTF8(alts, lo, lo|m)
				return appendUTF8(alts, (lo|m)+1, hi)
			}
			if hi&m != m {
				alts = appendUTF8(alts, lo, (hi&^m)-1)
				return appendUTF8(alts, hi&^m, hi)
			}
		}
	}
	a, b := utf8.AppendRune(nil, lo), utf8.AppendRune(nil, hi)
	subs := make([]*expr, len(a))
	for i := range a {
		subs[i] = byteRange(a[i], b[i])
	}
	return append(alts, seq(subs...))
}

// jsonCharExpr matches one code point of rs written inside a JSON string:
// raw UTF-8 where JSON allows it, else its escape.
func jsonCharExpr(rs []runeRange) *expr {
	rs = normRanges(rs)
	mustEscape := []runeRange{{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}
	alts := []*expr{utf8Expr(subtractRanges(rs, mustEscape))}
	short := map[rune]string{'"': `\"`, '\\': `\\`, '\n': `\n`, '\t': `\t`, '\r': `\r`, '\b': `\b`, '\f': `\f`}
	const hex = "0123456789abcdef"
	for _, r := range rs {
		for c := r.lo; c <= r.hi && c <= '\\'; c++ {
			if c >= 0x20 && c != '"' && c != '\\' {
				continue
			}
			if s, ok := short[c]; ok {
				alts = append(alts, lit(s))
			} else {
				alts = append(alts, lit(`\u00`+string(hex[c>>4])+string(hex[c&15])))
			}
		}
	}
	return alt(alts...)
}
