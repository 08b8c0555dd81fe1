package grammar

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Bounds on numbers, so that a model cannot loop on digits: an integer
// part of up to 19 digits (int64's), a fraction of up to 16, an exponent
// of up to 3.
const (
	maxIntDigits  = 19
	maxFracDigits = 16
	maxExpDigits  = 3
)

// formats are the string formats supported, as patterns over the
// string's characters. Dates stop at the 28th of February (no leap day).
var formats = map[string]string{
	"date":      dateRe,
	"time":      timeRe,
	"date-time": dateRe + "T" + timeRe,
	"uuid":      `[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`,
	"email":     `[A-Za-z0-9_+-]{1,20}(\.[A-Za-z0-9_+-]{1,20}){0,2}@[A-Za-z0-9]{1,20}(-[A-Za-z0-9]{1,20})?(\.[A-Za-z0-9]{1,20}(-[A-Za-z0-9]{1,20})?){0,3}\.[A-Za-z]{2,8}`,
	"ipv4":      `(` + octetRe + `\.){3}` + octetRe,
}

const (
	dateRe  = `[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))`
	timeRe  = `([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])`
	octetRe = `(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])`
)

func (sc *schemaCompiler) object(v *jvalue, path string) (*expr, error) {
	props := v.get("properties")
	if props != nil && props.kind != 'o' {
		return nil, fmt.Errorf("grammar: properties at %s is not an object", at(path))
	}
	required := map[string]bool{}
	if req := v.get("required"); req != nil {
		if req.kind != 'a' {
			return nil, fmt.Errorf("grammar: required at %s is not an array", at(path))
		}
		for _, it := range req.vals {
			if it.kind != 's' || props.get(it.str) == nil {
				return nil, fmt.Errorf("grammar: required at %s names %s, not in properties", at(path), it.encode())
			}
			required[it.str] = true
		}
	}
	var extra *expr // an extra member, or nil when none is allowed
	switch addl := v.get("additionalProperties"); {
	case addl == nil || addl.kind == 'b' && addl.truth:
		extra = call(sc.anyValue())
	case addl.kind == 'b':
	default:
		var err error
		if extra, err = sc.schema(addl, path+"/additionalProperties"); err != nil {
			return nil, err
		}
	}
	ws, comma := sc.ws, seq(lit(","), sc.ws)
	var members []*expr
	var optional []bool
	if props != nil {
		for i, k := range props.keys {
			val, err := sc.schema(props.vals[i], path+"/properties/"+pointerPart(k))
			if err != nil {
				return nil, err
			}
			members = append(members, seq(lit(jsonString(k)), ws, lit(":"), ws, val, ws))
			optional = append(optional, !required[k])
		}
	}
	// Node 2i+k: before member i, some member written (k = 1) or none
	// (k = 0); the last node is the end of the members.
	n := len(members)
	gr := &graph{nodes: 2*n + 3}
	end := 2*n + 2
	for i, m := range members {
		for k := range 2 {
			first := m
			if k == 1 {
				first = seq(comma, m)
			}
			gr.edges = append(gr.edges, graphEdge{2*i + k, 2*(i+1) + 1, first})
			if optional[i] {
				gr.edges = append(gr.edges, graphEdge{2*i + k, 2*(i+1) + k, nil})
			}
		}
	}
	if extra != nil {
		m := seq(call(sc.stringRule()), ws, lit(":"), ws, extra, ws)
		more := star(seq(comma, m))
		gr.edges = append(gr.edges, graphEdge{2 * n, end, opt(seq(m, more))}, graphEdge{2*n + 1, end, more})
	} else {
		gr.edges = append(gr.edges, graphEdge{2 * n, end, nil}, graphEdge{2*n + 1, end, nil})
	}
	r := sc.b.rule("object " + at(path))
	sc.b.define(r, seq(lit("{"), ws, &expr{op: opGraph, graph: gr}, lit("}")))
	return call(r), nil
}

func (sc *schemaCompiler) array(v *jvalue, path string) (*expr, error) {
	item := call(sc.anyValue())
	if items := v.get("items"); items != nil {
		var err error
		if item, err = sc.schema(items, path+"/items"); err != nil {
			return nil, err
		}
	}
	lo, err := count(v, "minItems", path, 0)
	if err != nil {
		return nil, err
	}
	hi, err := count(v, "maxItems", path, -1)
	if err != nil {
		return nil, err
	}
	if hi >= 0 && lo > hi {
		return nil, fmt.Errorf("grammar: minItems above maxItems at %s", at(path))
	}
	item = seq(item, sc.ws)
	more := seq(lit(","), sc.ws, item)
	upTo := func(n int) int { // n more items at most
		if hi < 0 {
			return -1
		}
		return n
	}
	var list *expr
	switch {
	case hi == 0:
		list = eps()
	case lo == 0:
		list = opt(seq(item, rep(more, 0, upTo(hi-1))))
	default:
		list = seq(item, rep(more, lo-1, upTo(hi-1)))
	}
	r := sc.b.rule("array " + at(path))
	sc.b.define(r, seq(lit("["), sc.ws, list, lit("]")))
	return call(r), nil
}

func (sc *schemaCompiler) str(v *jvalue, path string) (*expr, error) {
	lo, err := count(v, "minLength", path, 0)
	if err != nil {
		return nil, err
	}
	hi, err := count(v, "maxLength", path, -1)
	if err != nil {
		return nil, err
	}
	if hi >= 0 && lo > hi {
		return nil, fmt.Errorf("grammar: minLength above maxLength at %s", at(path))
	}
	bounded := lo > 0 || hi >= 0
	pattern, format := v.get("pattern"), v.get("format")
	switch {
	case pattern != nil && (format != nil || bounded):
		return nil, fmt.Errorf("grammar: pattern beside format, minLength or maxLength at %s is not supported", at(path))
	case format != nil && bounded:
		return nil, fmt.Errorf("grammar: format beside minLength or maxLength at %s is not supported", at(path))
	case pattern != nil:
		if pattern.kind != 's' {
			return nil, fmt.Errorf("grammar: pattern at %s is not a string", at(path))
		}
		return sc.stringOf("pattern "+pattern.str, pattern.str, true)
	case format != nil:
		re, ok := formats[format.str]
		if format.kind != 's' || !ok {
			return nil, fmt.Errorf("grammar: unsupported format %s at %s/format", format.encode(), path)
		}
		return sc.stringOf("format "+format.str, re, false)
	case bounded:
		name := "string{" + strconv.Itoa(lo) + "," + strconv.Itoa(hi) + "}"
		return call(sc.sharedRule(name, func() *expr {
			// Characters of the Basic Multilingual Plane: a bound then
			// means the same counted in code points (JSON Schema's
			// characters) and in UTF-16 units (JavaScript's validators,
			// zod's .max(n) among them, count a character past U+FFFF
			// as two).
			return seq(lit(`"`), rep(jsonChar(0xFFFF), lo, hi), lit(`"`))
		})), nil
	}
	return call(sc.stringRule()), nil
}

// stringOf is a rule for JSON strings whose content matches re.
func (sc *schemaCompiler) stringOf(name, re string, search bool) (*expr, error) {
	if r, ok := sc.shared[name]; ok {
		return call(r), nil
	}
	e, err := regexExpr(re, true, search)
	if err != nil {
		return nil, err
	}
	return call(sc.sharedRule(name, func() *expr { return seq(lit(`"`), e, lit(`"`)) })), nil
}

// jsonChar is one character of JSON string content up to code point
// most, raw or escaped; a \u escape is of a code point below U+10000
// other than a surrogate, so that every character counts one
// (minLength, maxLength).
func jsonChar(most rune) *expr {
	raw := utf8Expr([]runeRange{{0x20, '"' - 1}, {'"' + 1, '\\' - 1}, {'\\' + 1, most}})
	hex := anyOfBytes("0123456789abcdefABCDEF")
	u := alt(seq(anyOfBytes("0123456789abcefABCEF"), hex, hex, hex), seq(anyOfBytes("dD"), anyOfBytes("01234567"), hex, hex))
	esc := seq(lit(`\`), alt(anyOfBytes(`"\/bfnrt`), seq(lit("u"), u)))
	return alt(raw, esc)
}

func (sc *schemaCompiler) stringRule() int {
	return sc.sharedRule("string", func() *expr { return seq(lit(`"`), star(jsonChar(utf8.MaxRune)), lit(`"`)) })
}

func digits(lo, hi int) *expr { return rep(byteRange('0', '9'), lo, hi) }

func intExpr() *expr {
	return seq(opt(lit("-")), alt(lit("0"), seq(byteRange('1', '9'), digits(0, maxIntDigits-1))))
}

func (sc *schemaCompiler) integer() int { return sc.sharedRule("integer", intExpr) }

func (sc *schemaCompiler) number() int {
	return sc.sharedRule("number", func() *expr {
		frac := seq(lit("."), digits(1, maxFracDigits))
		exp := seq(anyOfBytes("eE"), opt(anyOfBytes("+-")), digits(1, maxExpDigits))
		return seq(intExpr(), opt(frac), opt(exp))
	})
}

func (sc *schemaCompiler) anyValue() int {
	return sc.sharedRule("value", func() *expr {
		return alt(call(sc.anyObject()), call(sc.anyArray()), call(sc.stringRule()), call(sc.number()),
			lit("true"), lit("false"), lit("null"))
	})
}

func (sc *schemaCompiler) anyObject() int {
	return sc.sharedRule("any object", func() *expr {
		ws := sc.ws
		m := seq(call(sc.stringRule()), ws, lit(":"), ws, call(sc.anyValue()), ws)
		return seq(lit("{"), ws, opt(seq(m, star(seq(lit(","), ws, m)))), lit("}"))
	})
}

func (sc *schemaCompiler) anyArray() int {
	return sc.sharedRule("any array", func() *expr {
		ws := sc.ws
		item := seq(call(sc.anyValue()), ws)
		return seq(lit("["), ws, opt(seq(item, star(seq(lit(","), ws, item)))), lit("]"))
	})
}
