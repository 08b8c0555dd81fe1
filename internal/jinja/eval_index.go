package jinja

import (
	"unicode/utf8"
)

func (e *evaluator) evalItem(n *itemExpr) (Value, error) {
	obj, err := e.evalExpr(n.obj)
	if err != nil {
		return Undefined(), err
	}

	key, err := e.evalExpr(n.key)
	if err != nil {
		return Undefined(), err
	}

	if obj.IsList() {
		list := obj.AsList()
		idx, ok := index(toInt64(key), list.Len())
		if !ok {
			return Undefined(), nil
		}
		return list.Get(idx), nil
	}

	if obj.IsDict() {
		k, err := e.b.print(key)
		if err != nil {
			return Undefined(), err
		}
		if v, ok := obj.AsDict().Get(k); ok {
			return v, nil
		}
		return Undefined(), nil
	}

	if obj.IsString() {
		// By code point, without converting the whole string to runes.
		s := obj.AsString()
		if err := e.b.scan(len(s)); err != nil {
			return Undefined(), err
		}
		idx, ok := index(toInt64(key), utf8.RuneCountInString(s))
		if !ok {
			return Undefined(), nil
		}
		for _, r := range s {
			if idx == 0 {
				return NewString(string(r)), nil
			}
			idx--
		}
		return Undefined(), nil
	}

	return Undefined(), nil
}

// index is i (negative from the end) as an index into length items, and
// whether it is one.
func index(i int64, length int) (int, bool) {
	if i < 0 {
		i += int64(length)
	}
	if i < 0 || i >= int64(length) {
		return 0, false
	}
	return int(i), true
}

func (e *evaluator) evalSlice(n *sliceExpr) (Value, error) {
	obj, err := e.evalExpr(n.obj)
	if err != nil {
		return Undefined(), err
	}

	if obj.IsList() {
		list := obj.AsList()
		length := list.Len()
		start, stop, step, err := resolveSlice(n, e, length)
		if err != nil {
			return Undefined(), err
		}
		count := sliceLen(start, stop, step)
		if count == 0 {
			return NewList(nil), nil
		}
		if err := e.b.list(int64(count)); err != nil {
			return Undefined(), err
		}
		// A single allocation of the exact size. Aliasing the source
		// slice would be unsafe because List.Append could later mutate
		// beyond Len() into the backing array.
		if step == 1 { // the common case (messages[1:])
			items := make([]Value, count)
			copy(items, list.Items[start:start+count])
			return NewList(items), nil
		}
		items := make([]Value, 0, count)
		for i := start; len(items) < count; i += step {
			items = append(items, list.Items[i])
		}
		return NewList(items), nil
	}

	if obj.IsString() {
		s := obj.AsString()
		if err := e.b.scan(len(s)); err != nil {
			return Undefined(), err
		}

		// ASCII fast path. Most chat-template string slicing operates
		// on tag/role names or message content that is ASCII; for those
		// we can index by byte and skip the []rune conversion entirely.
		if isASCII(s) {
			start, stop, step, err := resolveSlice(n, e, len(s))
			if err != nil {
				return Undefined(), err
			}
			count := sliceLen(start, stop, step)
			if step == 1 { // a substring: the string's own bytes
				return NewString(s[start : start+count]), nil
			}
			if err := e.b.build(2 * int64(count)); err != nil { // the bytes, and their string
				return Undefined(), err
			}
			buf := make([]byte, 0, count)
			for i := start; len(buf) < count; i += step {
				buf = append(buf, s[i])
			}
			return NewString(string(buf)), nil
		}

		// The code points (4 bytes each), the slice's, and its string (4
		// bytes a code point at most).
		if err := e.b.build(4 * int64(utf8.RuneCountInString(s))); err != nil {
			return Undefined(), err
		}
		runes := []rune(s)
		start, stop, step, err := resolveSlice(n, e, len(runes))
		if err != nil {
			return Undefined(), err
		}
		count := sliceLen(start, stop, step)
		if err := e.b.build(8 * int64(count)); err != nil {
			return Undefined(), err
		}
		result := make([]rune, 0, count)
		for i := start; len(result) < count; i += step {
			result = append(result, runes[i])
		}
		return NewString(string(result)), nil
	}

	return Undefined(), nil
}

// isASCII reports whether s contains only 7-bit ASCII bytes. Used to
// skip the []rune conversion in evalSlice's string branch when byte
// indexing produces the same result as code-point indexing.
func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// resolveSlice is the slice's start, stop and step over length items,
// clamped as Python's slice.indices clamps them: iterating from start by
// step up to (not including) stop stays within the items. (The original
// iterated over any range the template gave, indices past the end
// included: time without bound for [-10**18:10**18:2].)
func resolveSlice(n *sliceExpr, e *evaluator, length int) (int, int, int, error) {
	bound := func(x expr) (int64, bool, error) {
		if x == nil {
			return 0, false, nil
		}
		v, err := e.evalExpr(x)
		if err != nil {
			return 0, false, err
		}
		if v.IsNone() || v.IsUndefined() {
			return 0, false, nil
		}
		return toInt64(v), true, nil
	}
	st, hasStep, err := bound(n.step)
	if err != nil {
		return 0, 0, 0, err
	}
	if !hasStep || st == 0 {
		st = 1
	}
	st = max(min(st, int64(length)+1), -int64(length)-1) // beyond, one item at most: the same slice
	start, hasStart, err := bound(n.start)
	if err != nil {
		return 0, 0, 0, err
	}
	stop, hasStop, err := bound(n.stop)
	if err != nil {
		return 0, 0, 0, err
	}
	adjust := func(i int64, has bool, dflt int64) int64 {
		if !has {
			return dflt
		}
		if i < 0 {
			i += int64(length)
			if i < 0 {
				if st < 0 {
					return -1
				}
				return 0
			}
			return i
		}
		if i >= int64(length) {
			if st < 0 {
				return int64(length) - 1
			}
			return int64(length)
		}
		return i
	}
	if st > 0 {
		return int(adjust(start, hasStart, 0)), int(adjust(stop, hasStop, int64(length))), int(st), nil
	}
	return int(adjust(start, hasStart, int64(length)-1)), int(adjust(stop, hasStop, -1)), int(st), nil
}

// sliceLen is how many items a resolved slice takes.
func sliceLen(start, stop, step int) int {
	switch {
	case step > 0 && start < stop:
		return (stop - start + step - 1) / step
	case step < 0 && stop < start:
		return (start - stop - step - 1) / -step
	}
	return 0
}
