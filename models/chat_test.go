package models

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chatML is a ChatML template of the kind Qwen2 and SmolLM ship, written
// for this test: a default system message, each message framed by
// <|im_start|> and <|im_end|>, the assistant's turn opened on request.
const chatML = `{%- if messages[0].role != 'system' -%}
<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif -%}
{%- for message in messages -%}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}`

// alternating is an [INST] template of the kind Llama 2 and Mistral ship,
// written for this test: the BOS token first, user and assistant turns
// that must alternate (the template refuses otherwise, in its own words).
const alternating = `{{ bos_token }}
{%- for message in messages -%}
{%- if (message.role == 'user') != (loop.index0 % 2 == 0) -%}
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
{%- endif -%}
{%- if message.role == 'user' -%}
[INST] {{ message.content | trim }} [/INST]
{%- elif message.role == 'assistant' -%}
{{ ' ' + message.content | trim + eos_token }}
{%- else -%}
{{ raise_exception('Only user and assistant roles are supported!') }}
{%- endif -%}
{%- endfor -%}`

func TestChatTemplateRenders(t *testing.T) {
	ml, err := ParseChatTemplate(chatML, nil)
	require.NoError(t, err)
	got, err := ml.Render(context.Background(), []ChatMessage{{Role: "user", Content: "What is 2+2?"}}, true)
	require.NoError(t, err)
	assert.Equal(t, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", got)
	got, err = ml.Render(context.Background(), []ChatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}, {Role: "assistant", Content: "Hello."}}, false)
	require.NoError(t, err)
	assert.Equal(t, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n", got)

	inst, err := ParseChatTemplate(alternating, map[string]any{"bos_token": "<s>", "eos_token": "</s>"})
	require.NoError(t, err)
	got, err = inst.Render(context.Background(), []ChatMessage{{Role: "user", Content: " Hi "}, {Role: "assistant", Content: "Hello."}, {Role: "user", Content: "Bye"}}, true)
	require.NoError(t, err)
	assert.Equal(t, "<s>[INST] Hi [/INST] Hello.</s>[INST] Bye [/INST]", got)
}

func TestChatTemplateRefusals(t *testing.T) {
	inst, err := ParseChatTemplate(alternating, map[string]any{"bos_token": "<s>", "eos_token": "</s>"})
	require.NoError(t, err)
	for _, tc := range []struct {
		msgs []ChatMessage
		want string
	}{
		{[]ChatMessage{{Role: "user", Content: "a"}, {Role: "user", Content: "b"}}, "Conversation roles must alternate user/assistant/user/assistant/..."},
		{[]ChatMessage{{Role: "tool", Content: "a"}}, "Conversation roles must alternate"},
		{nil, "no messages"},
		{[]ChatMessage{{Role: "", Content: "a"}}, "message 0 has no role"},
	} {
		_, err := inst.Render(context.Background(), tc.msgs, true)
		assert.ErrorIs(t, err, ErrChat)
		assert.ErrorContains(t, err, tc.want)
	}
	// A template's own failure is not the request's fault.
	broken, err := ParseChatTemplate("{{ messages[0].content | nosuchfilter }}", nil)
	require.NoError(t, err)
	_, err = broken.Render(context.Background(), []ChatMessage{{Role: "user", Content: "a"}}, true)
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrChat)
	assert.ErrorContains(t, err, "chat template failed to render")

	_, err = ParseChatTemplate("{% for m in messages %}{{ m.content }}", nil)
	assert.ErrorIs(t, err, ErrConfig)
	assert.ErrorContains(t, err, "does not compile")
}

// A folder's chat template: chat_template.jinja first, else
// tokenizer_config.json's chat_template (a string, or named templates of
// which "default"), with its special tokens (strings or AddedTokens).
func TestReadChatTemplate(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "m", name), []byte(text), 0o644))
	}
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "m"), 0o755))
	root, err := os.OpenRoot(dir)
	require.NoError(t, err)
	defer root.Close()
	render := func() string {
		t.Helper()
		ct, err := ReadChatTemplate(root, "m")
		require.NoError(t, err)
		if ct == nil {
			return "<none>"
		}
		out, err := ct.Render(context.Background(), []ChatMessage{{Role: "user", Content: "x"}}, false)
		require.NoError(t, err)
		return out
	}
	assert.Equal(t, "<none>", render(), "no tokenizer_config.json, no template")
	write("tokenizer_config.json", `{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>"}`)
	assert.Equal(t, "<none>", render(), "no chat_template")
	write("tokenizer_config.json", `{"bos_token": {"content": "<s>"}, "chat_template": "{{ bos_token }}{{ messages[0].content }}"}`)
	assert.Equal(t, "<s>x", render())
	write("tokenizer_config.json", `{"eos_token": "</s>", "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ messages[0].content }}{{ eos_token }}"}]}`)
	assert.Equal(t, "x</s>", render())
	write("chat_template.jinja", "J{{ messages[0].content }}")
	assert.Equal(t, "Jx", render(), "chat_template.jinja takes precedence")

	require.NoError(t, os.Remove(filepath.Join(dir, "m", "chat_template.jinja")))
	write("tokenizer_config.json", `{"chat_template": [{"name": "rag", "template": "R"}]}`)
	_, err = ReadChatTemplate(root, "m")
	assert.ErrorIs(t, err, ErrConfig)
	assert.ErrorContains(t, err, `no template named "default"`)
	write("tokenizer_config.json", `{"chat_template": 7}`)
	_, err = ReadChatTemplate(root, "m")
	assert.ErrorIs(t, err, ErrConfig)
	assert.ErrorContains(t, err, "m/tokenizer_config.json")
	assert.ErrorContains(t, err, "chat_template: want a string, or a list of {name, template}")
}

// hostileTemplates are the red team's chat templates, and more of the
// kind, by the budget each exceeds on the load probe.
var hostileTemplates = []struct{ name, source, says string }{
	{"an endless loop", `{% for i in range(100000000) %}{{ i }}{% endfor %}`, "a list of 100000000 items"},
	{"range past int32", `{% for i in range(10000000000) %}{% endfor %}`, "a list of 10000000000 items"},
	{"a 3 GB string", `{{ 'x' * 3000000000 }}`, "a string of 3000000000 bytes"},
	{"macro recursion", `{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}`, "calls nested more than 64 deep"},
	{"three nested loops", `{% for i in range(3000) %}{% for j in range(3000) %}{% for k in range(3000) %}{% endfor %}{% endfor %}{% endfor %}`, "more than 1000000 steps"},
	{"a list that holds itself", `{% set l = [] %}{{ l.append(l) }}{{ l }}`, "values nested more than 64 deep"},
	{"1 MiB of (", "{{ " + strings.Repeat("(", 1<<20-16) + " }}", "nested more than 128 levels deep"},
}

// A template that exceeds its budget on the load probe is refused: the
// model serves without chat, its requests say why, and nothing burns.
func TestChatTemplateProbeRefusesHostileTemplates(t *testing.T) {
	for _, c := range hostileTemplates {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			ct, err := ParseChatTemplate(c.source, nil)
			t.Logf("%s: refused in %s: %s", c.name, time.Since(start), ct.Refused())
			require.NoError(t, err, "a template refused by its budget does not fail the model's load")
			require.NotNil(t, ct)
			assert.Contains(t, ct.Refused(), c.says)
			_, err = ct.Render(context.Background(), []ChatMessage{{Role: "user", Content: "hi"}}, true)
			assert.ErrorIs(t, err, ErrChatTemplateBudget)
			assert.NotErrorIs(t, err, ErrChat, "the template's fault, not the request's")
			assert.ErrorContains(t, err, "the model's chat template was refused at load: ")
			assert.ErrorContains(t, err, c.says)
		})
	}

	// Read from a folder, likewise.
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "m"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "m", "tokenizer_config.json"), []byte(`{"chat_template": "{{ 'x' * 3000000000 }}"}`), 0o644))
	root, err := os.OpenRoot(dir)
	require.NoError(t, err)
	defer root.Close()
	ct, err := ReadChatTemplate(root, "m")
	require.NoError(t, err)
	assert.Contains(t, ct.Refused(), "it exceeded its evaluation budget on a probe conversation of 4 messages: a string of 3000000000 bytes")

	// A template that does not compile for another reason fails the
	// load, as before.
	_, err = ParseChatTemplate("{% if x %}", nil)
	assert.ErrorIs(t, err, ErrConfig)
}

// Failing the probe for any reason but the budget leaves the template to
// serve: many templates refuse a system message, or a role they do not
// know, in their own words.
func TestChatTemplateProbeKeepsTemplatesThatRaise(t *testing.T) {
	for _, source := range []string{
		alternating, // refuses the probe's system message
		`{% for m in messages %}{% if m.role == 'assistant' %}{{ raise_exception('no assistants') }}{% endif %}{{ m.content }}{% endfor %}`,
		"{{ messages[0].content | nosuchfilter }}",
	} {
		ct, err := ParseChatTemplate(source, map[string]any{"bos_token": "<s>", "eos_token": "</s>"})
		require.NoError(t, err)
		assert.Empty(t, ct.Refused(), source)
	}
}

// A template that passes the probe but exceeds its budget on a bigger
// conversation fails that request with ErrChatTemplateBudget, naming the
// budget, and serves the small ones.
func TestChatTemplateBudgetOnBigInputs(t *testing.T) {
	for _, c := range []struct{ name, source, says string }{
		{"a loop per message", `{% for m in messages %}{% for i in range(30000) %}{% endfor %}{{ m.content }}{% endfor %}`, "steps"},
		{"a range of the messages", `{% for i in range(messages | length * 20000) %}{% endfor %}{{ messages[0].content }}`, "a list of"},
		{"a string of the messages", `{{ ('x' * 1000000) * (messages | length) }}{{ messages[0].content }}`, "a string of"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ct, err := ParseChatTemplate(c.source, nil)
			require.NoError(t, err)
			require.Empty(t, ct.Refused(), "passes the probe")
			_, err = ct.Render(context.Background(), probeMessages, true)
			require.NoError(t, err)
			msgs := make([]ChatMessage, 100)
			for i := range msgs {
				msgs[i] = ChatMessage{Role: "user", Content: fmt.Sprint(i)}
			}
			start := time.Now()
			_, err = ct.Render(context.Background(), msgs, true)
			t.Logf("%s: refused in %s: %v", c.name, time.Since(start), err)
			assert.ErrorIs(t, err, ErrChatTemplateBudget)
			assert.NotErrorIs(t, err, ErrChat)
			assert.ErrorContains(t, err, "the model's chat template exceeded its evaluation budget: ")
			assert.ErrorContains(t, err, c.says)
		})
	}
}

// A template that keeps a big string per message passes the probe, and
// its step budget on 2,400 messages (58M steps: 3.7 GB of strings at 64
// bytes a step), but not what a render may build in all: it is refused
// after some 16 messages' worth, quickly, without allocating gigabytes.
func TestChatTemplateAllocBudgetOnBigInputs(t *testing.T) {
	msgs := make([]ChatMessage, 2400)
	for i := range msgs {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs[i] = ChatMessage{Role: role, Content: fmt.Sprintf("message %d: %s", i, strings.Repeat("lorem ipsum ", 16))[:200]}
	}
	lim := chatLimits(msgs, nil)
	for _, c := range []struct{ name, source string }{
		{"a namespace's list", `{% set ns = namespace(l=[]) %}{% for m in messages %}{{ ns.l.append('x' * 4000000) }}{% endfor %}{{ messages[-1].content }}`},
		{"a list of the messages, repeated", `{% set l = [] %}{% for m in messages %}{{ l.append(m.content * 20000) }}{% endfor %}{{ messages[-1].content }}`},
		{"a namespace's list, added to", `{% set ns = namespace(l=[]) %}{% for m in messages %}{% set ns.l = ns.l + [m.content * 20000] %}{% endfor %}{{ messages[-1].content }}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			ct, err := ParseChatTemplate(c.source, nil)
			require.NoError(t, err)
			require.Empty(t, ct.Refused(), "passes the probe")
			_, err = ct.Render(context.Background(), probeMessages, true)
			require.NoError(t, err)

			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			_, err = ct.Render(context.Background(), msgs, true)
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			allocated := after.TotalAlloc - before.TotalAlloc
			t.Logf("%s: refused in %s, %d MB allocated: %v", c.name, took, allocated>>20, err)
			assert.ErrorIs(t, err, ErrChatTemplateBudget)
			assert.NotErrorIs(t, err, ErrChat)
			assert.ErrorContains(t, err, fmt.Sprintf("the model's chat template exceeded its evaluation budget: more than %d bytes built", lim.MaxAlloc))
			assert.Less(t, allocated, 2*uint64(lim.MaxAlloc))
		})
	}
}

// A render ends when its request does.
func TestChatTemplateRenderEndsWithItsContext(t *testing.T) {
	ct, err := ParseChatTemplate(`{% for m in messages %}{% for i in range(30000) %}{% endfor %}{{ m.content }}{% endfor %}`, nil)
	require.NoError(t, err)
	msgs := make([]ChatMessage, 2000) // 1M + 8*2000^2 steps of budget: seconds
	for i := range msgs {
		msgs[i] = ChatMessage{Role: "user", Content: "x"}
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	start := time.Now()
	_, err = ct.Render(ctx, msgs, true)
	t.Logf("ended %s after it began: %v", time.Since(start), err)
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, ErrChatTemplateBudget)
	assert.NotErrorIs(t, err, ErrChat)
}

// The shipped models' templates, and the real templates the jinja fork is
// tested on (Llama 3.2, Qwen 2 and 3, Mistral, Gemma 4, DeepSeek, ...),
// pass the probe and render the most messages a request holds (an HTTP
// request holds at most 7,168 JSON values: some 2,400 messages) within
// their budget.
func TestChatTemplateBudgetServesRealTemplates(t *testing.T) {
	sources := map[string]string{"chatML": chatML}
	shipped, err := filepath.Glob("../model_repository/*/tokenizer_config.json")
	require.NoError(t, err)
	require.NotEmpty(t, shipped)
	for _, f := range shipped {
		dir := filepath.Dir(f)
		root, err := os.OpenRoot(filepath.Dir(dir))
		require.NoError(t, err)
		ct, err := ReadChatTemplate(root, filepath.Base(dir))
		root.Close()
		require.NoError(t, err, f)
		if ct != nil {
			require.Empty(t, ct.Refused(), f)
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			var cfg tokenizerConfig
			require.NoError(t, json.Unmarshal(b, &cfg))
			sources[f], err = templateOf(cfg.ChatTemplate)
			require.NoError(t, err)
		}
	}
	real, err := filepath.Glob("../internal/jinja/testdata/templates/*.jinja")
	require.NoError(t, err)
	require.NotEmpty(t, real)
	for _, f := range real {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		sources[filepath.Base(f)] = string(b)
	}
	tokens := map[string]any{"bos_token": "<s>", "eos_token": "</s>"}
	for name, source := range sources {
		t.Run(name, func(t *testing.T) {
			ct, err := ParseChatTemplate(source, tokens)
			require.NoError(t, err)
			require.Empty(t, ct.Refused())
			for _, n := range []int{1, 4, 100, 2400, -2400} {
				words := 80 // messages of some 1,000 bytes; -2400: 2,400 of some 200
				if n < 0 {
					n, words = -n, 16
				}
				msgs := []ChatMessage{{Role: "system", Content: "You are a helpful assistant."}}
				for i := 1; i < n; i++ {
					role := "user"
					if i%2 == 0 {
						role = "assistant"
					}
					msgs = append(msgs, ChatMessage{Role: role, Content: fmt.Sprintf("message %d: %s", i, strings.Repeat("lorem ipsum ", words))})
				}
				start := time.Now()
				out, err := ct.Render(context.Background(), msgs, true)
				var be *chatBudgetError
				if errors.As(err, &be) {
					t.Fatalf("%d messages: %v", n, err)
				}
				t.Logf("%d messages: %d bytes in %s (%v)", n, len(out), time.Since(start), err)
			}
		})
	}
}
