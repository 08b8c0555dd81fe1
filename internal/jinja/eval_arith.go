package jinja

import (
	"math"
	"math/bits"
	"strings"
)

// =============================================================================
// Arithmetic helpers
// =============================================================================

func (bd builder) addValues(x, y Value) (Value, error) {
	if x.IsString() || y.IsString() {
		return bd.concat(x, y)
	}
	if x.IsList() && y.IsList() {
		return bd.concatLists(x.AsList(), y.AsList())
	}
	if x.IsFloat() || y.IsFloat() {
		return NewFloat(toFloat64(x) + toFloat64(y)), nil
	}
	return NewInt(toInt64(x) + toInt64(y)), nil
}

// concatLists is x + y, a new list: x's array extended in place where x
// may grow (see List.tail), the new list sharing it, y's items copied
// (a step per 64 bytes of them); else a new array with room to grow.
func (bd builder) concatLists(x, y *List) (Value, error) {
	n := int64(x.Len()) + int64(y.Len())
	if err := bd.b.listSize(n); err != nil {
		return Undefined(), err
	}
	if x.extendsFor(bd.b, y.Len()) {
		if err := bd.b.build(listBytes + int64(y.Len())*valueBytes); err != nil {
			return Undefined(), err
		}
		items := append(x.Items, y.Items...) // within its capacity: in place
		x.tail.n, x.tail.shared = len(items), true
		return Value{kind: KindList, v: &List{Items: items, tail: x.tail}}, nil
	}
	if err := bd.b.grow(listBytes); err != nil {
		return Undefined(), err
	}
	items, err := bd.listArray(x.Items, n)
	if err != nil {
		return Undefined(), err
	}
	items = append(items, y.Items...)
	return Value{kind: KindList, v: &List{Items: items, tail: &listTail{n: len(items), b: bd.b}}}, nil
}

// concat is x ~ y: their texts joined, its size checked before.
func (bd builder) concat(x, y Value) (Value, error) {
	xs, err := bd.b.print(x)
	if err != nil {
		return Undefined(), err
	}
	ys, err := bd.b.print(y)
	if err != nil {
		return Undefined(), err
	}
	if err := bd.b.str(int64(len(xs)) + int64(len(ys))); err != nil {
		return Undefined(), err
	}
	return NewString(xs + ys), nil
}

func subValues(a, b Value) Value {
	if a.IsFloat() || b.IsFloat() {
		return NewFloat(toFloat64(a) - toFloat64(b))
	}
	return NewInt(toInt64(a) - toInt64(b))
}

// mulValues is x * y: a string or a list repeated an int's times (either
// way round, as Python), its size checked before it is built; otherwise
// numbers.
func (bd builder) mulValues(x, y Value) (Value, error) {
	if x.IsInt() && (y.IsString() || y.IsList()) {
		x, y = y, x
	}
	if y.IsInt() && (x.IsString() || x.IsList()) {
		n := max(y.AsInt(), 0) // Python: a negative count repeats nothing
		if (x.IsString() && x.AsString() == "") || (x.IsList() && x.AsList().Len() == 0) {
			n = 0
		}
		if x.IsString() {
			s := x.AsString()
			if err := bd.b.str(mulSat(int64(len(s)), n)); err != nil {
				return Undefined(), err
			}
			return NewString(strings.Repeat(s, int(n))), nil
		}
		l := x.AsList()
		if err := bd.b.list(mulSat(int64(l.Len()), n)); err != nil {
			return Undefined(), err
		}
		items := make([]Value, 0, int64(l.Len())*n)
		for range n {
			items = append(items, l.Items...)
		}
		return NewList(items), nil
	}
	if x.IsFloat() || y.IsFloat() {
		return NewFloat(toFloat64(x) * toFloat64(y)), nil
	}
	return NewInt(toInt64(x) * toInt64(y)), nil
}

func divValues(a, b Value) Value {
	bf := toFloat64(b)
	if bf == 0 {
		return NewFloat(0)
	}
	return NewFloat(toFloat64(a) / bf)
}

func floorDivValues(a, b Value) Value {
	bi := toInt64(b)
	if bi == 0 {
		return NewInt(0)
	}
	return NewInt(toInt64(a) / bi)
}

func modValues(a, b Value) Value {
	bi := toInt64(b)
	if bi == 0 {
		return NewInt(0)
	}
	return NewInt(toInt64(a) % bi)
}

// powValues is x ** y: an int for ints (a non-negative exponent, a result
// within int64), as Python; a float otherwise.
func powValues(a, b Value) Value {
	if a.IsInt() && b.IsInt() && b.AsInt() >= 0 {
		if r, ok := intPow(a.AsInt(), b.AsInt()); ok {
			return NewInt(r)
		}
	}
	return NewFloat(math.Pow(toFloat64(a), toFloat64(b)))
}

// mulSat is x*y for non-negative x and y, or math.MaxInt64 past it.
func mulSat(x, y int64) int64 {
	if x == 0 || y == 0 {
		return 0
	}
	if x > math.MaxInt64/y {
		return math.MaxInt64
	}
	return x * y
}

// intPow is x**n, and whether it fits an int64.
func intPow(x, n int64) (int64, bool) {
	if x == math.MinInt64 {
		return 0, false
	}
	r := int64(1)
	for n > 0 {
		if n&1 == 1 {
			hi, lo := bits.Mul64(uint64(abs64(r)), uint64(abs64(x)))
			if hi != 0 || lo > math.MaxInt64 {
				return 0, false
			}
			neg := (r < 0) != (x < 0)
			r = int64(lo)
			if neg {
				r = -r
			}
		}
		n >>= 1
		if n > 0 {
			hi, lo := bits.Mul64(uint64(abs64(x)), uint64(abs64(x)))
			if hi != 0 || lo > math.MaxInt64 {
				return 0, false
			}
			x = int64(lo)
		}
	}
	return r, true
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
