package jinja

import (
	"errors"
	"fmt"
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
	b *budget
	// bd builds the render's values, charged to b.
	bd     builder
	output out
}

// child is an evaluator of the same render with its own scope and output
// (a macro's body, a set block, a caller's body).
func (e *evaluator) child(s *scope) *evaluator {
	return &evaluator{scope: s, builtins: e.builtins, b: e.b, bd: e.bd, output: out{b: e.b}}
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
		return e.bd.setKey(nsVal.AsDict(), n.target, val)
	}

	return e.bd.setVar(e.scope, n.target, val)
}

func (e *evaluator) execSetBlock(n *setBlockNode) error {
	bodyEval := e.child(e.scope)
	if err := bodyEval.execNodes(n.body); err != nil {
		return err
	}
	return e.bd.setVar(e.scope, n.target, NewString(bodyEval.output.String()))
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

		child, err := e.bd.newScope(parentScope)
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
			if err := e.bd.setVar(child, param.name, v); err != nil {
				return Undefined(), err
			}
		}

		// Set caller if available.
		if caller, ok := kwargs["caller"]; ok {
			if err := e.bd.setVar(child, "caller", caller); err != nil {
				return Undefined(), err
			}
		}

		macroEval := e.child(child)
		if err := macroEval.execNodes(body); err != nil {
			return Undefined(), err
		}

		return NewString(macroEval.output.String()), nil
	})

	return e.bd.setVar(e.scope, n.name, fn)
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

		child, err := e.bd.newScope(parentScope)
		if err != nil {
			return Undefined(), err
		}
		for i, argName := range callerArgs {
			if i < len(args) {
				if err := e.bd.setVar(child, argName, args[i]); err != nil {
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
