package jinja

import (
	"errors"
	"unicode/utf8"
)

func (e *evaluator) execFor(n *forNode) error {
	// The items, as a count and a function: a loop over range() makes
	// its numbers as it goes rather than a list of them (templates loop
	// over range(i) for each message: a list each, quadratic garbage).
	var (
		items []Value
		total int
		at    func(i int) Value
	)
	if start, step, count, ok, err := e.loopRange(n.iter); err != nil {
		return err
	} else if ok {
		total = int(count)
		at = func(i int) Value { return NewInt(start + int64(i)*step) }
	} else {
		iterVal, err := e.evalExpr(n.iter)
		if err != nil {
			return err
		}
		if items, err = e.loopItems(iterVal); err != nil {
			return err
		}
		total = len(items)
	}

	// Apply filter if present.
	if n.filterExpr != nil {
		// The kept items: at most all of them. One scope serves every
		// item (an expression cannot keep it).
		if err := e.b.listOf(int64(total), numberBoxBytes); err != nil {
			return err
		}
		filtered := make([]Value, 0, total)
		child, err := e.bd.newScope(e.scope)
		if err != nil {
			return err
		}
		for i := range total {
			var item Value
			if at != nil {
				item = at(i)
			} else {
				item = items[i]
			}
			child.set(n.valVar, item)
			old := e.scope
			e.scope = child
			fv, err := e.evalExpr(n.filterExpr)
			e.scope = old
			if err != nil {
				return err
			}
			if fv.IsTruthy() {
				filtered = append(filtered, item)
			}
		}
		items, total, at = filtered, len(filtered), nil
	}
	if at == nil {
		at = func(i int) Value { return items[i] }
	}

	if total == 0 {
		if n.elseBody != nil {
			return e.execNodes(n.elseBody)
		}
		return nil
	}

	// Pre-allocate the loop dict and child scope once, then reuse them
	// across iterations to avoid per-iteration allocations. Both are
	// charged: a template can keep them (a macro defined in the loop
	// keeps its scope, {{ l.append(loop) }} the loop variable).
	if err := e.b.grow(loopBytes); err != nil {
		return err
	}
	loop := Value{kind: KindDict, v: &Dict{Keys: make([]string, 0, 10), Data: make(map[string]Value, 10)}}
	ld := loop.AsDict()
	ld.Set("length", NewInt(int64(total)))

	child, err := e.bd.newScope(e.scope)
	if err != nil {
		return err
	}
	child.set("loop", loop)

	// loop.cycle: one callable for the loop, which cycles by the current
	// iteration (as Python's, a method of the loop), rather than one a
	// iteration.
	cycleIdx := int64(0)
	ld.Data["cycle"] = NewCallable("loop.cycle", func(args []Value, kwargs map[string]Value) (Value, error) {
		if len(args) == 0 {
			return Undefined(), nil
		}
		return args[int(cycleIdx)%len(args)], nil
	})

	for i := range total {
		item := at(i)
		// Every iteration costs steps, whatever its body: updating the
		// loop variable's fields costs about as much as four
		// expressions.
		if err := e.b.step(loopIterationSteps); err != nil {
			return err
		}

		// Set loop variable(s).
		if n.keyVar != "" {
			// Destructuring: for key, val in items
			if item.IsList() && item.AsList().Len() >= 2 {
				child.set(n.keyVar, item.AsList().Get(0))
				child.set(n.valVar, item.AsList().Get(1))
			} else {
				child.set(n.keyVar, NewInt(int64(i)))
				child.set(n.valVar, item)
			}
		} else {
			child.set(n.valVar, item)
		}

		// Update loop object for this iteration.
		idx := int64(i)
		ld.Data["index"] = NewInt(idx + 1)
		ld.Data["index0"] = NewInt(idx)
		ld.Data["revindex"] = NewInt(int64(total) - idx)
		ld.Data["revindex0"] = NewInt(int64(total) - idx - 1)
		ld.Data["first"] = NewBool(i == 0)
		ld.Data["last"] = NewBool(i == total-1)

		if i > 0 {
			ld.Data["previtem"] = at(i - 1)
		} else {
			ld.Data["previtem"] = Undefined()
		}
		if i < total-1 {
			ld.Data["nextitem"] = at(i + 1)
		} else {
			ld.Data["nextitem"] = Undefined()
		}

		cycleIdx = idx

		old := e.scope
		e.scope = child

		err := e.execNodes(n.body)
		e.scope = old

		if err != nil {
			if errors.Is(err, errBreak) {
				break
			}
			if errors.Is(err, errContinue) {
				continue
			}
			return err
		}
	}

	return nil
}

// loopRange is a loop's range(...) when its iterable is a call of the
// built-in range: its first item, step and count, and true.
func (e *evaluator) loopRange(iter expr) (start, step, count int64, ok bool, err error) {
	call, isCall := iter.(*callExpr)
	if !isCall || len(call.kwargs) > 0 {
		return 0, 0, 0, false, nil
	}
	name, isName := call.fn.(*nameExpr)
	if !isName || name.name != "range" {
		return 0, 0, 0, false, nil
	}
	fn, _ := e.scope.get(name.name)
	if c, isCallable := fn.v.(Callable); !isCallable || c.bfn == nil || c.Name != "range" {
		return 0, 0, 0, false, nil // a variable or a macro named range
	}
	// The steps of evaluating the call and its callee, as evalExpr would.
	if err := e.b.step(2); err != nil {
		return 0, 0, 0, false, err
	}
	args := make([]Value, len(call.args))
	for i, a := range call.args {
		if args[i], err = e.evalExpr(a); err != nil {
			return 0, 0, 0, false, err
		}
	}
	start, step, count, err = rangeOf(e.b, args)
	return start, step, count, err == nil, err
}

// loopItems are the items a loop iterates over: a list's, a dict's keys,
// a string's code points; none for anything else.
func (e *evaluator) loopItems(iterVal Value) ([]Value, error) {
	switch {
	case iterVal.IsList():
		return iterVal.AsList().Items, nil
	case iterVal.IsDict():
		d := iterVal.AsDict()
		if err := e.b.listOf(int64(d.Len()), stringBoxBytes); err != nil {
			return nil, err
		}
		items := make([]Value, 0, d.Len())
		for _, key := range d.Keys {
			items = append(items, NewString(key))
		}
		return items, nil
	case iterVal.IsString():
		s := iterVal.AsString()
		if err := e.b.scan(len(s)); err != nil {
			return nil, err
		}
		n := utf8.RuneCountInString(s)
		if err := e.b.listOf(int64(n), runeItemBytes-valueBytes); err != nil {
			return nil, err
		}
		items := make([]Value, 0, n)
		for _, r := range s {
			items = append(items, NewString(string(r)))
		}
		return items, nil
	}
	return nil, nil // empty iteration
}
