package jinja

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"
	"unicode"
	"unicode/utf8"
)

var (
	errBreak    = errors.New("break")
	errContinue = errors.New("continue")
)

// =============================================================================
// Scope
// =============================================================================

type scope struct {
	vars   map[string]Value
	parent *scope
}

func newScope(parent *scope) *scope {
	return &scope{vars: make(map[string]Value, 4), parent: parent}
}

func (s *scope) get(name string) (Value, bool) {
	if v, ok := s.vars[name]; ok {
		return v, true
	}
	if s.parent != nil {
		return s.parent.get(name)
	}
	return Undefined(), false
}

func (s *scope) set(name string, val Value) {
	s.vars[name] = val
}

// =============================================================================
// Evaluator
// =============================================================================

type evaluator struct {
	scope    *scope
	builtins *scope
	// b is the render's budget, shared by every evaluator of the render.
	b      *budget
	output out
}

// child is an evaluator of the same render with its own scope and output
// (a macro's body, a set block, a caller's body).
func (e *evaluator) child(s *scope) *evaluator {
	return &evaluator{scope: s, builtins: e.builtins, b: e.b, output: out{b: e.b}}
}

func (e *evaluator) execNodes(nodes []node) error {
	for _, n := range nodes {
		if err := e.execNode(n); err != nil {
			return err
		}
	}
	return nil
}

func (e *evaluator) execNode(n node) error {
	if err := e.b.step(1); err != nil {
		return err
	}
	switch nd := n.(type) {
	case *textNode:
		return e.output.write(nd.text)

	case *outputNode:
		val, err := e.evalExpr(nd.expression)
		if err != nil {
			return err
		}
		s, err := e.b.print(val)
		if err != nil {
			return err
		}
		return e.output.write(s)

	case *ifNode:
		return e.execIf(nd)

	case *forNode:
		return e.execFor(nd)

	case *setNode:
		return e.execSet(nd)

	case *setBlockNode:
		return e.execSetBlock(nd)

	case *macroNode:
		return e.execMacro(nd)

	case *callNode:
		return e.execCall(nd)

	case *filterBlockNode:
		return e.execFilterBlock(nd)

	case *breakNode:
		return errBreak

	case *continueNode:
		return errContinue

	default:
		return fmt.Errorf("unknown node type %T", n)
	}
}

func (e *evaluator) execIf(n *ifNode) error {
	for _, branch := range n.branches {
		if branch.condition == nil {
			// else branch
			return e.execNodes(branch.body)
		}
		cond, err := e.evalExpr(branch.condition)
		if err != nil {
			return err
		}
		if cond.IsTruthy() {
			return e.execNodes(branch.body)
		}
	}
	return nil
}

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
		child, err := e.b.newScope(e.scope)
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

	child, err := e.b.newScope(e.scope)
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

func (e *evaluator) execSet(n *setNode) error {
	val, err := e.evalExpr(n.value)
	if err != nil {
		return err
	}

	if n.namespace != "" {
		nsVal, ok := e.scope.get(n.namespace)
		if !ok || !nsVal.IsDict() {
			return fmt.Errorf("set: namespace %q not found or not a dict", n.namespace)
		}
		return e.b.setKey(nsVal.AsDict(), n.target, val)
	}

	return e.b.setVar(e.scope, n.target, val)
}

func (e *evaluator) execSetBlock(n *setBlockNode) error {
	bodyEval := e.child(e.scope)
	if err := bodyEval.execNodes(n.body); err != nil {
		return err
	}
	return e.b.setVar(e.scope, n.target, NewString(bodyEval.output.String()))
}

func (e *evaluator) execMacro(n *macroNode) error {
	// Capture the macro body and params.
	params := n.params
	body := n.body
	parentScope := e.scope

	// The macro (a closure) is charged as it is made; each call its scope
	// and what its arguments box (a macro or a caller made in the call
	// may keep them).
	if err := e.b.grow(callableBytes); err != nil {
		return err
	}
	fn := NewCallable(n.name, func(args []Value, kwargs map[string]Value) (Value, error) {
		// A macro calling itself (or another that calls it back) is
		// bounded by the budget's depth.
		if err := e.b.enter(); err != nil {
			return Undefined(), err
		}
		defer e.b.leave()

		child, err := e.b.newScope(parentScope)
		if err != nil {
			return Undefined(), err
		}

		// Bind positional args.
		for i, param := range params {
			v := Undefined()
			if i < len(args) {
				v = args[i]
			} else if kv, ok := kwargs[param.name]; ok {
				v = kv
			} else if param.defaultVal != nil {
				defEval := e.child(child)
				if v, err = defEval.evalExpr(param.defaultVal); err != nil {
					return Undefined(), err
				}
			}
			if err := e.b.setVar(child, param.name, v); err != nil {
				return Undefined(), err
			}
		}

		// Set caller if available.
		if caller, ok := kwargs["caller"]; ok {
			if err := e.b.setVar(child, "caller", caller); err != nil {
				return Undefined(), err
			}
		}

		macroEval := e.child(child)
		if err := macroEval.execNodes(body); err != nil {
			return Undefined(), err
		}

		return NewString(macroEval.output.String()), nil
	})

	return e.b.setVar(e.scope, n.name, fn)
}

func (e *evaluator) execCall(n *callNode) error {
	// Create a caller callable that renders the body.
	callerArgs := n.callerArgs
	body := n.body
	parentScope := e.scope

	if err := e.b.grow(callableBytes); err != nil {
		return err
	}
	caller := NewCallable("caller", func(args []Value, kwargs map[string]Value) (Value, error) {
		if err := e.b.enter(); err != nil {
			return Undefined(), err
		}
		defer e.b.leave()

		child, err := e.b.newScope(parentScope)
		if err != nil {
			return Undefined(), err
		}
		for i, argName := range callerArgs {
			if i < len(args) {
				if err := e.b.setVar(child, argName, args[i]); err != nil {
					return Undefined(), err
				}
			}
		}

		callerEval := e.child(child)
		if err := callerEval.execNodes(body); err != nil {
			return Undefined(), err
		}
		return NewString(callerEval.output.String()), nil
	})

	// Evaluate the call expression with caller in kwargs.
	callEx, ok := n.expr.(*callExpr)
	if ok {
		fn, err := e.evalExpr(callEx.fn)
		if err != nil {
			return err
		}
		if !fn.IsCallable() {
			return fmt.Errorf("call: expression is not callable")
		}

		var args []Value
		for _, a := range callEx.args {
			av, err := e.evalExpr(a)
			if err != nil {
				return err
			}
			args = append(args, av)
		}

		kwargs := map[string]Value{"caller": caller}
		for _, kw := range callEx.kwargs {
			v, err := e.evalExpr(kw.value)
			if err != nil {
				return err
			}
			kwargs[kw.name] = v
		}

		result, err := e.call(fn, args, kwargs)
		if err != nil {
			return err
		}
		return e.writeValue(result)
	}

	// Fallback: evaluate expression and call with caller.
	fn, err := e.evalExpr(n.expr)
	if err != nil {
		return err
	}
	if !fn.IsCallable() {
		return fmt.Errorf("call: expression is not callable")
	}

	result, err := e.call(fn, nil, map[string]Value{"caller": caller})
	if err != nil {
		return err
	}
	return e.writeValue(result)
}

// writeValue writes a value's text to the output.
func (e *evaluator) writeValue(v Value) error {
	s, err := e.b.print(v)
	if err != nil {
		return err
	}
	return e.output.write(s)
}

// call calls a callable value: a built-in with the render's budget.
func (e *evaluator) call(fn Value, args []Value, kwargs map[string]Value) (Value, error) {
	c := fn.v.(Callable)
	if c.bfn != nil {
		return c.bfn(e.b, args, kwargs)
	}
	v, err := c.Fn(args, kwargs)
	if err == nil && e.b.err != nil {
		// A callable that dropped the budget's error (a macro's, through
		// a caller that ignores errors) does not go on for free.
		err = e.b.err
	}
	return v, err
}

func (e *evaluator) execFilterBlock(n *filterBlockNode) error {
	// Render body to string.
	bodyEval := e.child(e.scope)
	if err := bodyEval.execNodes(n.body); err != nil {
		return err
	}
	bodyStr := bodyEval.output.String()

	// Apply the filter. The filter expression should be a name or filter chain.
	if fe, ok := n.filter.(*nameExpr); ok {
		filterVal, ok := lookupFilter(e.builtins, fe.name)
		if !ok {
			return fmt.Errorf("unknown filter %q", fe.name)
		}
		result, err := e.call(filterVal, []Value{NewString(bodyStr)}, nil)
		if err != nil {
			return err
		}
		return e.writeValue(result)
	}

	// For more complex filter expressions, just output the body.
	return e.output.write(bodyStr)
}

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
		d, err := e.b.newDict()
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
			if err := e.b.setKey(dict, k, val); err != nil {
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
		return e.dictMethod(obj, n.attr)
	}

	// String methods.
	if obj.IsString() {
		return e.stringMethod(obj, n.attr)
	}

	// List methods.
	if obj.IsList() {
		return e.listMethod(obj, n.attr)
	}

	return Undefined(), nil
}

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
		return b.addValues(left, right)
	case "-":
		return subValues(left, right), nil
	case "*":
		return b.mulValues(left, right)
	case "/":
		return divValues(left, right), nil
	case "//":
		return floorDivValues(left, right), nil
	case "%":
		return modValues(left, right), nil
	case "**":
		return powValues(left, right), nil
	case "~":
		return b.concat(left, right)
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

// =============================================================================
// String methods
// =============================================================================

func (e *evaluator) stringMethod(obj Value, method string) (Value, error) {
	s := obj.AsString()
	b := e.b

	switch method {
	case "strip", "lstrip", "rstrip":
		return e.makeStringFunc(method, func(args []Value, kwargs map[string]Value) (Value, error) {
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
		return e.makeStringFunc("split", func(args []Value, kwargs map[string]Value) (Value, error) {
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
			return b.split(s, sep, fields)
		}), nil

	case "startswith", "endswith":
		return e.makeStringFunc(method, func(args []Value, kwargs map[string]Value) (Value, error) {
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
		return e.makeStringFunc("replace", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) < 2 {
				return NewString(s), nil
			}
			count := int64(-1)
			if len(args) > 2 {
				count = toInt64(args[2])
			}
			return b.replace(s, args[0], args[1], count)
		}), nil

	case "upper":
		return e.makeStringFunc("upper", func(args []Value, kwargs map[string]Value) (Value, error) {
			return b.mapString(s, strings.ToUpper)
		}), nil

	case "lower":
		return e.makeStringFunc("lower", func(args []Value, kwargs map[string]Value) (Value, error) {
			return b.mapString(s, strings.ToLower)
		}), nil

	case "title":
		return e.makeStringFunc("title", func(args []Value, kwargs map[string]Value) (Value, error) {
			return b.mapString(s, func(s string) string {
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
		return e.makeStringFunc("capitalize", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(s) == 0 {
				return NewString(""), nil
			}
			return b.mapString(s, func(s string) string {
				runes := []rune(s)
				runes[0] = []rune(strings.ToUpper(string(runes[0])))[0]
				return string(runes)
			})
		}), nil

	case "count", "find":
		return e.makeStringFunc(method, func(args []Value, kwargs map[string]Value) (Value, error) {
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
		return e.makeStringFunc("format", func(args []Value, kwargs map[string]Value) (Value, error) {
			result := NewString(s)
			for i, arg := range args {
				var err error
				placeholder := NewString(fmt.Sprintf("{%d}", i))
				if result, err = b.replace(result.AsString(), placeholder, arg, -1); err != nil {
					return Undefined(), err
				}
				if result, err = b.replace(result.AsString(), NewString("{}"), arg, 1); err != nil {
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
func (b *budget) split(s, sep string, fields bool) (Value, error) {
	var n int
	switch {
	case fields:
		n = countFields(s)
	case sep == "":
		n = utf8.RuneCountInString(s)
	default:
		n = strings.Count(s, sep) + 1
	}
	if err := b.listOf(int64(n), partItemBytes-valueBytes); err != nil {
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
func (b *budget) replace(s string, oldV, newV Value, count int64) (Value, error) {
	old, err := b.print(oldV)
	if err != nil {
		return Undefined(), err
	}
	repl, err := b.print(newV)
	if err != nil {
		return Undefined(), err
	}
	if err := b.scan(len(s) + len(old)); err != nil {
		return Undefined(), err
	}
	n := int64(strings.Count(s, old)) // an empty old matches before every code point and at the end
	if count >= 0 && count < n {
		n = count
	}
	if n == 0 {
		return NewString(s), nil
	}
	if err := b.str(int64(len(s)) + n*(int64(len(repl))-int64(len(old)))); err != nil {
		return Undefined(), err
	}
	return NewString(strings.Replace(s, old, repl, int(n))), nil
}

// mapString is f(s), for an f whose result is at most three times as long
// (case mappings: a code point grows by half at most, an invalid byte
// becomes U+FFFD's three), its size checked once built.
func (b *budget) mapString(s string, f func(string) string) (Value, error) {
	if err := b.str(int64(len(s))); err != nil {
		return Undefined(), err
	}
	r := f(s)
	if err := b.str(int64(len(r))); err != nil {
		return Undefined(), err
	}
	return NewString(r), nil
}

func (e *evaluator) makeStringFunc(name string, fn func([]Value, map[string]Value) (Value, error)) Value {
	return NewCallable("str."+name, fn)
}

// =============================================================================
// List methods
// =============================================================================

func (e *evaluator) listMethod(obj Value, method string) (Value, error) {
	list := obj.AsList()
	b := e.b

	switch method {
	case "append":
		return NewCallable("list.append", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) > 0 {
				// The size is checked and the growth charged; the
				// evaluation that called it was the step.
				if err := b.appendItem(list, args[0]); err != nil {
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
				if err := b.own(list); err != nil {
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
				if err := b.own(list); err != nil {
					return Undefined(), err
				}
			}
			if err := b.appendItem(list, args[1]); err != nil {
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

func (e *evaluator) dictMethod(obj Value, method string) (Value, error) {
	d := obj.AsDict()
	b := e.b

	switch method {
	case "items":
		return NewCallable("dict.items", func(args []Value, kwargs map[string]Value) (Value, error) {
			return b.dictItems(d)
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
					if err := b.setKey(d, key, other.Data[key]); err != nil {
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
func (b *budget) dictItems(d *Dict) (Value, error) {
	// Each pair is an item, and a list of two: its header, its items,
	// and its key's box.
	if err := b.listOf(int64(d.Len()), pairBytes); err != nil {
		return Undefined(), err
	}
	items := make([]Value, 0, d.Len())
	for _, key := range d.Keys {
		items = append(items, NewList([]Value{NewString(key), d.Data[key]}))
	}
	return NewList(items), nil
}

// =============================================================================
// Arithmetic helpers
// =============================================================================

func (b *budget) addValues(x, y Value) (Value, error) {
	if x.IsString() || y.IsString() {
		return b.concat(x, y)
	}
	if x.IsList() && y.IsList() {
		return b.concatLists(x.AsList(), y.AsList())
	}
	if x.IsFloat() || y.IsFloat() {
		return NewFloat(toFloat64(x) + toFloat64(y)), nil
	}
	return NewInt(toInt64(x) + toInt64(y)), nil
}

// concatLists is x + y, a new list: x's array extended in place where x
// may grow (see List.tail), the new list sharing it, y's items copied
// (a step per 64 bytes of them); else a new array with room to grow.
func (b *budget) concatLists(x, y *List) (Value, error) {
	n := int64(x.Len()) + int64(y.Len())
	if err := b.listSize(n); err != nil {
		return Undefined(), err
	}
	if x.extendsFor(b, y.Len()) {
		if err := b.build(listBytes + int64(y.Len())*valueBytes); err != nil {
			return Undefined(), err
		}
		items := append(x.Items, y.Items...) // within its capacity: in place
		x.tail.n, x.tail.shared = len(items), true
		return Value{kind: KindList, v: &List{Items: items, tail: x.tail}}, nil
	}
	if err := b.grow(listBytes); err != nil {
		return Undefined(), err
	}
	items, err := b.listArray(x.Items, n)
	if err != nil {
		return Undefined(), err
	}
	items = append(items, y.Items...)
	return Value{kind: KindList, v: &List{Items: items, tail: &listTail{n: len(items), b: b}}}, nil
}

// concat is x ~ y: their texts joined, its size checked before.
func (b *budget) concat(x, y Value) (Value, error) {
	xs, err := b.print(x)
	if err != nil {
		return Undefined(), err
	}
	ys, err := b.print(y)
	if err != nil {
		return Undefined(), err
	}
	if err := b.str(int64(len(xs)) + int64(len(ys))); err != nil {
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
func (b *budget) mulValues(x, y Value) (Value, error) {
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
			if err := b.str(mulSat(int64(len(s)), n)); err != nil {
				return Undefined(), err
			}
			return NewString(strings.Repeat(s, int(n))), nil
		}
		l := x.AsList()
		if err := b.list(mulSat(int64(l.Len()), n)); err != nil {
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
