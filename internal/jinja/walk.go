package jinja

// Walks over values, within the budget (stepserve's fork; see doc.go): a
// template can build a list that holds itself ({{ l.append(l) }}) or one
// that holds another many times over, so printing, comparing or encoding
// a value charges a step per value visited and stops at MaxDepth, where
// the original recursed for ever (a fatal stack overflow) or for an
// exponential time.

import (
	"context"
	"strconv"
	"strings"
)

// scalarText is a scalar's template text, and whether v is one.
func scalarText(v Value) (string, bool) {
	switch v.kind {
	case KindUndefined, KindNone, KindCallable:
		return "", true
	case KindBool:
		if v.AsBool() {
			return "True", true
		}
		return "False", true
	case KindInt:
		return strconv.FormatInt(v.AsInt(), 10), true
	case KindFloat:
		return formatFloat(v.AsFloat()), true
	case KindString:
		return v.AsString(), true
	}
	return "", false
}

// formatFloat is %g, as the original printed floats.
func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// print is v's text in a template's output: a string as it is, nothing
// for none and undefined, a Python repr for a list or a dict.
func (b *budget) print(v Value) (string, error) {
	if s, ok := scalarText(v); ok {
		return s, nil
	}
	o := &out{b: b}
	if err := b.writeRepr(o, v, 1); err != nil {
		return "", err
	}
	return o.String(), nil
}

// writeRepr writes v's Python-style repr (strings quoted, as inside a
// list) to o, depth levels down.
func (b *budget) writeRepr(o *out, v Value, depth int) error {
	if err := b.nested(depth); err != nil {
		return err
	}
	switch v.kind {
	case KindUndefined:
		return o.write("Undefined")
	case KindNone:
		return o.write("None")
	case KindString:
		if err := o.write("'"); err != nil {
			return err
		}
		if err := o.write(v.AsString()); err != nil {
			return err
		}
		return o.write("'")
	case KindList:
		if err := o.write("["); err != nil {
			return err
		}
		for i, item := range v.AsList().Items {
			if i > 0 {
				if err := o.write(", "); err != nil {
					return err
				}
			}
			if err := b.writeRepr(o, item, depth+1); err != nil {
				return err
			}
		}
		return o.write("]")
	case KindDict:
		d := v.AsDict()
		if err := o.write("{"); err != nil {
			return err
		}
		for i, key := range d.Keys {
			if i > 0 {
				if err := o.write(", "); err != nil {
					return err
				}
			}
			for _, s := range []string{"'", key, "': "} {
				if err := o.write(s); err != nil {
					return err
				}
			}
			if err := b.writeRepr(o, d.Data[key], depth+1); err != nil {
				return err
			}
		}
		return o.write("}")
	case KindCallable:
		return o.write("<callable " + v.v.(Callable).Name + ">")
	}
	s, _ := scalarText(v)
	return o.write(s)
}

// reprLimits bound Value.String and Value.Equals, called outside a render.
var reprLimits = Limits{MaxSteps: 1 << 20, MaxBytes: 1 << 20, MaxDepth: 64}

// reprWithin is v's repr cut to about max bytes ("..." where it is cut).
func reprWithin(v Value, max int64) string {
	lim := reprLimits
	lim.MaxBytes = max
	b := newBudget(context.Background(), lim)
	o := &out{b: b}
	if err := b.writeRepr(o, v, 1); err != nil {
		return o.String() + "..."
	}
	return o.String()
}

// equal reports whether x and y hold the same value (Value.Equals).
func (b *budget) equal(x, y Value, depth int) (bool, error) {
	if err := b.nested(depth); err != nil {
		return false, err
	}
	if x.kind != y.kind {
		return false, nil
	}
	switch x.kind {
	case KindUndefined, KindNone:
		return true, nil
	case KindBool:
		return x.v.(bool) == y.v.(bool), nil
	case KindInt:
		return x.v.(int64) == y.v.(int64), nil
	case KindFloat:
		return x.v.(float64) == y.v.(float64), nil
	case KindString:
		xs, ys := x.v.(string), y.v.(string)
		if len(xs) != len(ys) {
			return false, nil
		}
		if err := b.scan(len(xs)); err != nil {
			return false, err
		}
		return xs == ys, nil
	case KindList:
		xl, yl := x.v.(*List), y.v.(*List)
		if xl.Len() != yl.Len() {
			return false, nil
		}
		for i := range xl.Items {
			if i >= yl.Len() { // y shrank while compared: cannot happen, but never index past it
				return false, nil
			}
			if eq, err := b.equal(xl.Items[i], yl.Items[i], depth+1); err != nil || !eq {
				return false, err
			}
		}
		return true, nil
	case KindDict:
		xd, yd := x.v.(*Dict), y.v.(*Dict)
		if xd.Len() != yd.Len() {
			return false, nil
		}
		for _, key := range xd.Keys {
			yv, ok := yd.Get(key)
			if !ok {
				return false, nil
			}
			if eq, err := b.equal(xd.Data[key], yv, depth+1); err != nil || !eq {
				return false, err
			}
		}
		return true, nil
	}
	return false, nil
}

// valuesEqual is ==: numbers compare across int and float.
func (b *budget) valuesEqual(x, y Value) (bool, error) {
	if x.IsNumber() && y.IsNumber() {
		return toFloat64(x) == toFloat64(y), nil
	}
	if x.IsNone() && y.IsNone() {
		return true, nil
	}
	return b.equal(x, y, 1)
}

// contains is item in container.
func (b *budget) contains(container, item Value) (bool, error) {
	switch {
	case container.IsList():
		for _, v := range container.AsList().Items {
			if eq, err := b.equal(v, item, 1); err != nil || eq {
				return eq, err
			}
		}
		return false, nil
	case container.IsDict() && item.IsString():
		return container.AsDict().Has(item.AsString()), nil
	case container.IsString() && item.IsString():
		if err := b.scan(len(container.AsString()) + len(item.AsString())); err != nil {
			return false, err
		}
		return strings.Contains(container.AsString(), item.AsString()), nil
	}
	return false, nil
}

// compare orders x and y: as numbers, then strings as strings.
func (b *budget) compare(x, y Value) (int, error) {
	if err := b.step(1); err != nil {
		return 0, err
	}
	xf, yf := toFloat64(x), toFloat64(y)
	if xf < yf {
		return -1, nil
	}
	if xf > yf {
		return 1, nil
	}
	if x.IsString() && y.IsString() {
		if err := b.scan(min(len(x.AsString()), len(y.AsString()))); err != nil {
			return 0, err
		}
		return strings.Compare(x.AsString(), y.AsString()), nil
	}
	return 0, nil
}
