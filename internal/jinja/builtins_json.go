package jinja

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// =============================================================================
// Filter implementations
// =============================================================================

func filterTojson(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewString(""), nil
	}

	enc := jsonEncoder{b: b, o: &out{b: b}, itemSep: ", ", keySep: ": "}
	if separators, ok := kwargs["separators"]; ok {
		if !separators.IsList() || separators.AsList().Len() != 2 {
			return Undefined(), fmt.Errorf("tojson: separators must contain two strings")
		}

		items := separators.AsList().Items
		if !items[0].IsString() || !items[1].IsString() {
			return Undefined(), fmt.Errorf("tojson: separators must contain two strings")
		}
		enc.itemSep = items[0].AsString()
		enc.keySep = items[1].AsString()
	}

	// indent, as Python's json.dumps: each item on a line of its own,
	// indented by level; the item separator loses its trailing space
	// unless separators were given. (The original encoded the indented
	// form with encoding/json, unbounded.)
	if indent, ok := kwargs["indent"]; ok && !indent.IsNone() && !indent.IsUndefined() {
		if indent.IsString() {
			enc.indent = indent.AsString()
		} else {
			n := max(toInt64(indent), 0)
			if err := b.str(n); err != nil {
				return Undefined(), err
			}
			enc.indent = strings.Repeat(" ", int(n))
		}
		enc.indented = true
		if _, ok := kwargs["separators"]; !ok {
			enc.itemSep = ","
		}
	}

	// Direct Value-tree encoder. Bypasses valueToGo's intermediate
	// map[string]any/[]any allocations and json.Marshal's reflection
	// path.
	if err := enc.encode(args[0], 1); err != nil {
		if enc.fatal(err) {
			return Undefined(), err
		}
		return NewString(""), nil // as the original: a NaN encodes as nothing
	}
	return NewString(enc.o.String()), nil
}

// jsonEncoder writes the JSON encoding of a value directly into its
// output, within the budget, without going through an intermediate
// Go-typed tree.
//
// The output matches Python json.dumps's defaults so that prompts rendered by
// this engine are byte-for-byte identical to those produced by HuggingFace's
// reference Jinja2 implementation:
//
//   - Item separator is ", " (with a trailing space), key/value separator is
//     ": " — Python's default when no indent is given.
//   - HTML metacharacters '&', '<', '>' are NOT escaped to \u0026 / \u003c /
//     \u003e (Go's encoding/json escapes these by default; Python does not).
//
// Both differences would otherwise change the tokenization of every tool
// definition that ends up in a chat prompt.
type jsonEncoder struct {
	b               *budget
	o               *out
	itemSep, keySep string
	indented        bool
	indent          string
}

// fatal reports whether err ends the render (the budget's), rather than
// the encoding (a NaN).
func (enc *jsonEncoder) fatal(err error) bool { return enc.b.err != nil && err == enc.b.err }

// newline starts a line indented level times, in the indented form.
func (enc *jsonEncoder) newline(level int) error {
	if !enc.indented {
		return nil
	}
	if err := enc.o.write("\n"); err != nil {
		return err
	}
	for range level {
		if err := enc.o.write(enc.indent); err != nil {
			return err
		}
	}
	return nil
}

func (enc *jsonEncoder) encode(v Value, depth int) error {
	if err := enc.b.nested(depth); err != nil {
		return err
	}
	o := enc.o
	switch v.kind {
	case KindUndefined, KindNone, KindCallable:
		return o.write("null")

	case KindBool:
		if v.AsBool() {
			return o.write("true")
		}
		return o.write("false")

	case KindInt:
		return o.write(strconv.FormatInt(v.AsInt(), 10))

	case KindFloat:
		f := v.AsFloat()
		if math.IsInf(f, 0) || math.IsNaN(f) {
			return fmt.Errorf("tojson: cannot encode %v", f)
		}
		return o.write(strconv.FormatFloat(f, 'g', -1, 64))

	case KindString:
		return enc.encodeString(v.AsString())

	case KindList:
		items := v.AsList().Items
		if err := o.write("["); err != nil {
			return err
		}
		if len(items) == 0 {
			return o.write("]")
		}
		for i, item := range items {
			if i > 0 {
				if err := o.write(enc.itemSep); err != nil {
					return err
				}
			}
			if err := enc.newline(depth); err != nil {
				return err
			}
			if err := enc.encode(item, depth+1); err != nil {
				return err
			}
		}
		if err := enc.newline(depth - 1); err != nil {
			return err
		}
		return o.write("]")

	case KindDict:
		d := v.AsDict()
		if err := o.write("{"); err != nil {
			return err
		}
		if len(d.Keys) == 0 {
			return o.write("}")
		}
		for i, key := range d.Keys {
			if i > 0 {
				if err := o.write(enc.itemSep); err != nil {
					return err
				}
			}
			if err := enc.newline(depth); err != nil {
				return err
			}
			if err := enc.encodeString(key); err != nil {
				return err
			}
			if err := o.write(enc.keySep); err != nil {
				return err
			}
			if err := enc.encode(d.Data[key], depth+1); err != nil {
				return err
			}
		}
		if err := enc.newline(depth - 1); err != nil {
			return err
		}
		return o.write("}")
	}

	return o.write("null")
}

// encodeString writes the JSON encoding of s without HTML-escaping (no
// \u0026 / \u003c / \u003e), matching Python json.dumps's default behaviour.
func (enc *jsonEncoder) encodeString(s string) error {
	// The encoding is at least s and its quotes: refused before it is
	// built where that is already too long. It is built twice (the
	// encoder's buffer, its string) before it is written.
	if err := enc.b.strSize(int64(enc.o.len()) + int64(len(s)) + 2); err != nil {
		return err
	}
	if err := enc.b.build(2 * (int64(len(s)) + 2)); err != nil {
		return err
	}
	var buf bytes.Buffer
	je := json.NewEncoder(&buf)
	je.SetEscapeHTML(false)
	if err := je.Encode(s); err != nil {
		return err
	}
	// json.Encoder.Encode appends a trailing newline; strip it.
	out := buf.Bytes()
	if n := len(out); n > 0 && out[n-1] == '\n' {
		out = out[:n-1]
	}
	return enc.o.write(string(out))
}

func filterFromjson(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 || !args[0].IsString() {
		return Undefined(), nil
	}

	// Decoding builds several times the text's size: charged so.
	s := args[0].AsString()
	if err := b.build(8 * int64(len(s))); err != nil {
		return Undefined(), err
	}
	var result any
	if err := json.Unmarshal([]byte(s), &result); err != nil {
		return Undefined(), fmt.Errorf("fromjson: %w", err)
	}
	// And the values made of it, which the template may keep.
	if err := b.grow(jsonValueBytes(result)); err != nil {
		return Undefined(), err
	}

	return FromGoValue(result), nil
}

// jsonValueBytes is what FromGoValue makes of a decoded JSON value: its
// lists, dicts and strings, as the budget charges them.
func jsonValueBytes(x any) int64 {
	switch x := x.(type) {
	case string:
		return stringBoxBytes + int64(len(x))
	case float64:
		return numberBoxBytes
	case []any:
		n := listBytes + int64(len(x))*valueBytes
		for _, item := range x {
			n += jsonValueBytes(item)
		}
		return n
	case map[string]any:
		n := int64(dictBytes)
		if len(x) > 0 {
			n += dictFirstBytes + int64(len(x)-1)*dictEntryBytes
		}
		for k, v := range x {
			n += int64(len(k)) + jsonValueBytes(v)
		}
		return n
	}
	return 0
}
