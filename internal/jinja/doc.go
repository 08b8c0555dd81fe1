// Package jinja is a Jinja template engine purpose-built for LLM chat
// templates: a fork of github.com/ardanlabs/jinja v1.8.0 (Apache-2.0,
// Copyright 2026 Ardan Labs; its LICENSE is beside this file) that adds
// an evaluation budget.
//
// Why a fork: chat templates come with the model folders an operator
// serves (tokenizer_config.json's chat_template), and the original has
// no limits at all. A template of {% for i in range(100000000) %} burns
// CPU for ever, {{ 'x' * 3000000000 }} allocates 3 GB (a fatal "out of
// memory" under an address-space cap), a macro calling itself overflows
// the stack, and 1 MiB of "(" overflows it at compile time (fatal
// errors, not panics: the whole server goes). Newer versions (v1.9 and
// on) need Go 1.27 and have no limits either.
//
// What was changed, and why:
//
//   - Limits, DefaultLimits, RenderContext, ErrBudget and BudgetError are
//     new (budget.go). Every node executed, expression evaluated and loop
//     iteration costs a step; building or scanning a string or a list
//     costs a step per 64 bytes of it besides (a list item counts as 24
//     bytes), so a bounded number of steps is a bounded amount of CPU
//     (and of allocation: see MaxAlloc below for why that was not enough).
//     Sizes are checked before the allocation: repetition
//     (*), concatenation (+ and ~), range, replace, join, indent, format,
//     escape, split, tojson, a list's append and insert, dict.update.
//     Macro and caller() calls nest at most MaxDepth deep. The context is
//     read every 1024 steps. Render and RenderValues run within
//     DefaultLimits (they had none); the first budget error is sticky,
//     so a path that drops an error (tojson's NaN handling) cannot carry
//     on for free, and a panic in a render is an error.
//   - Limits.MaxAlloc bounds what a render builds over its whole run, the
//     memory it can hold at once (budget.go): the steps bound time, and a
//     budget of steps that grows with a conversation's square (the
//     models package's: 58M steps for 2,400 messages) let a template keep
//     a string of MaxBytes per message, 3.7 GB. Every allocation a
//     template can keep is charged before it is made, garbage or not:
//     strings and lists where steps are charged by size; a list's growth
//     (append and insert double it, charged as they do), a dict's and a
//     scope's entries (namespace attributes, dict literals, update, set,
//     macro arguments), what an item boxes (a number, a string's header,
//     a closure), closures (macros, callers, joiners), loop variables,
//     and outputs as they grow (a strings.Builder, whose String does not
//     copy). Exceeding it is a BudgetError of budget "alloc", "more than
//     N bytes built". So that real templates stay linear in it, what
//     made them quadratic in garbage is gone: a loop over range() makes
//     its numbers as it goes rather than a list of them (Gemma 4's and
//     DeepSeek V4's templates loop over range(i) at each message); a + b
//     extends a's array in place where a may grow and no other list has
//     (List's tail; every list stays its own: one that would change its
//     items in place, insert or pop, copies them first), so
//     {% set x = x + [y] %} in a loop is linear (Mistral Medium 3.5's);
//     loop.cycle is one callable per loop, not one per iteration.
//   - indent and split build their results directly, charged what they
//     build: indent split its text into a slice of lines (16 bytes a
//     line, charged a step per 64 bytes of text: 4 MiB of newlines made
//     64 MiB) and a string per line; it now writes the result once, a
//     step per four lines besides its bytes, and builds no pad where no
//     line is indented ('x' | indent(9000000000) made a pad of 9 GB).
//     split built a []string and then the list (40 bytes a part, charged
//     24). tojson checks its output's size as it grows and charges each
//     string it encodes (it charged the whole output so far per string,
//     quadratic steps); fromjson charges the values it makes; map without
//     an attribute copies its list rather than sharing its array.
//   - Walks over values (printing a list or a dict, ==, in, tojson,
//     unique) are charged per value and bounded by MaxDepth (walk.go): a
//     template can build a list that holds itself ({{ l.append(l) }}),
//     which the original printed by recursing until the stack overflowed.
//     Value.String and Value.Equals, called outside a render, are cut
//     past 64 levels or 1 MiB.
//   - Built-ins take the render's budget: Callable has an unexported
//     budget-aware implementation beside Fn (Fn still works, within
//     DefaultLimits); the signatures of the internal filter functions
//     changed accordingly.
//   - Compiling refuses a template nested more than MaxNesting deep
//     (blocks in blocks, or an expression's brackets, unary operators and
//     chains), with an error wrapping ErrBudget: the parser and the
//     evaluator recurse per level. applyTrimming finds each tag's
//     neighbouring text in linear time; it searched for it from every
//     tag, quadratic in a template of tags with nothing between them
//     (1 MiB of {##} took 44 s to compile).
//   - Semantics changed only where the bounds needed it, towards
//     Python's: a slice's bounds are clamped as slice.indices clamps them
//     (the original iterated over whatever range the template gave, so
//     [-10**18:10**18:2] ran for ever); ** of two ints is an int, and *
//     repeats a string or a list by an int either way round, a negative
//     count giving an empty one (the original panicked); indexing a
//     string by code point does not convert the whole string to runes;
//     a string read as a number (int, float, comparisons) is read up to
//     its first 64 bytes; tojson(indent=N) is written by the same bounded
//     encoder as tojson, as Python's json.dumps writes it (the original
//     went through encoding/json, unbounded, sorting keys and escaping
//     HTML).
//
// The library's own tests came along (jinja_test.go, requests_test.go,
// slice_alloc_test.go, bench_test.go, testdata/ and
// scripts/render_python.py): requests_test.go compares every template
// under testdata/templates rendered for every request under
// testdata/requests with Python Jinja2's rendering, byte for byte, and
// runs the reference with uv as it did, or with a python3 that has
// jinja2 installed. budget_test.go tests the budget.
package jinja
