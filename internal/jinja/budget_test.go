package jinja

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// renderWithin renders source with data within lim, and reports the steps
// it took, the bytes it allocated and how long it ran.
func renderWithin(t *testing.T, ctx context.Context, source string, data map[string]any, lim Limits) (string, int64, uint64, time.Duration, error) {
	t.Helper()
	out, b, alloc, took, err := renderBudget(t, ctx, source, data, lim)
	return out, b.steps, alloc, took, err
}

// renderBudget is renderWithin reporting the render's budget as it ended.
func renderBudget(t *testing.T, ctx context.Context, source string, data map[string]any, lim Limits) (string, *budget, uint64, time.Duration, error) {
	t.Helper()
	tmpl, err := Compile(source)
	if err != nil {
		t.Fatalf("compile %q: %v", clipped(source), err)
	}
	vals := make(map[string]Value, len(data))
	for k, v := range data {
		vals[k] = FromGoValue(v)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	b := newBudget(ctx, lim)
	out, err := render(tmpl.nodes, vals, b)
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	return out, b, after.TotalAlloc - before.TotalAlloc, took, err
}

func clipped(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// The red team's templates, and more of the kind: each is refused by the
// budget it exceeds, naming it, without allocating in proportion to what
// it asked for (the allocation is bounded by the steps, 64 bytes a step).
func TestBudgetRefusesHostileTemplates(t *testing.T) {
	for _, c := range []struct {
		name, source string
		budget, says string
	}{
		{"an endless loop", `{% for i in range(100000000) %}x{% endfor %}`, "bytes", "a list of 100000000 items"},
		{"range past int32", `{% for i in range(10000000000) %}{% endfor %}`, "bytes", "a list of 10000000000 items"},
		{"a 3 GB string", `{{ 'x' * 3000000000 }}`, "bytes", "a string of 3000000000 bytes; at most 4194304"},
		{"a string repeated the other way round", `{{ 3000000000 * 'xy' }}`, "bytes", "a string of 6000000000 bytes"},
		{"a repeat count past int64", `{{ 'xy' * 9000000000000000000 }}`, "bytes", "a string of"},
		{"a huge list", `{{ [0] * 10**9 }}`, "bytes", "a list of 1000000000 items"},
		{"macro recursion", `{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}`, "depth", "calls nested more than 64 deep"},
		{"mutual recursion through caller", `{% macro f() %}{% call f() %}x{% endcall %}{{ caller() }}{% endmacro %}{% call f() %}y{% endcall %}`, "depth", "calls nested more than 64 deep"},
		{"three nested loops", `{% for i in range(3000) %}{% for j in range(3000) %}{% for k in range(3000) %}{% endfor %}{% endfor %}{% endfor %}`, "steps", "more than 1000000 steps"},
		{"a loop that only counts", `{% set ns = namespace(n=0) %}{% for i in range(100000) %}{% for j in range(100) %}{% set ns.n = ns.n + 1 %}{% endfor %}{% endfor %}`, "steps", "more than 1000000 steps"},
		{"a string doubled", `{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}`, "bytes", "a string of 8388608 bytes"},
		{"a string doubled by +", `{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}`, "bytes", "a string of 8388608 bytes"},
		{"a list doubled", `{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}`, "bytes", "a list of 262144 items"},
		{"a replace that grows", `{{ ('x' * 1000000) | replace('x', 'yyyyyyyyyy') }}`, "bytes", "a string of 10000000 bytes"},
		{"a string method replace that grows", `{{ ('x' * 1000000).replace('x', 'yyyyyyyyyy') }}`, "bytes", "a string of 10000000 bytes"},
		{"replace of the empty string", `{{ ('x' * 1000000) | replace('', 'yyyyyyyyyy') }}`, "bytes", "a string of 11000010 bytes"},
		{"format that grows", `{{ ('{0}' * 1000000).format('yyyyyyyyyy') }}`, "bytes", "a string of 10000000 bytes"},
		{"indent that grows", `{{ ('x\n' * 100000) | indent(1000) }}`, "bytes", "a string of"},
		{"indent past memory", `{{ 'x\ny' | indent(9000000000) }}`, "bytes", "a string of 9000000003 bytes"},
		{"tojson indent past memory", `{{ [1, 2] | tojson(indent=9000000000) }}`, "bytes", "a string of 9000000000 bytes"},
		{"join that grows", `{{ (['x' * 100000] * 100) | join(',') }}`, "bytes", "a string of"},
		{"a huge output", `{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}`, "bytes", "an output of more than 4194304 bytes"},
		{"a huge set block", `{% set s %}{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}{% endset %}`, "bytes", "an output of more than 4194304 bytes"},
		{"a list that holds itself, printed", `{% set l = [] %}{{ l.append(l) }}{{ l }}`, "depth", "values nested more than 64 deep"},
		{"a list that holds itself, compared", `{% set l = [] %}{{ l.append(l) }}{{ l == l }}`, "depth", "values nested more than 64 deep"},
		{"a list that holds itself, in tojson", `{% set l = [] %}{{ l.append(l) }}{{ l | tojson }}`, "depth", "values nested more than 64 deep"},
		{"a list that holds itself twice", `{% set l = [] %}{{ l.append(l) }}{{ l.append(l) }}{{ l | unique | list }}`, "", ""},
		{"a namespace that holds itself", `{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}`, "depth", "values nested more than 64 deep"},
		{"appends without end", `{% set l = [0] * 170000 %}{% for i in range(10000) %}{{ l.append(i) }}{% endfor %}`, "bytes", "a list of 174763 items"},
		{"a sort of long strings", `{% set l = [] %}{% for i in range(2000) %}{{ l.append(('x' * 100000) ~ i) }}{% endfor %}{{ l | sort | first | length }}`, "", ""},
		{"long strings compared in a loop", `{% set a = 'x' * 4000000 %}{% set b = 'x' * 4000000 %}{% for i in range(100000) %}{% if a == b %}{% endif %}{% endfor %}`, "steps", "more than 1000000 steps"},
		{"long strings indexed in a loop", `{% set a = 'é' * 2000000 %}{% for i in range(100000) %}{{ a[-1] }}{% endfor %}`, "steps", "more than 1000000 steps"},
		{"long strings read as numbers in a loop", `{% set a = '1' * 4000000 %}{% for i in range(1000) %}{% for j in range(1000) %}{% if a > 5 %}{% endif %}{% endfor %}{% endfor %}`, "steps", "more than 1000000 steps"},
		{"a slice past the ends", `{{ ([1, 2, 3][-1000000000000000000:1000000000000000000:2]) }}{{ ('é' * 10)[-1000000000000000000:1000000000000000000:3] }}`, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, steps, alloc, took, err := renderWithin(t, context.Background(), c.source, nil, DefaultLimits)
			t.Logf("%s: %d steps, %d MB allocated, %s: %v", c.name, steps, alloc>>20, took, err)
			if c.budget == "" {
				if err != nil && !errors.Is(err, ErrBudget) {
					t.Fatalf("want a render or a budget error; got %v", err)
				}
				_ = out
			} else {
				var be *BudgetError
				if !errors.As(err, &be) || !errors.Is(err, ErrBudget) {
					t.Fatalf("want a budget error; got %v (output %d bytes)", err, len(out))
				}
				if be.Budget != c.budget || !strings.Contains(err.Error(), c.says) {
					t.Errorf("want the %s budget saying %q; got %s: %v", c.budget, c.says, be.Budget, err)
				}
			}
			if steps > DefaultLimits.MaxSteps {
				t.Errorf("%d steps taken; at most %d", steps, DefaultLimits.MaxSteps)
			}
			// 64 bytes a step, and the strings and lists themselves
			// (each under MaxBytes, its doubling growth, and twice
			// for what a step charges only once: its copy).
			if alloc > 200<<20 {
				t.Errorf("%d MB allocated", alloc>>20)
			}
		})
	}
}

// A render stops when its context ends, within ctxCheckEvery steps.
func TestBudgetContextStopsARender(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, steps, _, took, err := renderWithin(t, ctx,
		`{% for i in range(10000) %}{% for j in range(10000) %}{% for k in range(10000) %}{% endfor %}{% endfor %}{% endfor %}`,
		nil, Limits{MaxSteps: 1 << 62})
	t.Logf("stopped after %d steps, %s: %v", steps, took, err)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("want the context's error; got %v", err)
	}
	if errors.Is(err, ErrBudget) {
		t.Errorf("a cancelled render is not a budget exceeded: %v", err)
	}

	// Ended before it begins: the first check refuses it.
	done, cancel2 := context.WithCancel(context.Background())
	cancel2()
	_, steps, _, _, err = renderWithin(t, done, `{% for i in range(100) %}{% for j in range(1000) %}x{% endfor %}{% endfor %}`, nil, Limits{MaxSteps: 1 << 62})
	if !errors.Is(err, context.Canceled) || steps > 2*ctxCheckEvery {
		t.Errorf("got %v after %d steps", err, steps)
	}
}

// Limits' zero fields are DefaultLimits', and each limit holds as given.
func TestBudgetLimits(t *testing.T) {
	_, _, _, _, err := renderWithin(t, context.Background(), `{% for i in range(100) %}{% endfor %}`, nil, Limits{MaxSteps: 50})
	if !errors.Is(err, ErrBudget) || !strings.Contains(err.Error(), "more than 50 steps") {
		t.Errorf("got %v", err)
	}
	_, _, _, _, err = renderWithin(t, context.Background(), `{{ 'x' * 101 }}`, nil, Limits{MaxBytes: 100})
	if !errors.Is(err, ErrBudget) || !strings.Contains(err.Error(), "a string of 101 bytes; at most 100") {
		t.Errorf("got %v", err)
	}
	out, _, _, _, err := renderWithin(t, context.Background(), `{{ 'x' * 100 }}`, nil, Limits{MaxBytes: 100})
	if err != nil || len(out) != 100 {
		t.Errorf("got %d bytes, %v", len(out), err)
	}
	_, _, _, _, err = renderWithin(t, context.Background(), `{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}`, nil, Limits{MaxDepth: 3})
	if !errors.Is(err, ErrBudget) || !strings.Contains(err.Error(), "calls nested more than 3 deep") {
		t.Errorf("got %v", err)
	}
	_, _, _, _, err = renderWithin(t, context.Background(), `{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(2) }}`, nil, Limits{MaxDepth: 3})
	if err != nil {
		t.Errorf("got %v", err)
	}
	// Within DefaultLimits when zero.
	_, _, _, _, err = renderWithin(t, context.Background(), `{% for i in range(3000) %}{% for j in range(3000) %}{% endfor %}{% endfor %}`, nil, Limits{})
	if !errors.Is(err, ErrBudget) || !strings.Contains(err.Error(), "more than 1000000 steps") {
		t.Errorf("got %v", err)
	}
	// Render and RenderValues too.
	tmpl, err := Compile(`{{ 'x' * 3000000000 }}`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmpl.Render(nil); !errors.Is(err, ErrBudget) {
		t.Errorf("Render: got %v", err)
	}
	if _, err := tmpl.RenderValues(nil); !errors.Is(err, ErrBudget) {
		t.Errorf("RenderValues: got %v", err)
	}
}

// Templates nested past MaxNesting are refused at compile time, with an
// error that wraps ErrBudget, quickly: the parser recursed per level (1
// MiB of "(" was a fatal stack overflow) and trimming was quadratic in
// the tags.
func TestCompileRefusesDeepNesting(t *testing.T) {
	mib := 1 << 20
	for _, c := range []struct {
		name, source string
		refused      bool
	}{
		{"1 MiB of (", "{{ " + strings.Repeat("(", mib) + " }}", true},
		{"1 MiB of [", "{{ " + strings.Repeat("[", mib) + " }}", true},
		{"1 MiB of not", "{{ " + strings.Repeat("not ", mib/4) + "x }}", true},
		{"1 MiB of -", "{{ " + strings.Repeat("-", mib) + "x }}", true},
		{"a chain of 300000 ~", "{{ x" + strings.Repeat(" ~ x", 300000) + " }}", true},
		{"a chain of 300000 filters", "{{ x" + strings.Repeat("|trim", 170000) + " }}", true},
		{"a chain of 300000 attributes", "{{ x" + strings.Repeat(".a", 300000) + " }}", true},
		{"nested ifs", strings.Repeat("{% if x %}", 100000) + strings.Repeat("{% endif %}", 100000), true},
		{"nested fors", strings.Repeat("{% for x in y %}", 60000) + strings.Repeat("{% endfor %}", 60000), true},
		{"nested macros", strings.Repeat("{% macro m() %}", 60000) + strings.Repeat("{% endmacro %}", 60000), true},
		{"1 MiB of comments", strings.Repeat("{##}", mib/4), false},
		{"1 MiB of statements", strings.Repeat("{%- set x = 1 -%}", mib/18), false},
		{"128 nested ifs", strings.Repeat("{% if x %}", MaxNesting) + strings.Repeat("{% endif %}", MaxNesting), false},
		{"an expression 100 brackets deep", "{{ " + strings.Repeat("(", 100) + "1" + strings.Repeat(")", 100) + " }}", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			_, err := Compile(c.source)
			t.Logf("%s: %s: %v", c.name, time.Since(start), err)
			if !c.refused {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var be *BudgetError
			if !errors.As(err, &be) || be.Budget != "nesting" || !strings.Contains(err.Error(), fmt.Sprintf("nested more than %d levels deep", MaxNesting)) {
				t.Fatalf("want a nesting error; got %v", err)
			}
		})
	}
}

// chatMessages is a conversation of n messages: a system message, then
// users and assistants taking turns, each content some bytes long.
func chatMessages(n, bytes int) []any {
	content := strings.Repeat("lorem ipsum ", bytes/12+1)[:bytes]
	msgs := []any{map[string]any{"role": "system", "content": "You are a helpful assistant."}}
	for i := 1; i < n; i++ {
		role := "user"
		if i%2 == 0 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]any{"role": role, "content": fmt.Sprintf("%d %s", i, content)})
	}
	return msgs
}

// The real templates under testdata/templates render conversations of
// thousands of messages (as many as an HTTP request of the server holds)
// within budgets that only a template looping beyond its input meets:
// those linear in the messages within DefaultLimits' million steps; those
// that look back over the conversation for each message (Gemma 4's,
// DeepSeek V4's) within a few steps per pair of messages (stepserve's
// models package gives a template 10 more per pair). What they build is
// linear in the messages, whatever their steps: well within the 64 MiB
// and 4 bytes per byte of the messages that the models package gives
// MaxAlloc (the most any took for 2,400 messages is logged).
func TestBudgetLeavesRealTemplatesRoom(t *testing.T) {
	files, err := filepath.Glob("testdata/templates/*.jinja")
	if err != nil || len(files) == 0 {
		t.Fatalf("no templates under testdata/templates: %v", err)
	}
	for _, file := range files {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(strings.TrimSuffix(filepath.Base(file), ".jinja"), func(t *testing.T) {
			steps, alloc := map[int]int64{}, map[int]int64{}
			for _, n := range []int{4, 1200, 2400, -2400} {
				size := 1000
				if n < 0 { // 2,400 messages of 200 bytes
					n, size = -n, 200
				}
				msgs := chatMessages(n, size)
				data := map[string]any{
					"messages": msgs, "add_generation_prompt": true,
					"bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false,
				}
				out, b, _, took, err := renderBudget(t, context.Background(), string(src), data, Limits{MaxSteps: 1 << 40, MaxBytes: 1 << 30, MaxAlloc: 1 << 40})
				if err != nil {
					t.Fatalf("%d messages: %v", n, err)
				}
				if size == 1000 {
					steps[n], alloc[n] = b.steps, b.alloc
				}
				t.Logf("%d messages of %d bytes: %d steps (%.0f a message), %d KB built, %d bytes out, %s", n, size, b.steps, float64(b.steps)/float64(n), b.alloc>>10, len(out), took)
				if room := chatLimitsFor(msgs).MaxAlloc; b.alloc > room/2 {
					t.Errorf("%d messages of %d bytes: %d bytes built; the models package gives %d", n, size, b.alloc, room)
				}
			}
			if growth := float64(alloc[2400]) / float64(alloc[1200]); growth > 2.5 {
				t.Errorf("built x%.1f for twice as many messages", growth)
			}
			if growth := float64(steps[2400]) / float64(steps[1200]); growth < 2.5 {
				if steps[2400] > DefaultLimits.MaxSteps {
					t.Errorf("linear in the messages (x%.1f for twice as many), yet %d steps for 2400 of them", growth, steps[2400])
				}
			} else if perPair := float64(steps[2400]) / (2400 * 2400); perPair > 8 {
				t.Errorf("%.1f steps per pair of messages", perPair)
			} else {
				t.Logf("quadratic in the messages: %.1f steps per pair", perPair)
			}
		})
	}
}

// What the fork changed of the original's semantics, towards Python's
// Jinja2 (each output here is Jinja2's): slices clamped, ** of ints an
// int, * repeating either way round (a negative count: nothing, where the
// original panicked), tojson(indent) as json.dumps writes it.
func TestForkSemantics(t *testing.T) {
	for src, want := range map[string]string{
		"{{ [1,2,3,4,5][-100::2] }}": "[1, 3, 5]",
		"{{ [1,2,3][10:-10:-1] }}":   "[3, 2, 1]",
		"{{ [1,2,3][5:0:-2] }}":      "[3]",
		"{{ 'abcdef'[::-2] }}":       "fdb",
		"{{ 'héllo'[1:3] }}":         "él",
		"{{ 'héllo'[-1] }}":          "o",
		"{{ 'héllo'[::-1] }}":        "olléh",
		"{{ 2 ** 10 }}":              "1024",
		"{{ 2 ** -1 }}":              "0.5",
		"{{ [1] * 3 }}":              "[1, 1, 1]",
		"{{ 3 * 'ab' }}":             "ababab",
		"{{ 'ab' * -1 }}":            "",
		"{{ [] * 1000000000000 }}":   "[]",
		"{{ '' * 1000000000000 }}":   "",
		`{{ {'a': [1, {'b': 'c'}], 'd': 2} | tojson(indent=2) }}`: "{\n  \"a\": [\n    1,\n    {\n      \"b\": \"c\"\n    }\n  ],\n  \"d\": 2\n}",
		"{{ [] | tojson(indent=2) }}":                             "[]",
		"{{ [1,2] | tojson(indent=2, separators=(',', ': ')) }}":  "[\n  1,\n  2\n]",
		"{{ ['<a&b>'] | tojson }}":                                `["<a&b>"]`,
	} {
		tmpl, err := Compile(src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		got, err := tmpl.Render(nil)
		if err != nil || got != want {
			t.Errorf("%s: got %q, %v; want %q", src, got, err, want)
		}
	}

	// A list that holds itself, outside a render: cut, and unequal.
	l := NewList(nil)
	l.AsList().Append(l)
	if s := l.String(); !strings.HasSuffix(s, "...") || len(s) > 2<<20 {
		t.Errorf("String: %d bytes, %q...", len(s), clipped(s))
	}
	if l.Equals(l) {
		t.Errorf("Equals of a list that holds itself")
	}
}

// chatLimitsFor are the limits stepserve's models package renders msgs
// within (models.chatLimits): steps that grow with the square of the
// messages, bytes and allocation that grow with their size only.
func chatLimitsFor(msgs []any) Limits {
	n, size := int64(len(msgs)), int64(0)
	for _, m := range msgs {
		mm := m.(map[string]any)
		size += int64(len(mm["role"].(string)) + len(mm["content"].(string)))
	}
	return Limits{
		MaxSteps: 1_000_000 + 10*n*n + size/4,
		MaxBytes: 4<<20 + size,
		MaxDepth: 64,
		MaxAlloc: 64<<20 + 4*size,
	}
}
