package jinja

// The evaluation budget (stepserve's fork; see doc.go): what one render
// may spend, charged as it goes, so that a hostile template is refused in
// bounded time and memory instead of looping, allocating or recursing
// without end.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
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
	// MaxAlloc bounds what the render builds over its whole run: the
	// bytes of every string, list (its items, 24 bytes each, and what
	// they box: a number's 8, a string's header), dict, scope, loop
	// variable and closure it makes, and of every output buffer as it
	// grows, counted when made and never given back when they become
	// garbage. So it bounds the memory a render can hold live at once
	// (up to the allocator's rounding of small objects to their size
	// class, a fifth at most), however many steps it may take: MaxSteps
	// bounds time, and a budget of steps that grows with the
	// conversation would otherwise let a template keep a string of
	// MaxBytes per iteration. It is charged before the allocation.
	MaxAlloc int64
}

// DefaultLimits are the limits of Render and RenderValues, and of any zero
// field of the Limits given to RenderContext.
var DefaultLimits = Limits{MaxSteps: 1_000_000, MaxBytes: 4 << 20, MaxDepth: 64, MaxAlloc: 64 << 20}

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
	Budget string // "steps", "bytes", "alloc", "depth" or "nesting"
	Limit  int64
	// Reason says what exceeded it, e.g. "more than 1000000 steps", "a
	// string of 3000000000 bytes; at most 4194304", "more than 67108864
	// bytes built".
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

// What MaxAlloc charges for what a render makes besides strings' bytes
// and lists' items (measured with Go 1.26 on amd64; see
// TestBudgetAllocBoundsWhatARenderKeeps):
const (
	// listBytes is a list's own header (a *List).
	listBytes = 24
	// dictBytes is an empty dict: a *Dict and its map's header.
	dictBytes = 80
	// dictEntryBytes is a key added to a dict, amortized over the map's
	// and the key list's growth (about 215 bytes a key for dicts of 16
	// keys and more); a first key costs dictFirstBytes, the map's first
	// group of eight (a dict of one key is 448 bytes).
	dictEntryBytes = 224
	dictFirstBytes = 384
	// scopeBytes is a scope (a macro call's, a loop's): its map holds
	// eight names before it grows, each more a dictEntryBytes.
	scopeBytes  = 416
	scopeInline = 8
	// loopBytes is a loop's loop variable: a dict of its ten fields
	// (about 1030 bytes).
	loopBytes = 1152
	// callableBytes is a callable a render makes (a macro, a caller, a
	// joiner, a method of a string, list or dict): its closure and its box.
	callableBytes = 128
	// stringBoxBytes is a string kept in a list, a dict or a scope: its
	// header boxed in the Value, and the text of a short string built
	// uncharged (a code point, a number's digits: 24 bytes at most).
	stringBoxBytes = 16 + 24
	// numberBoxBytes is a number kept: its box.
	numberBoxBytes = 8
	// runeItemBytes is a list item that is a code point of a string: the
	// item, its string's header and its bytes.
	runeItemBytes = valueBytes + 16 + 8
	// partItemBytes is a list item that is a part of a split string: the
	// item and its string's header (its bytes are the string's).
	partItemBytes = valueBytes + 16
	// pairBytes is what a (key, value) pair makes besides its item: a
	// list of two and the key's header.
	pairBytes = listBytes + 2*valueBytes + 16
)

// boxBytes is what keeping v in a list, a dict or a scope may hold that
// was not charged where v was made: a number's box, a string's header, a
// callable's closure, an empty list's header.
func boxBytes(v Value) int64 {
	switch v.kind {
	case KindString:
		return stringBoxBytes
	case KindInt, KindFloat:
		return numberBoxBytes
	case KindList:
		return listBytes
	case KindDict:
		return dictBytes
	case KindCallable:
		return callableBytes
	}
	return 0
}

// ctxCheckEvery is how many steps pass between two looks at the context.
const ctxCheckEvery = 1024

// budget is one render's account: its limits, what it has spent, and
// the charges against them (a builder spends it on values). Every
// evaluator of a render (macro bodies, set blocks, caller bodies) shares
// it.
type budget struct {
	ctx   context.Context
	lim   Limits
	steps int64
	alloc int64 // the bytes built so far (MaxAlloc's account)
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
	if lim.MaxAlloc <= 0 {
		lim.MaxAlloc = DefaultLimits.MaxAlloc
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

// grow charges building n bytes to MaxAlloc, before they are built.
func (b *budget) grow(n int64) error {
	if b.err != nil {
		return b.err
	}
	if n > b.lim.MaxAlloc-b.alloc || n < 0 { // refused before, uncounted
		return b.fail(&BudgetError{Budget: "alloc", Limit: b.lim.MaxAlloc, Reason: fmt.Sprintf("more than %d bytes built", b.lim.MaxAlloc)})
	}
	b.alloc += n
	return nil
}

// build charges building n bytes: to MaxAlloc (as allocated: see
// allocSize), and a step per 64.
func (b *budget) build(n int64) error {
	if err := b.grow(allocSize(n)); err != nil {
		return err
	}
	return b.step(n >> 6)
}

// allocSize is what Go's allocator takes for an object of n bytes, where
// it is much more: one of more than 32 KiB takes whole pages of 8 KiB (a
// quarter more for 32769 bytes). Smaller objects are rounded to their
// size class, an eighth or so more, which MaxAlloc leaves uncounted.
func allocSize(n int64) int64 {
	const page = 8 << 10
	if n <= 32<<10 || n > math.MaxInt64-page {
		return n
	}
	return (n + page - 1) &^ (page - 1)
}

// strSize checks that a string of n bytes may be, without charging for
// it.
func (b *budget) strSize(n int64) error {
	if b.err != nil {
		return b.err
	}
	if n > b.lim.MaxBytes || n < 0 {
		return b.fail(&BudgetError{Budget: "bytes", Limit: b.lim.MaxBytes, Reason: fmt.Sprintf("a string of %d bytes; at most %d", n, b.lim.MaxBytes)})
	}
	return nil
}

// str checks that a string of n bytes may be built, before it is, and
// charges building it.
func (b *budget) str(n int64) error {
	if err := b.strSize(n); err != nil {
		return err
	}
	return b.build(n)
}

// list checks that a list of n items may be built, before it is, and
// charges building it.
func (b *budget) list(n int64) error {
	return b.listOf(n, 0)
}

// listOf is list for items that each make each bytes more (the box of a
// number, the header of a string).
func (b *budget) listOf(n, each int64) error {
	if err := b.listSize(n); err != nil {
		return err
	}
	return b.build(listBytes + n*(valueBytes+each))
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
	sb strings.Builder
}

// write appends s, refusing an output past MaxBytes before growing it,
// and charging its growth to MaxAlloc as it is made (the builder grows to
// twice its capacity and what is written: strings.Builder.Grow's rule).
func (o *out) write(s string) error {
	n := int64(o.sb.Len()) + int64(len(s))
	if n > o.b.lim.MaxBytes {
		return o.b.fail(&BudgetError{Budget: "bytes", Limit: o.b.lim.MaxBytes, Reason: fmt.Sprintf("an output of more than %d bytes", o.b.lim.MaxBytes)})
	}
	if err := o.b.scan(len(s)); err != nil {
		return err
	}
	if n > int64(o.sb.Cap()) {
		c := 2*int64(o.sb.Cap()) + int64(len(s))
		if err := o.b.grow(allocSize(c)); err != nil {
			return err
		}
		o.sb.Grow(len(s))
	}
	o.sb.WriteString(s)
	return nil
}

// len is how many bytes were written.
func (o *out) len() int { return o.sb.Len() }

// String is what was written (without a copy: the builder's).
func (o *out) String() string { return o.sb.String() }
