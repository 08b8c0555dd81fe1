package jinja

import (
	"fmt"
	"math"
)

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

	return builder{b}.dictItems(args[0].AsDict())
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
