package jinja

import (
	"slices"
	"sort"
	"unicode/utf8"
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
