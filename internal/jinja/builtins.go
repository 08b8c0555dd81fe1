package jinja

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// cachedBuiltins is a read-only scope populated once with all built-in
// globals and filters. It is shared across every render — no code path
// writes to the builtins scope (only chained reads through parent
// links and lookupFilter), so a single shared instance is safe and
// avoids ~20 allocations per render.
var cachedBuiltins = func() *scope {
	s := newScope(nil)
	registerGlobals(s)
	registerFilters(s)
	return s
}()

// builtinFunc is a built-in global or filter: it charges what it does to
// the render's budget.
type builtinFunc = func(b *budget, args []Value, kwargs map[string]Value) (Value, error)

// =============================================================================
// Global functions
// =============================================================================

func registerGlobals(s *scope) {
	for name, fn := range map[string]builtinFunc{
		"namespace":       builtinNamespace,
		"raise_exception": builtinRaiseException,
		"range":           builtinRange,
		"joiner":          builtinJoiner,
		"dict":            builtinDict,
		"cycler":          builtinCycler,
		"strftime_now":    builtinStrftimeNow,
	} {
		s.set(name, newBuiltin(name, fn))
	}
}

func builtinNamespace(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	return b.dictOf(kwargs)
}

// dictOf is a dict of kwargs, charged.
func (b *budget) dictOf(kwargs map[string]Value) (Value, error) {
	d, err := b.newDict()
	if err != nil {
		return Undefined(), err
	}
	dict := d.AsDict()
	for k, v := range kwargs {
		if err := b.setKey(dict, k, v); err != nil {
			return Undefined(), err
		}
	}
	return d, nil
}

func builtinRaiseException(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return Undefined(), fmt.Errorf("raise_exception: missing message")
	}
	msg, err := b.print(args[0])
	if err != nil {
		return Undefined(), err
	}
	return Undefined(), fmt.Errorf("%s", msg)
}

// builtinRange is range(stop), range(start, stop) or range(start, stop,
// step). Its length is known, and checked, before any of it is built.
func builtinRange(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	start, step, count, err := rangeOf(b, args)
	if err != nil {
		return Undefined(), err
	}
	if err := b.listOf(count, numberBoxBytes); err != nil {
		return Undefined(), err
	}

	items := make([]Value, count)
	for i := range items {
		items[i] = NewInt(start + int64(i)*step)
	}
	return NewList(items), nil
}

// rangeOf is range's first item, its step and its count, the count
// checked as a list's (a loop over a range does not build it, but is
// bounded as if it did).
func rangeOf(b *budget, args []Value) (start, step, count int64, err error) {
	var stop int64
	switch len(args) {
	case 1:
		start = 0
		stop = toInt64(args[0])
		step = 1
	case 2:
		start = toInt64(args[0])
		stop = toInt64(args[1])
		step = 1
	case 3:
		start = toInt64(args[0])
		stop = toInt64(args[1])
		step = toInt64(args[2])
	default:
		return 0, 0, 0, fmt.Errorf("range: expected 1-3 arguments, got %d", len(args))
	}

	if step == 0 {
		return 0, 0, 0, fmt.Errorf("range: step must not be zero")
	}

	// The count, in uint64: stop-start may not fit an int64.
	var n uint64
	switch {
	case step > 0 && start < stop:
		n = (uint64(stop)-uint64(start)-1)/uint64(step) + 1
	case step < 0 && start > stop:
		n = (uint64(start)-uint64(stop)-1)/(uint64(-(step+1))+1) + 1
	}
	if n > math.MaxInt64 {
		n = math.MaxInt64
	}
	if err := b.listSize(int64(n)); err != nil {
		return 0, 0, 0, err
	}
	return start, step, int64(n), nil
}

func builtinJoiner(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	sep := ""
	if len(args) > 0 {
		var err error
		if sep, err = b.print(args[0]); err != nil {
			return Undefined(), err
		}
	}

	if err := b.grow(callableBytes); err != nil {
		return Undefined(), err
	}
	first := true
	return NewCallable("joiner", func(args []Value, kwargs map[string]Value) (Value, error) {
		if first {
			first = false
			return NewString(""), nil
		}
		return NewString(sep), nil
	}), nil
}

func builtinDict(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	return b.dictOf(kwargs)
}

func builtinStrftimeNow(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	format := "%Y-%m-%d"
	if len(args) > 0 {
		var err error
		if format, err = b.print(args[0]); err != nil {
			return Undefined(), err
		}
	}

	// Convert Python strftime format to Go time format. Each is a few
	// times its format's length at most ("%B": "September").
	if err := b.str(int64(len(format)) * 5); err != nil {
		return Undefined(), err
	}
	now := time.Now()
	goFmt := strftimeToGo(format)
	return NewString(now.Format(goFmt)), nil
}

// strftimeToGo converts a Python strftime format string to a Go time format.
func strftimeToGo(format string) string {
	r := strings.NewReplacer(
		"%Y", "2006",
		"%m", "01",
		"%d", "02",
		"%H", "15",
		"%M", "04",
		"%S", "05",
		"%B", "January",
		"%b", "Jan",
		"%A", "Monday",
		"%a", "Mon",
		"%p", "PM",
		"%I", "03",
		"%Z", "MST",
		"%%", "%",
	)
	return r.Replace(format)
}

func builtinCycler(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return Undefined(), fmt.Errorf("cycler: expected at least one argument")
	}

	// Its items, a dict of three and two callables.
	if err := b.list(int64(len(args))); err != nil {
		return Undefined(), err
	}
	if err := b.grow(dictBytes + 3*dictEntryBytes + 2*callableBytes); err != nil {
		return Undefined(), err
	}
	idx := 0
	items := make([]Value, len(args))
	copy(items, args)

	d := NewDict()
	dict := d.AsDict()
	dict.Set("current", items[0])
	dict.Set("next", NewCallable("cycler.next", func(a []Value, kw map[string]Value) (Value, error) {
		v := items[idx]
		idx = (idx + 1) % len(items)
		dict.Set("current", items[idx])
		return v, nil
	}))
	dict.Set("reset", NewCallable("cycler.reset", func(a []Value, kw map[string]Value) (Value, error) {
		idx = 0
		dict.Set("current", items[0])
		return None(), nil
	}))

	return d, nil
}

// =============================================================================
// Filter functions
// =============================================================================

func registerFilters(s *scope) {
	filters := map[string]builtinFunc{
		"tojson":     filterTojson,
		"from_json":  filterFromjson,
		"fromjson":   filterFromjson,
		"items":      filterItems,
		"join":       filterJoin,
		"default":    filterDefault,
		"d":          filterDefault,
		"trim":       filterTrim,
		"lower":      filterLower,
		"upper":      filterUpper,
		"title":      filterTitle,
		"capitalize": filterCapitalize,
		"first":      filterFirst,
		"last":       filterLast,
		"length":     filterLength,
		"count":      filterLength,
		"reverse":    filterReverse,
		"sort":       filterSort,
		"unique":     filterUnique,
		"list":       filterList,
		"int":        filterInt,
		"float":      filterFloatConv,
		"string":     filterString,
		"safe":       filterSafe,
		"replace":    filterReplace,
		"round":      filterRound,
		"abs":        filterAbs,
		"map":        filterMap,
		"select":     filterSelect,
		"reject":     filterReject,
		"selectattr": filterSelectattr,
		"rejectattr": filterRejectattr,
		"indent":     filterIndent,
		"wordcount":  filterWordcount,
		"escape":     filterEscape,
		"e":          filterEscape,
		"dictsort":   filterDictsort,
		"max":        filterMax,
		"min":        filterMin,
		"sum":        filterSum,
		"batch":      filterBatch,
	}

	for name, fn := range filters {
		s.set("__filter_"+name, newBuiltin(name, fn))
	}
}

// lookupFilter retrieves a filter callable from the scope chain.
func lookupFilter(s *scope, name string) (Value, bool) {
	return s.get("__filter_" + name)
}

// =============================================================================
// Test evaluation
// =============================================================================

func (b *budget) evalTest(name string, val Value, args []Value) (bool, error) {
	switch name {
	case "defined":
		return !val.IsUndefined(), nil
	case "undefined":
		return val.IsUndefined(), nil
	case "none":
		return val.IsNone(), nil
	case "boolean":
		return val.IsBool(), nil
	case "integer":
		return val.IsInt(), nil
	case "float":
		return val.IsFloat(), nil
	case "number":
		return val.IsNumber(), nil
	case "string":
		return val.IsString(), nil
	case "mapping":
		return val.IsDict(), nil
	case "iterable":
		return val.IsList() || val.IsDict() || val.IsString(), nil
	case "sequence":
		return val.IsList(), nil
	case "callable":
		return val.IsCallable(), nil
	case "true":
		return val.IsBool() && val.AsBool(), nil
	case "false":
		return val.IsBool() && !val.AsBool(), nil
	case "eq", "equalto", "==", "sameas":
		if len(args) < 1 {
			if name == "sameas" {
				return false, nil
			}
			return false, fmt.Errorf("test %q requires an argument", name)
		}
		return b.equal(val, args[0], 1)
	case "ne", "!=":
		if len(args) < 1 {
			return false, fmt.Errorf("test %q requires an argument", name)
		}
		eq, err := b.equal(val, args[0], 1)
		return !eq, err
	case "gt", "greaterthan", ">", "ge", ">=", "lt", "lessthan", "<", "le", "<=":
		if len(args) < 1 {
			return false, nil
		}
		c, err := b.compare(val, args[0])
		switch name {
		case "gt", "greaterthan", ">":
			return c > 0, err
		case "ge", ">=":
			return c >= 0, err
		case "lt", "lessthan", "<":
			return c < 0, err
		}
		return c <= 0, err
	case "in":
		if len(args) < 1 {
			return false, nil
		}
		return b.contains(args[0], val)
	case "odd":
		if val.IsInt() {
			return val.AsInt()%2 != 0, nil
		}
		return false, nil
	case "even":
		if val.IsInt() {
			return val.AsInt()%2 == 0, nil
		}
		return false, nil
	case "upper", "lower":
		if val.IsString() {
			s := val.AsString()
			if err := b.str(int64(len(s))); err != nil {
				return false, err
			}
			if name == "upper" {
				return s == strings.ToUpper(s), nil
			}
			return s == strings.ToLower(s), nil
		}
		return false, nil
	}

	return false, fmt.Errorf("unknown test %q", name)
}

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

func filterItems(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 || args[0].IsUndefined() {
		return NewList(nil), nil
	}

	// Python jinja2's |items filter raises TemplateError when applied to
	// anything that isn't a mapping, and several chat templates rely on
	// that error to bail out of an unsupported branch (e.g. when a
	// tool_call's `arguments` is a JSON string instead of an object).
	// Silently returning an empty list here let those templates render
	// invalid prompts. The wording deliberately matches Python jinja2 so
	// templates that surface this string get an identical message.
	if !args[0].IsDict() {
		//lint:ignore ST1005 message text mirrors Python jinja2 verbatim
		return Undefined(), fmt.Errorf("Can only get item pairs from a mapping.")
	}

	return b.dictItems(args[0].AsDict())
}

func filterJoin(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewString(""), nil
	}

	if !args[0].IsList() {
		s, err := b.print(args[0])
		return NewString(s), err
	}

	var err error
	sep := ""
	if len(args) > 1 {
		if sep, err = b.print(args[1]); err != nil {
			return Undefined(), err
		}
	}
	if s, ok := kwargs["d"]; ok {
		if sep, err = b.print(s); err != nil {
			return Undefined(), err
		}
	}

	attr := ""
	if a, ok := kwargs["attribute"]; ok {
		if attr, err = b.print(a); err != nil {
			return Undefined(), err
		}
	}

	list := args[0].AsList()
	if err := b.list(int64(list.Len())); err != nil {
		return Undefined(), err
	}
	parts := make([]string, list.Len())
	size := int64(0)
	for i, item := range list.Items {
		if attr != "" && item.IsDict() {
			v, ok := item.AsDict().Get(attr)
			if ok {
				item = v
			}
		}
		if parts[i], err = b.print(item); err != nil {
			return Undefined(), err
		}
		// The joined size is checked as it grows, before it is built.
		if size += int64(len(parts[i])) + int64(len(sep)); size > b.lim.MaxBytes {
			return Undefined(), b.str(size)
		}
	}
	if err := b.str(size); err != nil {
		return Undefined(), err
	}
	return NewString(strings.Join(parts, sep)), nil
}

func filterDefault(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return Undefined(), nil
	}

	val := args[0]
	defVal := NewString("")
	if len(args) > 1 {
		defVal = args[1]
	}

	boolean := false
	if len(args) > 2 && args[2].IsBool() {
		boolean = args[2].AsBool()
	} else if b, ok := kwargs["boolean"]; ok && b.IsBool() {
		boolean = b.AsBool()
	}

	if val.IsUndefined() {
		return defVal, nil
	}

	if boolean && !val.IsTruthy() {
		return defVal, nil
	}

	return val, nil
}

func filterTrim(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewString(""), nil
	}
	s, err := b.print(args[0])
	if err != nil {
		return Undefined(), err
	}
	if err := b.scan(len(s)); err != nil {
		return Undefined(), err
	}
	if len(args) > 1 {
		chars, err := b.print(args[1])
		if err != nil {
			return Undefined(), err
		}
		if err := b.scan(len(chars)); err != nil {
			return Undefined(), err
		}
		s = strings.Trim(s, chars)
	} else {
		s = strings.TrimSpace(s)
	}
	return NewString(s), nil
}

// stringFilter is a filter of its argument's text by f (whose result is
// at most three times as long: see mapString).
func stringFilter(f func(string) string) builtinFunc {
	return func(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
		if len(args) == 0 {
			return NewString(""), nil
		}
		s, err := b.print(args[0])
		if err != nil {
			return Undefined(), err
		}
		return b.mapString(s, f)
	}
}

var (
	filterLower = stringFilter(strings.ToLower)
	filterUpper = stringFilter(strings.ToUpper)
	filterTitle = stringFilter(func(s string) string {
		runes := []rune(s)
		inWord := false
		for i, r := range runes {
			if unicode.IsLetter(r) || unicode.IsDigit(r) {
				if !inWord {
					runes[i] = unicode.ToUpper(r)
					inWord = true
				} else {
					runes[i] = unicode.ToLower(r)
				}
			} else {
				inWord = false
			}
		}
		return string(runes)
	})
	filterCapitalize = stringFilter(func(s string) string {
		if len(s) == 0 {
			return ""
		}
		runes := []rune(s)
		runes[0] = unicode.ToUpper(runes[0])
		for i := 1; i < len(runes); i++ {
			runes[i] = unicode.ToLower(runes[i])
		}
		return string(runes)
	})
)

func filterFirst(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 || !args[0].IsList() {
		return Undefined(), nil
	}
	l := args[0].AsList()
	if l.Len() == 0 {
		return Undefined(), nil
	}
	return l.Get(0), nil
}

func filterLast(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 || !args[0].IsList() {
		return Undefined(), nil
	}
	l := args[0].AsList()
	if l.Len() == 0 {
		return Undefined(), nil
	}
	return l.Get(l.Len() - 1), nil
}

func filterLength(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewInt(0), nil
	}

	v := args[0]
	switch {
	case v.IsList():
		return NewInt(int64(v.AsList().Len())), nil
	case v.IsDict():
		return NewInt(int64(v.AsDict().Len())), nil
	case v.IsString():
		if err := b.scan(len(v.AsString())); err != nil {
			return Undefined(), err
		}
		return NewInt(int64(utf8.RuneCountInString(v.AsString()))), nil
	}

	return NewInt(0), nil
}

func filterReverse(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewList(nil), nil
	}

	v := args[0]
	if v.IsString() {
		// Its code points (4 bytes each), and its string.
		if err := b.str(int64(len(v.AsString()))); err != nil {
			return Undefined(), err
		}
		if err := b.build(4 * int64(utf8.RuneCountInString(v.AsString()))); err != nil {
			return Undefined(), err
		}
		runes := []rune(v.AsString())
		for i, j := 0, len(runes)-1; i < j; i, j = i+1, j-1 {
			runes[i], runes[j] = runes[j], runes[i]
		}
		return NewString(string(runes)), nil
	}

	if v.IsList() {
		src := v.AsList().Items
		if err := b.list(int64(len(src))); err != nil {
			return Undefined(), err
		}
		items := make([]Value, len(src))
		for i, item := range src {
			items[len(src)-1-i] = item
		}
		return NewList(items), nil
	}

	return v, nil
}

func filterSort(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 || !args[0].IsList() {
		return NewList(nil), nil
	}

	src := args[0].AsList().Items
	if err := b.list(int64(len(src))); err != nil {
		return Undefined(), err
	}
	items := make([]Value, len(src))
	copy(items, src)

	reverse := false
	if r, ok := kwargs["reverse"]; ok && r.IsBool() {
		reverse = r.AsBool()
	}

	// Every comparison is charged; once the budget is spent the rest
	// compare equal, for nothing, and the sort's error is the budget's.
	var err error
	sort.SliceStable(items, func(i, j int) bool {
		if err != nil {
			return false
		}
		var cmp int
		cmp, err = b.compare(items[i], items[j])
		if reverse {
			return cmp > 0
		}
		return cmp < 0
	})
	if err != nil {
		return Undefined(), err
	}

	return NewList(items), nil
}

func filterUnique(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 || !args[0].IsList() {
		return NewList(nil), nil
	}

	// The items kept, and a set of their texts (about 64 bytes a key).
	src := args[0].AsList().Items
	if err := b.listOf(int64(len(src)), 64); err != nil {
		return Undefined(), err
	}
	seen := make(map[string]bool)
	items := make([]Value, 0, len(src))
	for _, item := range src {
		key, err := b.print(item)
		if err != nil {
			return Undefined(), err
		}
		if !seen[key] {
			seen[key] = true
			items = append(items, item)
		}
	}

	return NewList(items), nil
}

func filterList(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewList(nil), nil
	}

	v := args[0]
	if v.IsList() {
		return v, nil
	}
	if v.IsString() {
		s := v.AsString()
		if err := b.scan(len(s)); err != nil {
			return Undefined(), err
		}
		if err := b.listOf(int64(utf8.RuneCountInString(s)), runeItemBytes-valueBytes); err != nil {
			return Undefined(), err
		}
		items := make([]Value, 0, utf8.RuneCountInString(s))
		for _, r := range s {
			items = append(items, NewString(string(r)))
		}
		return NewList(items), nil
	}

	if err := b.listOf(1, boxBytes(v)); err != nil {
		return Undefined(), err
	}
	return NewList([]Value{v}), nil
}

func filterInt(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewInt(0), nil
	}
	return NewInt(toInt64(args[0])), nil
}

func filterFloatConv(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewFloat(0), nil
	}
	return NewFloat(toFloat64(args[0])), nil
}

func filterString(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewString(""), nil
	}
	s, err := b.print(args[0])
	return NewString(s), err
}

func filterSafe(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewString(""), nil
	}
	return args[0], nil
}

func filterReplace(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) < 3 {
		return NewString(""), fmt.Errorf("replace: expected at least 3 arguments")
	}
	s, err := b.print(args[0])
	if err != nil {
		return Undefined(), err
	}

	count := int64(-1)
	if len(args) > 3 {
		count = toInt64(args[3])
	}
	if c, ok := kwargs["count"]; ok {
		count = toInt64(c)
	}

	return b.replace(s, args[1], args[2], count)
}

func filterRound(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewFloat(0), nil
	}

	precision := int64(0)
	if len(args) > 1 {
		precision = toInt64(args[1])
	}
	if p, ok := kwargs["precision"]; ok {
		precision = toInt64(p)
	}

	f := toFloat64(args[0])
	pow := math.Pow(10, float64(precision))
	rounded := math.Round(f*pow) / pow

	return NewFloat(rounded), nil
}

func filterAbs(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewInt(0), nil
	}

	v := args[0]
	if v.IsInt() {
		n := v.AsInt()
		if n < 0 {
			n = -n
		}
		return NewInt(n), nil
	}
	if v.IsFloat() {
		return NewFloat(math.Abs(v.AsFloat())), nil
	}

	return NewInt(0), nil
}

func filterMap(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 || !args[0].IsList() {
		return NewList(nil), nil
	}

	list := args[0].AsList()

	// map(attribute="name") form
	if attr, ok := kwargs["attribute"]; ok {
		attrName, err := b.print(attr)
		if err != nil {
			return Undefined(), err
		}
		defVal := Undefined()
		if d, ok := kwargs["default"]; ok {
			defVal = d
		}

		if err := b.list(int64(list.Len())); err != nil {
			return Undefined(), err
		}
		items := make([]Value, list.Len())
		for i, item := range list.Items {
			if item.IsDict() {
				v, found := item.AsDict().Get(attrName)
				if found {
					items[i] = v
				} else {
					items[i] = defVal
				}
			} else {
				items[i] = defVal
			}
		}
		return NewList(items), nil
	}

	// A copy: lists that shared an array would change each other.
	if err := b.list(int64(list.Len())); err != nil {
		return Undefined(), err
	}
	return NewList(slices.Clone(list.Items)), nil
}

// selectItems is the items of list (or of their attribute attr) whose
// test (their truth where testName is "") is keep.
func (b *budget) selectItems(list *List, testName string, testArgs []Value, attr *string, keep bool) (Value, error) {
	if err := b.list(int64(list.Len())); err != nil {
		return Undefined(), err
	}
	items := make([]Value, 0, list.Len())
	for _, item := range list.Items {
		if err := b.step(1); err != nil {
			return Undefined(), err
		}
		v := item
		if attr != nil {
			v = Undefined()
			if item.IsDict() {
				if av, ok := item.AsDict().Get(*attr); ok {
					v = av
				}
			}
		}
		var result bool
		if testName == "" {
			result = v.IsTruthy()
		} else {
			var err error
			if result, err = b.evalTest(testName, v, testArgs); err != nil {
				return Undefined(), err
			}
		}
		if result == keep {
			items = append(items, item)
		}
	}
	return NewList(items), nil
}

func filterSelect(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	return selectFilter(b, args, true)
}

func filterReject(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	return selectFilter(b, args, false)
}

func selectFilter(b *budget, args []Value, keep bool) (Value, error) {
	if len(args) == 0 || !args[0].IsList() {
		return NewList(nil), nil
	}
	testName := ""
	if len(args) > 1 && args[1].IsString() {
		testName = args[1].AsString()
	}
	var testArgs []Value
	if len(args) > 2 {
		testArgs = args[2:]
	}
	return b.selectItems(args[0].AsList(), testName, testArgs, nil, keep)
}

func filterSelectattr(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	return selectattrFilter(b, args, true)
}

func filterRejectattr(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	return selectattrFilter(b, args, false)
}

func selectattrFilter(b *budget, args []Value, keep bool) (Value, error) {
	if len(args) < 2 || !args[0].IsList() {
		return NewList(nil), nil
	}
	attrName, err := b.print(args[1])
	if err != nil {
		return Undefined(), err
	}
	testName := "" // the truth of the attribute
	if len(args) > 2 {
		if testName, err = b.print(args[2]); err != nil {
			return Undefined(), err
		}
		if testName == "truthy" {
			testName = ""
		}
	}
	var testArgs []Value
	if len(args) > 3 {
		testArgs = args[3:]
	}
	return b.selectItems(args[0].AsList(), testName, testArgs, &attrName, keep)
}

func filterIndent(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewString(""), nil
	}

	s, err := b.print(args[0])
	if err != nil {
		return Undefined(), err
	}
	width := int64(4)
	if len(args) > 1 {
		width = toInt64(args[1])
	}
	if w, ok := kwargs["width"]; ok {
		width = toInt64(w)
	}
	width = max(width, 0)

	indentFirst := false
	if len(args) > 2 {
		indentFirst = args[2].IsTruthy()
	}
	if f, ok := kwargs["first"]; ok {
		indentFirst = f.IsTruthy()
	}

	// The indented size, checked before it is built: every line that is
	// not empty grows by width. The lines are not split into a slice (4
	// MiB of newlines made 64 MiB of it): the text is read twice, and
	// written once, into a string of the size checked. A line costs time
	// besides its bytes: a step per four.
	if err := b.scan(len(s)); err != nil {
		return Undefined(), err
	}
	lines, grown := int64(0), int64(0)
	for rest, first := s, true; ; first = false {
		line, after, more := strings.Cut(rest, "\n")
		lines++
		if line != "" && (!first || indentFirst) {
			grown++
		}
		if !more {
			break
		}
		rest = after
	}
	if err := b.step(lines / 4); err != nil {
		return Undefined(), err
	}
	size := int64(len(s)) + mulSat(grown, width)
	if err := b.str(size); err != nil {
		return Undefined(), err
	}
	if grown == 0 { // nothing to indent (whatever the width)
		return NewString(s), nil
	}

	// width*grown fits the size checked: the pad does too.
	if err := b.build(width); err != nil {
		return Undefined(), err
	}
	pad := strings.Repeat(" ", int(width))
	var sb strings.Builder
	sb.Grow(int(size))
	for rest, first := s, true; ; first = false {
		line, after, more := strings.Cut(rest, "\n")
		if line != "" && (!first || indentFirst) {
			sb.WriteString(pad)
		}
		sb.WriteString(line)
		if !more {
			break
		}
		sb.WriteByte('\n')
		rest = after
	}
	return NewString(sb.String()), nil
}

func filterWordcount(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewInt(0), nil
	}
	s, err := b.print(args[0])
	if err != nil {
		return Undefined(), err
	}
	if err := b.scan(len(s)); err != nil {
		return Undefined(), err
	}
	return NewInt(int64(countFields(s))), nil
}

var htmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&#39;")

func filterEscape(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 {
		return NewString(""), nil
	}
	s, err := b.print(args[0])
	if err != nil {
		return Undefined(), err
	}
	// The escaped size, checked before it is built.
	if err := b.scan(len(s)); err != nil {
		return Undefined(), err
	}
	size := int64(len(s))
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '&', '"', '\'':
			size += 4
		case '<', '>':
			size += 3
		}
	}
	if err := b.str(size); err != nil {
		return Undefined(), err
	}
	return NewString(htmlEscaper.Replace(s)), nil
}

func filterDictsort(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 || !args[0].IsDict() {
		return NewList(nil), nil
	}

	d := args[0].AsDict()
	reverse := false
	if r, ok := kwargs["reverse"]; ok && r.IsBool() {
		reverse = r.AsBool()
	}

	// The keys (a string's header each), and a pair for each.
	if err := b.listOf(int64(len(d.Keys)), 16+pairBytes); err != nil {
		return Undefined(), err
	}
	keys := make([]string, len(d.Keys))
	copy(keys, d.Keys)

	var err error
	sort.SliceStable(keys, func(i, j int) bool {
		if err != nil {
			return false
		}
		if err = b.scan(64 + min(len(keys[i]), len(keys[j]))); err != nil {
			return false
		}
		if reverse {
			return keys[i] > keys[j]
		}
		return keys[i] < keys[j]
	})
	if err != nil {
		return Undefined(), err
	}

	items := make([]Value, len(keys))
	for i, key := range keys {
		items[i] = NewList([]Value{NewString(key), d.Data[key]})
	}

	return NewList(items), nil
}

// extreme is the list's largest item (sign 1) or its least (-1).
func extreme(b *budget, args []Value, sign int) (Value, error) {
	if len(args) == 0 || !args[0].IsList() {
		return Undefined(), nil
	}

	list := args[0].AsList()
	if list.Len() == 0 {
		return Undefined(), nil
	}

	best := list.Items[0]
	for _, item := range list.Items[1:] {
		c, err := b.compare(item, best)
		if err != nil {
			return Undefined(), err
		}
		if c*sign > 0 {
			best = item
		}
	}

	return best, nil
}

func filterMax(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	return extreme(b, args, 1)
}

func filterMin(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	return extreme(b, args, -1)
}

func filterSum(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) == 0 || !args[0].IsList() {
		return NewInt(0), nil
	}

	// A scan of the items.
	list := args[0].AsList()
	if err := b.step(int64(list.Len()) * valueBytes >> 6); err != nil {
		return Undefined(), err
	}
	var sumF float64
	isFloat := false

	for _, item := range list.Items {
		if item.IsFloat() {
			isFloat = true
			sumF += item.AsFloat()
		} else if item.IsInt() {
			sumF += float64(item.AsInt())
		}
	}

	if isFloat {
		return NewFloat(sumF), nil
	}
	return NewInt(int64(sumF)), nil
}

func filterBatch(b *budget, args []Value, kwargs map[string]Value) (Value, error) {
	if len(args) < 2 || !args[0].IsList() {
		return NewList(nil), nil
	}

	list := args[0].AsList()
	linecount := toInt64(args[1])
	if linecount <= 0 {
		return NewList(nil), nil
	}
	linecount = min(linecount, int64(list.Len()))
	if linecount == 0 { // an empty list
		return NewList(nil), nil
	}

	// The batches' items, and a list (an item and a header) for each:
	// at most one a batched item.
	if err := b.listOf(int64(list.Len()), valueBytes+listBytes); err != nil {
		return Undefined(), err
	}
	batches := make([]Value, 0, (int64(list.Len())+linecount-1)/linecount)
	for i := 0; i < list.Len(); i += int(linecount) {
		end := min(i+int(linecount), list.Len())
		batch := make([]Value, end-i)
		copy(batch, list.Items[i:end])
		batches = append(batches, NewList(batch))
	}

	return NewList(batches), nil
}

// =============================================================================
// Helpers
// =============================================================================

// maxNumberText is how much of a string toInt64 and toFloat64 read: a
// number in 64 bits is shorter, and a template must not have a long
// string read at every comparison for a step.
const maxNumberText = 64

func numberText(s string) string {
	if len(s) > maxNumberText {
		return s[:maxNumberText]
	}
	return s
}

func toInt64(v Value) int64 {
	switch {
	case v.IsInt():
		return v.AsInt()
	case v.IsFloat():
		return int64(v.AsFloat())
	case v.IsBool():
		if v.AsBool() {
			return 1
		}
		return 0
	case v.IsString():
		var n int64
		fmt.Sscanf(numberText(v.AsString()), "%d", &n)
		return n
	}
	return 0
}

func toFloat64(v Value) float64 {
	switch {
	case v.IsFloat():
		return v.AsFloat()
	case v.IsInt():
		return float64(v.AsInt())
	case v.IsBool():
		if v.AsBool() {
			return 1
		}
		return 0
	case v.IsString():
		var f float64
		fmt.Sscanf(numberText(v.AsString()), "%f", &f)
		return f
	}
	return 0
}
