package jinja

import (
	"fmt"
)

// =============================================================================
// Expression evaluation
// =============================================================================

func (e *evaluator) evalExpr(ex expr) (Value, error) {
	if err := e.b.step(1); err != nil {
		return Undefined(), err
	}
	switch n := ex.(type) {
	case *litExpr:
		return n.val, nil

	case *nameExpr:
		v, _ := e.scope.get(n.name)
		return v, nil

	case *attrExpr:
		return e.evalAttr(n)

	case *itemExpr:
		return e.evalItem(n)

	case *sliceExpr:
		return e.evalSlice(n)

	case *unaryExpr:
		return e.evalUnary(n)

	case *binExpr:
		return e.evalBinary(n)

	case *condExpr:
		return e.evalCond(n)

	case *callExpr:
		return e.evalCallExpr(n)

	case *filterExpr:
		return e.evalFilter(n)

	case *testExpr:
		return e.evalTestExpr(n)

	case *listExpr:
		if err := e.b.list(int64(len(n.items))); err != nil {
			return Undefined(), err
		}
		items := make([]Value, len(n.items))
		for i, item := range n.items {
			v, err := e.evalExpr(item)
			if err != nil {
				return Undefined(), err
			}
			if err := e.b.grow(boxBytes(v)); err != nil {
				return Undefined(), err
			}
			items[i] = v
		}
		return NewList(items), nil

	case *dictExpr:
		d, err := e.bd.newDict()
		if err != nil {
			return Undefined(), err
		}
		dict := d.AsDict()
		for _, pair := range n.pairs {
			key, err := e.evalExpr(pair.key)
			if err != nil {
				return Undefined(), err
			}
			val, err := e.evalExpr(pair.value)
			if err != nil {
				return Undefined(), err
			}
			k, err := e.b.print(key)
			if err != nil {
				return Undefined(), err
			}
			if err := e.bd.setKey(dict, k, val); err != nil {
				return Undefined(), err
			}
		}
		return d, nil

	default:
		return Undefined(), fmt.Errorf("unknown expression type %T", ex)
	}
}

func (e *evaluator) evalAttr(n *attrExpr) (Value, error) {
	obj, err := e.evalExpr(n.obj)
	if err != nil {
		return Undefined(), err
	}

	// Dict attribute access.
	if obj.IsDict() {
		if v, ok := obj.AsDict().Get(n.attr); ok {
			return v, nil
		}

		// Dict methods.
		return e.bd.dictMethod(obj, n.attr)
	}

	// String methods.
	if obj.IsString() {
		return e.bd.stringMethod(obj, n.attr)
	}

	// List methods.
	if obj.IsList() {
		return e.bd.listMethod(obj, n.attr)
	}

	return Undefined(), nil
}

func (e *evaluator) evalUnary(n *unaryExpr) (Value, error) {
	operand, err := e.evalExpr(n.operand)
	if err != nil {
		return Undefined(), err
	}

	switch n.op {
	case "not":
		return NewBool(!operand.IsTruthy()), nil
	case "-":
		if operand.IsInt() {
			return NewInt(-operand.AsInt()), nil
		}
		if operand.IsFloat() {
			return NewFloat(-operand.AsFloat()), nil
		}
		return NewInt(0), nil
	case "+":
		return operand, nil
	}

	return Undefined(), fmt.Errorf("unknown unary operator %q", n.op)
}

func (e *evaluator) evalBinary(n *binExpr) (Value, error) {
	// Short-circuit for and/or.
	if n.op == "and" {
		left, err := e.evalExpr(n.left)
		if err != nil {
			return Undefined(), err
		}
		if !left.IsTruthy() {
			return left, nil
		}
		return e.evalExpr(n.right)
	}

	if n.op == "or" {
		left, err := e.evalExpr(n.left)
		if err != nil {
			return Undefined(), err
		}
		if left.IsTruthy() {
			return left, nil
		}
		return e.evalExpr(n.right)
	}

	left, err := e.evalExpr(n.left)
	if err != nil {
		return Undefined(), err
	}

	right, err := e.evalExpr(n.right)
	if err != nil {
		return Undefined(), err
	}

	b := e.b
	switch n.op {
	case "+":
		return e.bd.addValues(left, right)
	case "-":
		return subValues(left, right), nil
	case "*":
		return e.bd.mulValues(left, right)
	case "/":
		return divValues(left, right), nil
	case "//":
		return floorDivValues(left, right), nil
	case "%":
		return modValues(left, right), nil
	case "**":
		return powValues(left, right), nil
	case "~":
		return e.bd.concat(left, right)
	case "==", "!=":
		eq, err := b.valuesEqual(left, right)
		return NewBool(eq == (n.op == "==")), err
	case "<", ">", "<=", ">=":
		c, err := b.compare(left, right)
		if err != nil {
			return Undefined(), err
		}
		switch n.op {
		case "<":
			return NewBool(c < 0), nil
		case ">":
			return NewBool(c > 0), nil
		case "<=":
			return NewBool(c <= 0), nil
		}
		return NewBool(c >= 0), nil
	case "in", "not in":
		in, err := b.contains(right, left)
		return NewBool(in == (n.op == "in")), err
	}

	return Undefined(), fmt.Errorf("unknown binary operator %q", n.op)
}

func (e *evaluator) evalCond(n *condExpr) (Value, error) {
	cond, err := e.evalExpr(n.condition)
	if err != nil {
		return Undefined(), err
	}

	if cond.IsTruthy() {
		return e.evalExpr(n.trueExpr)
	}

	if n.falseExpr != nil {
		return e.evalExpr(n.falseExpr)
	}

	return Undefined(), nil
}

func (e *evaluator) evalCallExpr(n *callExpr) (Value, error) {
	fn, err := e.evalExpr(n.fn)
	if err != nil {
		return Undefined(), err
	}

	if !fn.IsCallable() {
		return Undefined(), fmt.Errorf("%s is not callable: %s", callableName(n.fn), reprWithin(fn, 200))
	}

	args := make([]Value, len(n.args))
	for i, a := range n.args {
		v, err := e.evalExpr(a)
		if err != nil {
			return Undefined(), err
		}
		args[i] = v
	}

	var kwargs map[string]Value
	if len(n.kwargs) > 0 {
		kwargs = make(map[string]Value, len(n.kwargs))
		for _, kw := range n.kwargs {
			v, err := e.evalExpr(kw.value)
			if err != nil {
				return Undefined(), err
			}
			kwargs[kw.name] = v
		}
	}

	return e.call(fn, args, kwargs)
}

func callableName(ex expr) string {
	switch n := ex.(type) {
	case *nameExpr:
		return n.name

	case *attrExpr:
		return callableName(n.obj) + "." + n.attr

	case *itemExpr:
		return callableName(n.obj) + "[item]"

	default:
		return ex.nodeType()
	}
}

func (e *evaluator) evalFilter(n *filterExpr) (Value, error) {
	input, err := e.evalExpr(n.expr)
	if err != nil {
		return Undefined(), err
	}

	// Look up filter in builtins.
	filterVal, ok := lookupFilter(e.builtins, n.name)
	if !ok {
		// Also check scope for user-defined filters.
		filterVal, ok = e.scope.get(n.name)
		if !ok {
			return Undefined(), fmt.Errorf("unknown filter %q", n.name)
		}
	}

	if !filterVal.IsCallable() {
		return Undefined(), fmt.Errorf("filter %q is not callable", n.name)
	}

	// Build args: input as first, then additional args.
	args := make([]Value, 1+len(n.args))
	args[0] = input
	for i, a := range n.args {
		v, err := e.evalExpr(a)
		if err != nil {
			return Undefined(), err
		}
		args[i+1] = v
	}

	var kwargs map[string]Value
	if len(n.kwargs) > 0 {
		kwargs = make(map[string]Value, len(n.kwargs))
		for _, kw := range n.kwargs {
			v, err := e.evalExpr(kw.value)
			if err != nil {
				return Undefined(), err
			}
			kwargs[kw.name] = v
		}
	}

	return e.call(filterVal, args, kwargs)
}

func (e *evaluator) evalTestExpr(n *testExpr) (Value, error) {
	val, err := e.evalExpr(n.expr)
	if err != nil {
		return Undefined(), err
	}

	var testArgs []Value
	for _, a := range n.args {
		v, err := e.evalExpr(a)
		if err != nil {
			return Undefined(), err
		}
		testArgs = append(testArgs, v)
	}

	result, err := e.b.evalTest(n.name, val, testArgs)
	if err != nil {
		return Undefined(), err
	}

	if n.negated {
		result = !result
	}

	return NewBool(result), nil
}
