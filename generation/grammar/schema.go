package grammar

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// JSONOptions tune the JSON text a constraint allows.
type JSONOptions struct {
	// MaxWhitespace bounds the whitespace (spaces, tabs, newlines) in a
	// row between two JSON tokens, so that a model cannot loop on it: 0
	// means DefaultMaxWhitespace, a negative value allows none.
	MaxWhitespace int
}

// DefaultMaxWhitespace is enough for JSON pretty-printed a few levels
// deep.
const DefaultMaxWhitespace = 12

// annotations are schema keywords that constrain nothing.
var annotations = []string{"title", "description", "default", "examples", "$schema", "$id", "$comment",
	"deprecated", "readOnly", "writeOnly", "$defs", "definitions"}

// keywordsByType are the constraint keywords supported, by the type they
// constrain.
var keywordsByType = map[string][]string{
	"object": {"properties", "required", "additionalProperties"},
	"array":  {"items", "minItems", "maxItems"},
	"string": {"minLength", "maxLength", "pattern", "format"},
	"number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
}

var combinators = []string{"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"}

// FromJSONSchema is the constraint that the output is JSON valid against
// schema, with the default options. The subset supported (what OpenAI's
// structured outputs accept): type (one or a list), properties, required,
// additionalProperties (false, true or a schema), items, minItems,
// maxItems, enum, const, anyOf, oneOf (as anyOf), allOf of one schema,
// $ref to a fragment of the same document ("#", "#/$defs/x", recursion
// included), minLength, maxLength, pattern, format date, time,
// date-time, uuid, email and ipv4, and minimum, maximum,
// exclusiveMinimum, exclusiveMaximum on integers (not on numbers);
// annotations (title, description, default, ...) are ignored. Any other keyword is refused with an error
// naming it and its JSON pointer. Properties are written in the schema's
// order, the optional ones possibly skipped; extra members, where allowed,
// come after them.
func FromJSONSchema(schema []byte) (*Grammar, error) {
	return FromJSONSchemaWith(schema, JSONOptions{})
}

// FromJSONSchemaWith is FromJSONSchema with options.
func FromJSONSchemaWith(schema []byte, o JSONOptions) (*Grammar, error) {
	root, err := parseJSON(schema)
	if err != nil {
		return nil, err
	}
	sc := newSchemaCompiler(root, o)
	r, err := sc.refRule("#", "")
	if err != nil {
		return nil, err
	}
	return sc.finish(call(r))
}

// JSONObject is the constraint that the output is a JSON object (OpenAI's
// json_object mode), with the default options.
func JSONObject() *Grammar {
	sc := newSchemaCompiler(nil, JSONOptions{})
	g, err := sc.finish(call(sc.anyObject()))
	if err != nil {
		panic(err) // the generic grammar always builds
	}
	return g
}

type schemaCompiler struct {
	b      builder
	root   *jvalue
	ws     *expr
	refs   map[string]int // $ref -> its rule
	shared map[string]int // rules made once per grammar
}

func newSchemaCompiler(root *jvalue, o JSONOptions) *schemaCompiler {
	n := o.MaxWhitespace
	if n == 0 {
		n = DefaultMaxWhitespace
	}
	ws := eps()
	if n > 0 {
		ws = rep(anyOfBytes(" \t\n\r"), 0, n)
	}
	return &schemaCompiler{root: root, ws: ws, refs: map[string]int{}, shared: map[string]int{}}
}

// finish builds the grammar whose root is leading whitespace, then value.
func (sc *schemaCompiler) finish(value *expr) (*Grammar, error) {
	r := sc.b.rule("root")
	sc.b.define(r, seq(sc.ws, value))
	return sc.b.build(r)
}

// at is a JSON pointer as errors show it.
func at(path string) string {
	if path == "" {
		return "/"
	}
	return path
}

func pointerPart(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// sharedRule is the rule named name, defined by body the first time.
func (sc *schemaCompiler) sharedRule(name string, body func() *expr) int {
	if r, ok := sc.shared[name]; ok {
		return r
	}
	r := sc.b.rule(name)
	sc.shared[name] = r
	sc.b.define(r, body())
	return r
}

func (sc *schemaCompiler) refRule(ref, path string) (int, error) {
	if r, ok := sc.refs[ref]; ok {
		return r, nil
	}
	target, ok := resolvePointer(sc.root, ref)
	if !ok {
		return 0, fmt.Errorf("grammar: $ref %q at %s: only a fragment of the same schema that exists is supported", ref, at(path))
	}
	r := sc.b.rule("$ref " + ref)
	sc.refs[ref] = r
	e, err := sc.schema(target, strings.TrimPrefix(ref, "#"))
	if err != nil {
		return 0, err
	}
	sc.b.define(r, e)
	return r, nil
}

// schema is the expression for the JSON text of a value valid against v.
func (sc *schemaCompiler) schema(v *jvalue, path string) (*expr, error) {
	switch v.kind {
	case 'b':
		if v.truth {
			return call(sc.anyValue()), nil
		}
		return nil, fmt.Errorf("grammar: schema false at %s allows nothing", at(path))
	case 'o':
	default:
		return nil, fmt.Errorf("grammar: schema at %s is not an object", at(path))
	}
	var constraints []string
	for _, k := range v.keys {
		switch {
		case slices.Contains(annotations, k):
		case slices.Contains(combinators, k) || isTypeKeyword(k):
			constraints = append(constraints, k)
		default:
			return nil, fmt.Errorf("grammar: unsupported keyword %q at %s", k, at(path))
		}
	}
	alone := func(k string) error {
		for _, c := range constraints {
			if c != k {
				return fmt.Errorf("grammar: keyword %q beside %q at %s is not supported", c, k, at(path))
			}
		}
		return nil
	}
	switch {
	case v.get("const") != nil:
		return lit(v.get("const").encode()), nil
	case v.get("enum") != nil:
		enum := v.get("enum")
		if enum.kind != 'a' || len(enum.vals) == 0 {
			return nil, fmt.Errorf("grammar: enum at %s is not a non-empty array", at(path))
		}
		alts := make([]*expr, len(enum.vals))
		for i, e := range enum.vals {
			alts[i] = lit(e.encode())
		}
		return alt(alts...), nil
	case v.get("$ref") != nil:
		if err := alone("$ref"); err != nil {
			return nil, err
		}
		ref := v.get("$ref")
		if ref.kind != 's' {
			return nil, fmt.Errorf("grammar: $ref at %s is not a string", at(path))
		}
		r, err := sc.refRule(ref.str, path)
		if err != nil {
			return nil, err
		}
		return call(r), nil
	}
	for _, k := range []string{"anyOf", "oneOf", "allOf"} {
		list := v.get(k)
		if list == nil {
			continue
		}
		if err := alone(k); err != nil {
			return nil, err
		}
		if list.kind != 'a' || len(list.vals) == 0 {
			return nil, fmt.Errorf("grammar: %s at %s is not a non-empty array", k, at(path))
		}
		if k == "allOf" && len(list.vals) > 1 {
			return nil, fmt.Errorf("grammar: unsupported keyword %q (of more than one schema) at %s", k, at(path))
		}
		alts := make([]*expr, len(list.vals))
		for i, sub := range list.vals {
			var err error
			if alts[i], err = sc.schema(sub, path+"/"+k+"/"+strconv.Itoa(i)); err != nil {
				return nil, err
			}
		}
		return alt(alts...), nil
	}
	types, err := schemaTypes(v, path)
	if err != nil {
		return nil, err
	}
	if types == nil {
		return call(sc.anyValue()), nil
	}
	alts := make([]*expr, 0, len(types))
	for _, t := range types {
		e, err := sc.typed(v, t, path)
		if err != nil {
			return nil, err
		}
		alts = append(alts, e)
	}
	return alt(alts...), nil
}

func isTypeKeyword(k string) bool {
	for _, ks := range keywordsByType {
		if slices.Contains(ks, k) {
			return true
		}
	}
	return false
}

// schemaTypes is the types v allows: its type keyword, else those its
// keywords constrain, else nil (any value).
func schemaTypes(v *jvalue, path string) ([]string, error) {
	t := v.get("type")
	if t == nil {
		var types []string
		for _, name := range []string{"object", "array", "string", "number"} {
			for _, k := range keywordsByType[name] {
				if v.get(k) != nil && !slices.Contains(types, name) {
					types = append(types, name)
				}
			}
		}
		return types, nil
	}
	var names []string
	switch t.kind {
	case 's':
		names = []string{t.str}
	case 'a':
		for _, it := range t.vals {
			if it.kind != 's' {
				return nil, fmt.Errorf("grammar: type at %s lists a non-string", at(path))
			}
			names = append(names, it.str)
		}
	default:
		return nil, fmt.Errorf("grammar: type at %s is neither a string nor a list", at(path))
	}
	for _, n := range names {
		switch n {
		case "object", "array", "string", "integer", "number", "boolean", "null":
		default:
			return nil, fmt.Errorf("grammar: unsupported type %q at %s/type", n, path)
		}
	}
	return names, nil
}

// typed is the expression for a value of type t valid against v.
func (sc *schemaCompiler) typed(v *jvalue, t, path string) (*expr, error) {
	switch t {
	case "object":
		return sc.object(v, path)
	case "array":
		return sc.array(v, path)
	case "string":
		return sc.str(v, path)
	case "integer":
		lo, hi, bounded, err := intBounds(v, path)
		if err != nil || !bounded {
			return call(sc.integer()), err
		}
		name := fmt.Sprintf("integer[%d,%d]", lo, hi)
		return call(sc.sharedRule(name, func() *expr { return intRange(lo, hi) })), nil
	case "number":
		for _, k := range keywordsByType["number"] {
			if v.get(k) != nil {
				return nil, fmt.Errorf("grammar: unsupported keyword %q on a number (supported on integers) at %s", k, at(path))
			}
		}
		return call(sc.number()), nil
	case "boolean":
		return alt(lit("true"), lit("false")), nil
	}
	return lit("null"), nil
}

// count is the non-negative integer keyword k of v, or def.
func count(v *jvalue, k, path string, def int) (int, error) {
	n := v.get(k)
	if n == nil {
		return def, nil
	}
	i, err := strconv.Atoi(n.num.String())
	if n.kind != 'n' || err != nil || i < 0 {
		return 0, fmt.Errorf("grammar: %s at %s is not a non-negative integer", k, at(path))
	}
	if i > maxRepeat {
		return 0, fmt.Errorf("grammar: %s %d at %s is above the supported %d", k, i, at(path), maxRepeat)
	}
	return i, nil
}
