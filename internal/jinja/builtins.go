package jinja

import (
	"fmt"
	"math"
	"strings"
	"time"
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
	return builder{b}.dictOf(kwargs)
}

// dictOf is a dict of kwargs, charged.
func (bd builder) dictOf(kwargs map[string]Value) (Value, error) {
	d, err := bd.newDict()
	if err != nil {
		return Undefined(), err
	}
	dict := d.AsDict()
	for k, v := range kwargs {
		if err := bd.setKey(dict, k, v); err != nil {
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
	return builder{b}.dictOf(kwargs)
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
