package jinja

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// =============================================================================
// String methods
// =============================================================================

func (bd builder) stringMethod(obj Value, method string) (Value, error) {
	s := obj.AsString()
	b := bd.b

	switch method {
	case "strip", "lstrip", "rstrip":
		return bd.makeStringFunc(method, func(args []Value, kwargs map[string]Value) (Value, error) {
			if err := b.scan(len(s)); err != nil {
				return Undefined(), err
			}
			if len(args) > 0 {
				chars, err := b.print(args[0])
				if err != nil {
					return Undefined(), err
				}
				if err := b.scan(len(chars)); err != nil {
					return Undefined(), err
				}
				switch method {
				case "strip":
					return NewString(strings.Trim(s, chars)), nil
				case "lstrip":
					return NewString(strings.TrimLeft(s, chars)), nil
				}
				return NewString(strings.TrimRight(s, chars)), nil
			}
			switch method {
			case "strip":
				return NewString(strings.TrimSpace(s)), nil
			case "lstrip":
				return NewString(strings.TrimLeftFunc(s, isStripSpace)), nil
			}
			return NewString(strings.TrimRightFunc(s, isStripSpace)), nil
		}), nil

	case "split":
		return bd.makeStringFunc("split", func(args []Value, kwargs map[string]Value) (Value, error) {
			if err := b.scan(len(s)); err != nil {
				return Undefined(), err
			}
			sep, fields := "", len(args) == 0
			if !fields {
				var err error
				if sep, err = b.print(args[0]); err != nil {
					return Undefined(), err
				}
			}
			return bd.split(s, sep, fields)
		}), nil

	case "startswith", "endswith":
		return bd.makeStringFunc(method, func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) == 0 {
				return NewBool(false), nil
			}
			fix, err := b.print(args[0])
			if err != nil {
				return Undefined(), err
			}
			if err := b.scan(len(fix)); err != nil {
				return Undefined(), err
			}
			if method == "startswith" {
				return NewBool(strings.HasPrefix(s, fix)), nil
			}
			return NewBool(strings.HasSuffix(s, fix)), nil
		}), nil

	case "replace":
		return bd.makeStringFunc("replace", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) < 2 {
				return NewString(s), nil
			}
			count := int64(-1)
			if len(args) > 2 {
				count = toInt64(args[2])
			}
			return bd.replace(s, args[0], args[1], count)
		}), nil

	case "upper":
		return bd.makeStringFunc("upper", func(args []Value, kwargs map[string]Value) (Value, error) {
			return bd.mapString(s, strings.ToUpper)
		}), nil

	case "lower":
		return bd.makeStringFunc("lower", func(args []Value, kwargs map[string]Value) (Value, error) {
			return bd.mapString(s, strings.ToLower)
		}), nil

	case "title":
		return bd.makeStringFunc("title", func(args []Value, kwargs map[string]Value) (Value, error) {
			return bd.mapString(s, func(s string) string {
				// Simple title case: capitalize first letter of each word.
				runes := []rune(s)
				inWord := false
				for i, r := range runes {
					if r == ' ' || r == '\t' || r == '\n' {
						inWord = false
					} else if !inWord {
						runes[i] = []rune(strings.ToUpper(string(r)))[0]
						inWord = true
					}
				}
				return string(runes)
			})
		}), nil

	case "capitalize":
		return bd.makeStringFunc("capitalize", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(s) == 0 {
				return NewString(""), nil
			}
			return bd.mapString(s, func(s string) string {
				runes := []rune(s)
				runes[0] = []rune(strings.ToUpper(string(runes[0])))[0]
				return string(runes)
			})
		}), nil

	case "count", "find":
		return bd.makeStringFunc(method, func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) == 0 {
				if method == "count" {
					return NewInt(0), nil
				}
				return NewInt(-1), nil
			}
			sub, err := b.print(args[0])
			if err != nil {
				return Undefined(), err
			}
			if err := b.scan(len(s) + len(sub)); err != nil {
				return Undefined(), err
			}
			if method == "count" {
				return NewInt(int64(strings.Count(s, sub))), nil
			}
			return NewInt(int64(strings.Index(s, sub))), nil
		}), nil

	case "format":
		return bd.makeStringFunc("format", func(args []Value, kwargs map[string]Value) (Value, error) {
			result := NewString(s)
			for i, arg := range args {
				var err error
				placeholder := NewString(fmt.Sprintf("{%d}", i))
				if result, err = bd.replace(result.AsString(), placeholder, arg, -1); err != nil {
					return Undefined(), err
				}
				if result, err = bd.replace(result.AsString(), NewString("{}"), arg, 1); err != nil {
					return Undefined(), err
				}
			}
			return result, nil
		}), nil
	}

	return Undefined(), nil
}

func isStripSpace(r rune) bool { return r == ' ' || r == '\t' || r == '\n' || r == '\r' }

// split is s split at sep (strings.Split's parts), or into its fields
// (strings.Fields'), a list of the parts built directly: each is an item
// and a string's header (its bytes are s's), charged before it is built.
func (bd builder) split(s, sep string, fields bool) (Value, error) {
	var n int
	switch {
	case fields:
		n = countFields(s)
	case sep == "":
		n = utf8.RuneCountInString(s)
	default:
		n = strings.Count(s, sep) + 1
	}
	if err := bd.b.listOf(int64(n), partItemBytes-valueBytes); err != nil {
		return Undefined(), err
	}
	items := make([]Value, 0, n)
	switch {
	case fields:
		start := -1
		for i, r := range s {
			switch {
			case unicode.IsSpace(r) && start >= 0:
				items = append(items, NewString(s[start:i]))
				start = -1
			case !unicode.IsSpace(r) && start < 0:
				start = i
			}
		}
		if start >= 0 {
			items = append(items, NewString(s[start:]))
		}
	case sep == "": // each UTF-8 sequence, as strings.Split
		for len(s) > 0 {
			_, size := utf8.DecodeRuneInString(s)
			items = append(items, NewString(s[:size]))
			s = s[size:]
		}
	default:
		for {
			before, after, ok := strings.Cut(s, sep)
			items = append(items, NewString(before))
			if !ok {
				break
			}
			s = after
		}
	}
	return NewList(items), nil
}

// countFields is len(strings.Fields(s)), without building them.
func countFields(s string) int {
	n, in := 0, false
	for _, r := range s {
		if unicode.IsSpace(r) {
			in = false
		} else if !in {
			in = true
			n++
		}
	}
	return n
}

// replace is s with old replaced by new, count times (every time when
// negative), its size checked before it is built.
func (bd builder) replace(s string, oldV, newV Value, count int64) (Value, error) {
	old, err := bd.b.print(oldV)
	if err != nil {
		return Undefined(), err
	}
	repl, err := bd.b.print(newV)
	if err != nil {
		return Undefined(), err
	}
	if err := bd.b.scan(len(s) + len(old)); err != nil {
		return Undefined(), err
	}
	n := int64(strings.Count(s, old)) // an empty old matches before every code point and at the end
	if count >= 0 && count < n {
		n = count
	}
	if n == 0 {
		return NewString(s), nil
	}
	if err := bd.b.str(int64(len(s)) + n*(int64(len(repl))-int64(len(old)))); err != nil {
		return Undefined(), err
	}
	return NewString(strings.Replace(s, old, repl, int(n))), nil
}

// mapString is f(s), for an f whose result is at most three times as long
// (case mappings: a code point grows by half at most, an invalid byte
// becomes U+FFFD's three), its size checked once built.
func (bd builder) mapString(s string, f func(string) string) (Value, error) {
	if err := bd.b.str(int64(len(s))); err != nil {
		return Undefined(), err
	}
	r := f(s)
	if err := bd.b.str(int64(len(r))); err != nil {
		return Undefined(), err
	}
	return NewString(r), nil
}

func (bd builder) makeStringFunc(name string, fn func([]Value, map[string]Value) (Value, error)) Value {
	return NewCallable("str."+name, fn)
}

// =============================================================================
// List methods
// =============================================================================

func (bd builder) listMethod(obj Value, method string) (Value, error) {
	list := obj.AsList()
	b := bd.b

	switch method {
	case "append":
		return NewCallable("list.append", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) > 0 {
				// The size is checked and the growth charged; the
				// evaluation that called it was the step.
				if err := bd.appendItem(list, args[0]); err != nil {
					return Undefined(), err
				}
			}
			return None(), nil
		}), nil

	case "pop":
		return NewCallable("list.pop", func(args []Value, kwargs map[string]Value) (Value, error) {
			if list.Len() == 0 {
				return Undefined(), fmt.Errorf("pop from empty list")
			}
			idx := list.Len() - 1
			if len(args) > 0 {
				i, ok := index(toInt64(args[0]), list.Len())
				if !ok {
					return Undefined(), fmt.Errorf("pop index out of range")
				}
				idx = i
			}
			if err := b.step(int64(list.Len()-idx) * valueBytes >> 6); err != nil {
				return Undefined(), err
			}
			val := list.Items[idx]
			if idx < list.Len()-1 { // but the last, items move
				if err := bd.own(list); err != nil {
					return Undefined(), err
				}
			}
			list.Items = append(list.Items[:idx], list.Items[idx+1:]...)
			if list.tail != nil && !list.tail.shared { // the array's alone: its room is the list's
				list.tail.n = list.Len()
			}
			return val, nil
		}), nil

	case "insert":
		return NewCallable("list.insert", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) < 2 {
				return None(), nil
			}
			// The items moved along, a step per 64 bytes of them.
			if err := b.step(int64(list.Len()) * valueBytes >> 6); err != nil {
				return Undefined(), err
			}
			i := toInt64(args[0])
			if i < 0 {
				i += int64(list.Len())
			}
			idx := int(min(max(i, 0), int64(list.Len())))
			if idx < list.Len() {
				if err := bd.own(list); err != nil {
					return Undefined(), err
				}
			}
			if err := bd.appendItem(list, args[1]); err != nil {
				return Undefined(), err
			}
			copy(list.Items[idx+1:], list.Items[idx:])
			list.Items[idx] = args[1]
			return None(), nil
		}), nil
	}

	return Undefined(), nil
}

// =============================================================================
// Dict methods
// =============================================================================

func (bd builder) dictMethod(obj Value, method string) (Value, error) {
	d := obj.AsDict()
	b := bd.b

	switch method {
	case "items":
		return NewCallable("dict.items", func(args []Value, kwargs map[string]Value) (Value, error) {
			return bd.dictItems(d)
		}), nil

	case "keys", "values":
		return NewCallable("dict."+method, func(args []Value, kwargs map[string]Value) (Value, error) {
			each := int64(0) // the values are the dict's; the keys are boxed anew
			if method == "keys" {
				each = stringBoxBytes
			}
			if err := b.listOf(int64(d.Len()), each); err != nil {
				return Undefined(), err
			}
			items := make([]Value, 0, d.Len())
			for _, key := range d.Keys {
				if method == "keys" {
					items = append(items, NewString(key))
				} else {
					items = append(items, d.Data[key])
				}
			}
			return NewList(items), nil
		}), nil

	case "get":
		return NewCallable("dict.get", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) == 0 {
				return Undefined(), nil
			}
			key, err := b.print(args[0])
			if err != nil {
				return Undefined(), err
			}
			if v, ok := d.Get(key); ok {
				return v, nil
			}
			if len(args) > 1 {
				return args[1], nil
			}
			return None(), nil
		}), nil

	case "pop":
		return NewCallable("dict.pop", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) == 0 {
				return Undefined(), nil
			}
			key, err := b.print(args[0])
			if err != nil {
				return Undefined(), err
			}
			v, ok := d.Get(key)
			if ok {
				if err := b.list(int64(d.Len())); err != nil {
					return Undefined(), err
				}
				delete(d.Data, key)
				newKeys := make([]string, 0, len(d.Keys)-1)
				for _, k := range d.Keys {
					if k != key {
						newKeys = append(newKeys, k)
					}
				}
				d.Keys = newKeys
				return v, nil
			}
			if len(args) > 1 {
				return args[1], nil
			}
			return Undefined(), nil
		}), nil

	case "update":
		return NewCallable("dict.update", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) > 0 && args[0].IsDict() {
				other := args[0].AsDict()
				if err := b.listSize(int64(d.Len()) + int64(other.Len())); err != nil {
					return Undefined(), err
				}
				if err := b.step(int64(other.Len()) * valueBytes >> 6); err != nil {
					return Undefined(), err
				}
				for _, key := range other.Keys {
					if err := bd.setKey(d, key, other.Data[key]); err != nil {
						return Undefined(), err
					}
				}
			}
			return None(), nil
		}), nil
	}

	return Undefined(), nil
}

// dictItems is d's (key, value) pairs.
func (bd builder) dictItems(d *Dict) (Value, error) {
	// Each pair is an item, and a list of two: its header, its items,
	// and its key's box.
	if err := bd.b.listOf(int64(d.Len()), pairBytes); err != nil {
		return Undefined(), err
	}
	items := make([]Value, 0, d.Len())
	for _, key := range d.Keys {
		items = append(items, NewList([]Value{NewString(key), d.Data[key]}))
	}
	return NewList(items), nil
}
