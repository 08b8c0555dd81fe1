package jinja

// builder makes the values a render builds (strings, lists, dicts,
// scopes, and the methods of strings, lists and dicts), each charged to
// the render's budget before it is made: the budget keeps the account,
// the builder spends it.
type builder struct{ b *budget }

// appendItem appends v to l, within the budget: the list's size is
// checked, and its growth charged as it is made (it doubles, up to
// MaxBytes), and what v boxes.
func (bd builder) appendItem(l *List, v Value) error {
	n := len(l.Items)
	if err := bd.b.listSize(int64(n) + 1); err != nil {
		return err
	}
	if !l.extends(1) {
		items, err := bd.listArray(l.Items, int64(n)+1)
		if err != nil {
			return err
		}
		l.Items, l.tail = items, &listTail{n: n, b: bd.b}
	}
	if err := bd.b.grow(boxBytes(v)); err != nil {
		return err
	}
	l.Items = append(l.Items, v)
	if l.tail != nil {
		l.tail.n++
	}
	return nil
}

// listArray is a new array for a list of n items (n checked), holding
// items, charged: it has room for twice as many, up to MaxBytes, so that
// a list grown an item at a time is copied a bounded number of times.
func (bd builder) listArray(items []Value, n int64) ([]Value, error) {
	c := min(max(2*n, 4), max(bd.b.lim.MaxBytes/valueBytes, n))
	if err := bd.b.build(c * valueBytes); err != nil {
		return nil, err
	}
	a := make([]Value, len(items), c)
	copy(a, items)
	return a, nil
}

// own makes l's items its own, copying them (charged) where its array is
// shared: before it is changed in place.
func (bd builder) own(l *List) error {
	if l.tail == nil || !l.tail.shared {
		return nil
	}
	items, err := bd.listArray(l.Items, int64(len(l.Items)))
	if err != nil {
		return err
	}
	l.Items, l.tail = items, &listTail{n: len(items), b: bd.b}
	return nil
}

// setKey sets d's key to v, within the budget: a new key is charged its
// entry, and v what it boxes. A dict grows by at most MaxBytes / 24 keys.
func (bd builder) setKey(d *Dict, key string, v Value) error {
	n := boxBytes(v)
	if _, ok := d.Data[key]; !ok {
		if err := bd.b.listSize(int64(d.Len()) + 1); err != nil {
			return err
		}
		n += dictEntryBytes
		if d.Len() == 0 {
			n += dictFirstBytes - dictEntryBytes
		}
	}
	if err := bd.b.grow(n); err != nil {
		return err
	}
	d.Set(key, v)
	return nil
}

// newDict is an empty dict, charged.
func (bd builder) newDict() (Value, error) {
	if err := bd.b.grow(dictBytes); err != nil {
		return Undefined(), err
	}
	return NewDict(), nil
}

// newScope is a scope under parent, charged.
func (bd builder) newScope(parent *scope) (*scope, error) {
	if err := bd.b.grow(scopeBytes); err != nil {
		return nil, err
	}
	return newScope(parent), nil
}

// setVar sets s's name to v, within the budget: a name past the scope's
// first eight is charged its entry, and v what it boxes.
func (bd builder) setVar(s *scope, name string, v Value) error {
	n := boxBytes(v)
	if _, ok := s.vars[name]; !ok && len(s.vars) >= scopeInline {
		n += dictEntryBytes
	}
	if err := bd.b.grow(n); err != nil {
		return err
	}
	s.set(name, v)
	return nil
}
