package jinja

// The evaluation budget (stepserve's fork; see doc.go): what one render
// may spend, charged as it goes, so that a hostile template is refused in
// bounded time and memory instead of looping, allocating or recursing
// without end.

import (
	"context"
	"errors"
	"fmt"
)

// Limits bounds one render. A zero field takes [DefaultLimits]' value: no
// render is unbounded.
type Limits struct {
	// MaxSteps bounds the work: every node executed and expression
	// evaluated is a step, a loop's iteration four (it updates the loop
	// variable's fields), and an operation that builds or scans
	// a string or a list costs a step per 64 bytes of it as well (a list
	// item counts as 24 bytes, the size of a Value).
	MaxSteps int64
	// MaxBytes bounds any one string or list the template builds, and its
	// output (and the output of each macro call, set block and filter
	// block). A size is checked before the allocation is made.
	MaxBytes int64
	// MaxDepth bounds recursion: macro and caller() calls nested in one
	// another, and how deep a walk over nested values (printing one,
	// tojson, comparing two) descends.
	MaxDepth int
}

// DefaultLimits are the limits of Render and RenderValues, and of any zero
// field of the Limits given to RenderContext.
var DefaultLimits = Limits{MaxSteps: 1_000_000, MaxBytes: 4 << 20, MaxDepth: 64}

// MaxNesting bounds how deep a template nests at compile time: blocks in
// blocks ({% if %} in {% for %} ...), and an expression's brackets,
// operators and filters. The parser recurses per level; real templates
// nest a dozen deep.
const MaxNesting = 128

// ErrBudget is wrapped by the errors of a render (or a compile) that
// exceeded its budget; the [*BudgetError] says which.
var ErrBudget = errors.New("jinja: evaluation budget exceeded")

// BudgetError is a budget exceeded: which one, its limit, and what
// exceeded it.
type BudgetError struct {
	Budget string // "steps", "bytes", "depth" or "nesting"
	Limit  int64
	// Reason says what exceeded it, e.g. "more than 1000000 steps", "a
	// string of 3000000000 bytes; at most 4194304".
	Reason string
}

func (e *BudgetError) Error() string { return ErrBudget.Error() + ": " + e.Reason }

// Unwrap makes the error match ErrBudget.
func (e *BudgetError) Unwrap() error { return ErrBudget }

// loopIterationSteps is what a loop's iteration costs besides its body:
// setting the loop variable's nine fields (index, first, cycle, ...)
// costs about four expressions' time, and an empty loop must not be four
// times cheaper than the steps it is charged.
const loopIterationSteps = 4

// valueBytes is what a list charges per item: the size of a Value.
const valueBytes = 24

// ctxCheckEvery is how many steps pass between two looks at the context.
const ctxCheckEvery = 1024

// budget is one render's account. Every evaluator of a render (macro
// bodies, set blocks, caller bodies) shares it.
type budget struct {
	ctx   context.Context
	lim   Limits
	steps int64
	check int64 // the step count at which ctx is next read
	depth int
	// err is the first budget or context error: once set, every charge
	// fails with it, so a path that drops an error cannot go on for free.
	err error
}

func newBudget(ctx context.Context, lim Limits) *budget {
	if lim.MaxSteps <= 0 {
		lim.MaxSteps = DefaultLimits.MaxSteps
	}
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = DefaultLimits.MaxBytes
	}
	if lim.MaxDepth <= 0 {
		lim.MaxDepth = DefaultLimits.MaxDepth
	}
	if ctx == nil {
		ctx = context.Background()
	}
	return &budget{ctx: ctx, lim: lim, check: ctxCheckEvery}
}

// fail records err as the render's end, unless one is recorded already.
func (b *budget) fail(err error) error {
	if b.err == nil {
		b.err = err
	}
	return b.err
}

// step charges n steps.
func (b *budget) step(n int64) error {
	if b.err != nil {
		return b.err
	}
	if n > b.lim.MaxSteps-b.steps { // refused before the work, uncounted
		return b.fail(&BudgetError{Budget: "steps", Limit: b.lim.MaxSteps, Reason: fmt.Sprintf("more than %d steps", b.lim.MaxSteps)})
	}
	if n > 0 {
		b.steps += n
	}
	if b.steps >= b.check {
		b.check = b.steps + ctxCheckEvery
		if err := b.ctx.Err(); err != nil {
			return b.fail(fmt.Errorf("jinja: render stopped: %w", context.Cause(b.ctx)))
		}
	}
	return nil
}

// scan charges reading n bytes: a step per 64.
func (b *budget) scan(n int) error {
	return b.step(int64(n) >> 6)
}

// str checks that a string of n bytes may be built, before it is, and
// charges building it.
func (b *budget) str(n int64) error {
	if b.err != nil {
		return b.err
	}
	if n > b.lim.MaxBytes || n < 0 {
		return b.fail(&BudgetError{Budget: "bytes", Limit: b.lim.MaxBytes, Reason: fmt.Sprintf("a string of %d bytes; at most %d", n, b.lim.MaxBytes)})
	}
	return b.step(n >> 6)
}

// list checks that a list of n items may be built, before it is, and
// charges building it.
func (b *budget) list(n int64) error {
	if err := b.listSize(n); err != nil {
		return err
	}
	return b.step(n * valueBytes >> 6)
}

// listSize checks that a list (or a dict) of n items may be, without
// charging for it: for one grown an item at a time.
func (b *budget) listSize(n int64) error {
	if b.err != nil {
		return b.err
	}
	if n > b.lim.MaxBytes/valueBytes || n < 0 {
		return b.fail(&BudgetError{Budget: "bytes", Limit: b.lim.MaxBytes, Reason: fmt.Sprintf("a list of %d items (%d bytes each); at most %d bytes", n, valueBytes, b.lim.MaxBytes)})
	}
	return nil
}

// enter is a call one deeper (a macro, a caller); leave is its return.
func (b *budget) enter() error {
	if b.err != nil {
		return b.err
	}
	if b.depth >= b.lim.MaxDepth {
		return b.fail(&BudgetError{Budget: "depth", Limit: int64(b.lim.MaxDepth), Reason: fmt.Sprintf("calls nested more than %d deep", b.lim.MaxDepth)})
	}
	b.depth++
	return nil
}

func (b *budget) leave() { b.depth-- }

// nested checks a walk over nested values at depth.
func (b *budget) nested(depth int) error {
	if depth > b.lim.MaxDepth {
		return b.fail(&BudgetError{Budget: "depth", Limit: int64(b.lim.MaxDepth), Reason: fmt.Sprintf("values nested more than %d deep", b.lim.MaxDepth)})
	}
	return b.step(1)
}

// out is an output the budget bounds: a template's, a macro call's, a
// set block's.
type out struct {
	b  *budget
	sb []byte
}

// write appends s, refusing an output past MaxBytes before growing it.
func (o *out) write(s string) error {
	if n := int64(len(o.sb)) + int64(len(s)); n > o.b.lim.MaxBytes {
		return o.b.fail(&BudgetError{Budget: "bytes", Limit: o.b.lim.MaxBytes, Reason: fmt.Sprintf("an output of more than %d bytes", o.b.lim.MaxBytes)})
	}
	if err := o.b.scan(len(s)); err != nil {
		return err
	}
	o.sb = append(o.sb, s...)
	return nil
}

func (o *out) String() string { return string(o.sb) }
