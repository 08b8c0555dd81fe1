package jinja

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// A budget of steps that grows with the square of the messages (58M
// steps for 2,400 of them) is time, not memory: a template that keeps a
// string of MaxBytes per message is refused on MaxAlloc, the bytes it
// builds over its whole run, quickly and without allocating much more
// than it (it kept 3.7 GB before).
func TestBudgetAllocRefusesKeepingBigStrings(t *testing.T) {
	msgs := chatMessages(2400, 200)
	lim := chatLimitsFor(msgs)
	for _, c := range []struct{ name, source string }{
		{"appended to a namespace's list", `{% set ns = namespace(l=[]) %}{% for m in messages %}{{ ns.l.append('x' * 4000000) }}{% endfor %}`},
		{"added to a namespace's list", `{% set ns = namespace(l=[]) %}{% for m in messages %}{% set ns.l = ns.l + ['x' * 4000000] %}{% endfor %}`},
		{"a list's items", `{% set l = [] %}{% for m in messages %}{{ l.append(m.content * 20000) }}{% endfor %}`},
		{"in a dict", `{% set d = {} %}{% for m in messages %}{{ d.update({('k' ~ loop.index): 'x' * 4000000}) }}{% endfor %}`},
		{"set blocks", `{% set l = [] %}{% for m in messages %}{% set s %}{{ 'x' * 4000000 }}{% endset %}{{ l.append(s) }}{% endfor %}`},
		{"macro outputs", `{% macro big() %}{{ 'x' * 4000000 }}{% endmacro %}{% set l = [] %}{% for m in messages %}{{ l.append(big()) }}{% endfor %}`},
		{"in scopes kept by macros", `{% macro keep(s) %}{% macro inner() %}{{ s }}{% endmacro %}{{ ns.l.append(inner) }}{% endmacro %}{% set ns = namespace(l=[]) %}{% for m in messages %}{{ keep('x' * 4000000) }}{% endfor %}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, steps, alloc, took, err := renderWithin(t, context.Background(), c.source, map[string]any{"messages": msgs}, lim)
			t.Logf("%s: %d steps, %d MB allocated, %s: %v", c.name, steps, alloc>>20, took, err)
			var be *BudgetError
			if !errors.As(err, &be) || be.Budget != "alloc" {
				t.Fatalf("want the alloc budget exceeded; got %v (output %d bytes)", err, len(out))
			}
			if want := fmt.Sprintf("more than %d bytes built", lim.MaxAlloc); be.Reason != want || be.Limit != lim.MaxAlloc {
				t.Errorf("got %q (limit %d); want %q", be.Reason, be.Limit, want)
			}
			if alloc > 2*uint64(lim.MaxAlloc) {
				t.Errorf("%d MB allocated; at most twice MaxAlloc (%d MB)", alloc>>20, lim.MaxAlloc>>20)
			}
		})
	}
}

// MaxAlloc bounds what a render can keep, whatever it keeps and however
// many steps it may take: each of these keeps something a step in a list
// the caller holds, and is refused on MaxAlloc having kept no more than
// it was charged, and the allocator's rounding of small objects to their
// size class (a string of 4097 bytes takes 4864).
func TestBudgetAllocBoundsWhatARenderKeeps(t *testing.T) {
	const maxAlloc = 4 << 20
	for _, keep := range []string{
		`'x' * 1000`,
		`'x' * 4097`,
		`'x' * 32769`,
		`i * 1000`,
		`i | string`,
		`i ~ 'abc'`,
		`[i]`,
		`[i, i * 1000, 'x' ~ i]`,
		`{'a': i}`,
		`{'a': i, 'b': i * 1000}`,
		`namespace(a=i)`,
		`dict(a=i)`,
		`'abc'.upper`,
		`sink.append`,
		`range(3)`,
		`('a b c' ~ i).split()`,
		`('a,b,c' ~ i).split(',')`,
		`('abc' ~ i) | list`,
		`{'a': 1}.items()`,
		`{'a': 1}.keys()`,
		`({'b': 1, 'a': 2}) | dictsort`,
		`[1, 2, 3] | batch(1)`,
		`'{"a": [1, 2, {"b": "c"}]}' | fromjson`,
		`[i] | tojson`,
		`(i ~ 'abcdef')[::2]`,
		`('é' ~ i ~ 'abcdef')[1:3]`,
		`('x' ~ i) * 10`,
		`joiner(',')`,
		`cycler(1, 2)`,
		`none | list`,
		`[i] + [i]`,
		`loop`,
		`loop.cycle`,
		`('x\ny' ~ i) | indent(4)`,
	} {
		for name, source := range map[string]string{
			"kept":               `{% for i in range(100000) %}{% for j in range(100000) %}{{ sink.append(` + keep + `) }}{% endfor %}{% endfor %}`,
			"kept in a loop":     `{% for i in range(100000) %}{% for j in range(100000) %}{% for k in [1] %}{{ sink.append(` + keep + `) }}{% endfor %}{% endfor %}{% endfor %}`,
			"kept by a macro":    `{% macro m(i) %}{% set v = ` + keep + ` %}{% macro inner() %}{{ v }}{% endmacro %}{{ sink.append(inner) }}{% endmacro %}{% for i in range(100000) %}{% for j in range(100000) %}{{ m(i) }}{% endfor %}{% endfor %}`,
			"kept by a caller":   `{% macro m() %}{{ sink.append(caller) }}{% endmacro %}{% for i in range(100000) %}{% for j in range(100000) %}{% set v = ` + keep + ` %}{% call m() %}{{ v }}{% endcall %}{% endfor %}{% endfor %}`,
			"kept in namespaces": `{% for i in range(100000) %}{% for j in range(100000) %}{% set ns = namespace() %}{% set ns.v = ` + keep + ` %}{{ sink.append(ns) }}{% endfor %}{% endfor %}`,
			"kept in a list +":   `{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% for j in range(100000) %}{% set ns.l = ns.l + [` + keep + `] %}{% if j % 1000 == 0 %}{{ sink.append(ns.l) }}{% endif %}{% endfor %}{% endfor %}`,
		} {
			t.Run(name+": "+keep, func(t *testing.T) {
				tmpl, err := Compile(source)
				if err != nil {
					t.Fatal(err)
				}
				sink := NewList(nil)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				b := newBudget(ctx, Limits{MaxSteps: 1 << 62, MaxBytes: 4 << 20, MaxAlloc: maxAlloc})
				_, err = render(tmpl.nodes, map[string]Value{"sink": sink}, b)
				runtime.GC()
				runtime.ReadMemStats(&after)
				kept := int64(after.HeapAlloc) - int64(before.HeapAlloc)
				runtime.KeepAlive(sink)
				var be *BudgetError
				if !errors.As(err, &be) || be.Budget != "alloc" {
					t.Fatalf("want the alloc budget exceeded; got %v after %d steps", err, b.steps)
				}
				// The allocator's rounding, and a little slack: the
				// heap's own noise.
				if kept > b.alloc+b.alloc/5+256<<10 {
					t.Errorf("kept %d bytes (%d items); charged %d", kept, sink.AsList().Len(), b.alloc)
				}
				t.Logf("kept %d KB in %d items (%d bytes each), charged %d KB, in %d steps", kept>>10, sink.AsList().Len(), kept/int64(max(sink.AsList().Len(), 1)), b.alloc>>10, b.steps)
			})
		}
	}
}

// indent builds its result in one go, charged its real allocation: it
// split its text into a slice of lines (16 bytes a line, charged a step
// per 64 bytes of the text: 4 MiB of newlines made a slice of 64 MiB),
// and a string for each line it indented. Its result is the same.
func TestIndentChargesItsAllocation(t *testing.T) {
	for _, c := range []struct {
		name string
		s    string
		arg  string
	}{
		{"4 MiB of newlines", strings.Repeat("\n", 4<<20), "2"},
		{"4 MiB of newlines, the first indented", strings.Repeat("\n", 4<<20), "2, true"},
		{"2M short lines", strings.Repeat("x\n", 1<<20), "1"},
		{"long lines", strings.Repeat(strings.Repeat("y", 1000)+"\n", 4000), "8"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, steps, alloc, took, err := renderWithin(t, context.Background(), `{{ s | indent(`+c.arg+`) }}`, map[string]any{"s": c.s}, Limits{MaxSteps: 1 << 40, MaxBytes: 64 << 20, MaxAlloc: 1 << 40})
			if err != nil {
				t.Fatal(err)
			}
			width, first := 0, strings.Contains(c.arg, "true")
			fmt.Sscan(c.arg, &width)
			if want := indentBySplit(c.s, width, first); out != want {
				t.Fatalf("got %d bytes; want %d", len(out), len(want))
			}
			b := newBudget(context.Background(), Limits{MaxSteps: 1 << 40, MaxBytes: 64 << 20, MaxAlloc: 1 << 40})
			if _, err := filterIndent(b, []Value{NewString(c.s), NewInt(int64(width)), NewBool(first)}, nil); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d bytes out; %d steps, %d KB charged, %d KB allocated, %s", c.name, len(out), steps, b.alloc>>10, alloc>>10, took)
			// Charged the result and the pad, and the template's
			// output; allocated about as much.
			if b.alloc < int64(len(out)) || b.alloc > allocSize(int64(len(out)))+int64(width)+1024 {
				t.Errorf("charged %d bytes for a result of %d", b.alloc, len(out))
			}
			if alloc > 4*uint64(len(out))+1<<20 {
				t.Errorf("%d bytes allocated for a result of %d", alloc, len(out))
			}
		})
	}

	// 4 MiB of newlines indented by 2 is 4 MiB of lines a step each quarter.
	_, _, _, _, err := renderWithin(t, context.Background(), `{{ s | indent(2) }}`, map[string]any{"s": strings.Repeat("\n", 4<<20)}, DefaultLimits)
	if !errors.Is(err, ErrBudget) || !strings.Contains(err.Error(), "more than 1000000 steps") {
		t.Errorf("got %v", err)
	}
	// The width of nothing to indent is not built ('x' | indent(9e9) made
	// a pad of 9 GB).
	out, _, alloc, _, err := renderWithin(t, context.Background(), `{{ 'x' | indent(9000000000) }}|{{ '' | indent(9000000000, true) }}`, nil, DefaultLimits)
	if err != nil || out != "x|" || alloc > 1<<20 {
		t.Errorf("got %q, %d bytes allocated: %v", out, alloc, err)
	}

	for _, s := range []string{"", "\n", "\n\n", "a", "a\n", "\na", "a\nb", "a\n\nb\n", " \n\t\nc", "é\nü\n"} {
		for _, first := range []bool{false, true} {
			for _, width := range []int{0, 1, 3} {
				b := newBudget(context.Background(), DefaultLimits)
				got, err := filterIndent(b, []Value{NewString(s), NewInt(int64(width)), NewBool(first)}, nil)
				if want := indentBySplit(s, width, first); err != nil || got.AsString() != want {
					t.Errorf("indent(%q, %d, %v): got %q, %v; want %q", s, width, first, got.AsString(), err, want)
				}
			}
		}
	}
}

// indentBySplit is how indent indented, before it was charged.
func indentBySplit(s string, width int, first bool) string {
	lines := strings.Split(s, "\n")
	pad := strings.Repeat(" ", width)
	for i, line := range lines {
		if (i > 0 || first) && line != "" {
			lines[i] = pad + line
		}
	}
	return strings.Join(lines, "\n")
}

// split builds its list directly, charged what it is: an item and a
// string's header a part (24 and 16 bytes).
func TestSplitChargesItsAllocation(t *testing.T) {
	for _, c := range []struct{ name, s, call string }{
		{"by a separator", strings.Repeat("ab,", 100000), `s.split(',')`},
		{"by a long separator", strings.Repeat("ab<sep>", 100000), `s.split('<sep>')`},
		{"into fields", strings.Repeat("ab \t\n", 100000), `s.split()`},
		{"into code points", strings.Repeat("aé", 50000), `s.split('')`},
	} {
		t.Run(c.name, func(t *testing.T) {
			tmpl, err := Compile(`{% set parts = ` + c.call + ` %}{{ parts | length }}`)
			if err != nil {
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			b := newBudget(context.Background(), Limits{MaxSteps: 1 << 40, MaxBytes: 64 << 20, MaxAlloc: 1 << 40})
			out, err := render(tmpl.nodes, map[string]Value{"s": NewString(c.s)}, b)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			var n int
			fmt.Sscan(out, &n)
			alloc := int64(after.TotalAlloc - before.TotalAlloc)
			t.Logf("%s: %d parts; %d KB charged, %d KB allocated", c.name, n, b.alloc>>10, alloc>>10)
			if b.alloc < int64(n)*partItemBytes || alloc > b.alloc+64<<10 {
				t.Errorf("%d parts: %d bytes charged, %d allocated", n, b.alloc, alloc)
			}
		})
	}

	// As strings.Split and strings.Fields.
	for _, s := range []string{"", ",", "a", "a,b,,c,", " a  b\t\nc ", "é,ü", "\u00a0a\u0085b", "\xffa,\xfe"} {
		for _, sep := range []string{",", "", "a", ",,"} {
			b := newBudget(context.Background(), DefaultLimits)
			got, err := builder{b}.split(s, sep, false)
			if err != nil || got.String() != FromGoValue(toAny(strings.Split(s, sep))).String() {
				t.Errorf("split(%q, %q): got %s, %v", s, sep, got, err)
			}
		}
		b := newBudget(context.Background(), DefaultLimits)
		got, err := builder{b}.split(s, "", true)
		if err != nil || got.String() != FromGoValue(toAny(strings.Fields(s))).String() {
			t.Errorf("fields(%q): got %s, %v", s, got, err)
		}
	}
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// a + b extends a's array in place where it may, so that a list grown
// by {% set x = x + [y] %} is linear; every list stays its own, as in
// Python (each output here is Jinja2's). A loop over range() does not
// build the range, and is the same loop.
func TestListConcatAndRangeLoopSemantics(t *testing.T) {
	for src, want := range map[string]string{
		"{% set a = [1, 2] %}{% set b = a + [3] %}{% set c = a + [4] %}{{ a }} {{ b }} {{ c }}":                                                                                                                                        "[1, 2] [1, 2, 3] [1, 2, 4]",
		"{% set a = [1, 2] %}{% set b = a + [3] %}{% if a.append(5) %}{% endif %}{{ a }} {{ b }}":                                                                                                                                      "[1, 2, 5] [1, 2, 3]",
		"{% set a = [1, 2] %}{% set b = a + [3] %}{% if b.append(6) %}{% endif %}{% set c = a + [4] %}{{ a }} {{ b }} {{ c }}":                                                                                                         "[1, 2] [1, 2, 3, 6] [1, 2, 4]",
		"{% set a = [1, 2, 3] %}{% set b = a + [4] %}{{ b.pop(0) }} {{ a }} {{ b }}":                                                                                                                                                   "1 [1, 2, 3] [2, 3, 4]",
		"{% set a = [1, 2, 3] %}{% set b = a + [4] %}{{ a.pop(0) }} {{ a }} {{ b }}":                                                                                                                                                   "1 [2, 3] [1, 2, 3, 4]",
		"{% set a = [1, 2, 3] %}{% set b = a + [4] %}{{ a.pop() }}{% if a.append(9) %}{% endif %} {{ a }} {{ b }}":                                                                                                                     "3 [1, 2, 9] [1, 2, 3, 4]",
		"{% set a = [1, 2, 3] %}{% set b = a + [4] %}{% if b.insert(0, 0) %}{% endif %}{% if a.insert(1, 7) %}{% endif %} {{ a }} {{ b }}":                                                                                             " [1, 7, 2, 3] [0, 1, 2, 3, 4]",
		"{% set a = [1, 2] %}{% set b = a + a %}{% set c = b + b %}{{ a }} {{ b }} {{ c }}":                                                                                                                                            "[1, 2] [1, 2, 1, 2] [1, 2, 1, 2, 1, 2, 1, 2]",
		"{% set a = [] %}{% set b = a + [] %}{% if b.append(1) %}{% endif %}{{ a }} {{ b }}":                                                                                                                                           "[] [1]",
		"{% set ns = namespace(l=[0]) %}{% for i in range(10) %}{% set x = ns.l + [i] %}{% set ns.l = ns.l + [i * 10] %}{{ x }}{% endfor %} {{ ns.l }}":                                                                                "[0, 0][0, 0, 1][0, 0, 10, 2][0, 0, 10, 20, 3][0, 0, 10, 20, 30, 4][0, 0, 10, 20, 30, 40, 5][0, 0, 10, 20, 30, 40, 50, 6][0, 0, 10, 20, 30, 40, 50, 60, 7][0, 0, 10, 20, 30, 40, 50, 60, 70, 8][0, 0, 10, 20, 30, 40, 50, 60, 70, 80, 9] [0, 0, 10, 20, 30, 40, 50, 60, 70, 80, 90]",
		"{% set ns = namespace(l=[]) %}{% set saved = [] %}{% for i in range(20) %}{% set ns.l = ns.l + [i] %}{% if i % 5 == 0 %}{% if saved.append(ns.l) %}{% endif %}{% endif %}{% endfor %}{{ ns.l }} {{ saved }}":                  "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19] [[0], [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]]",
		"{% for i in range(3) %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a', 'b') }};{% endfor %}": "1032TrueFalse31a;2121FalseFalse302b;3210FalseTrue31a;",
		"{% set a = [1, 2, 3] %}{% set b = a + [4] %}{% set c = b + [5] %}{{ b.pop() }}{% if b.append(9) %}{% endif %}{{ a }} {{ b }} {{ c }}":                                                                                         "4[1, 2, 3] [1, 2, 3, 9] [1, 2, 3, 4, 5]",
		"{% set a = [] %}{% for i in range(5) %}{% if a.append(i) %}{% endif %}{% endfor %}{{ a.pop() }}{{ a.pop(0) }}{% set b = a + [7] %}{% if a.append(8) %}{% endif %}{{ a }} {{ b }}":                                             "40[1, 2, 3, 8] [1, 2, 3, 7]",
		"{% for i in range(10, 0, -3) %}{{ i }},{% endfor %}":                                                                                                                                                                          "10,7,4,1,",
		"{% for i in range(0) %}x{% else %}empty{% endfor %}":                                                                                                                                                                          "empty",
		"{% for i in range(10) if i is even %}{{ i }}{{ loop.length }},{% endfor %}":                                                                                                                                                   "05,25,45,65,85,",
		"{% set range = [7, 8] %}{% for i in range %}{{ i }}{% endfor %}":                                                                                                                                                              "78",
		"{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}":                                                                                                                                              "01",
		"{% for a in range(2) %}{% for b in range(2) %}{{ a }}{{ b }}{{ loop.index }},{% endfor %}{{ loop.index }}|{% endfor %}":                                                                                                       "001,012,1|101,112,2|",
	} {
		tmpl, err := Compile(src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		got, err := tmpl.Render(nil)
		if err != nil || got != want {
			t.Errorf("%s:\n got %q, %v\nwant %q", src, got, err, want)
		}
	}

	// + never changes a list the caller gave, whatever room its array
	// has: renders may share their data.
	data := NewList(make([]Value, 1, 16))
	data.AsList().Items[0] = NewInt(0)
	tmpl, err := Compile(`{% set a = l + [1] %}{% set b = l + [2] %}{% set c = a + [3] %}{{ a }} {{ b }} {{ c }} {{ l }}`)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				got, err := tmpl.RenderValues(map[string]Value{"l": data})
				if want := "[0, 1] [0, 2] [0, 1, 3] [0]"; err != nil || got != want {
					t.Errorf("got %q, %v; want %q", got, err, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	if items := data.AsList().Items; len(items) != 1 || !items[:2][1].IsUndefined() {
		t.Errorf("the caller's list changed: %v", items[:2])
	}

	// A list grown by + in a loop is linear: 100,000 items in a few MB.
	_, steps, alloc, took, err := renderWithin(t, context.Background(), `{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i] %}{% endfor %}{{ ns.l | length }}`, nil, Limits{MaxSteps: 1 << 40})
	t.Logf("100000 items added by +: %d steps, %d MB allocated, %s: %v", steps, alloc>>20, took, err)
	if err != nil || alloc > 64<<20 {
		t.Errorf("%d MB allocated: %v", alloc>>20, err)
	}
}
