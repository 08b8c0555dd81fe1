package models

import (
	"os"
	"path/filepath"
	"testing"

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
	got, err := ml.Render([]ChatMessage{{"user", "What is 2+2?"}}, true)
	require.NoError(t, err)
	assert.Equal(t, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", got)
	got, err = ml.Render([]ChatMessage{{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}}, false)
	require.NoError(t, err)
	assert.Equal(t, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n", got)

	inst, err := ParseChatTemplate(alternating, map[string]any{"bos_token": "<s>", "eos_token": "</s>"})
	require.NoError(t, err)
	got, err = inst.Render([]ChatMessage{{"user", " Hi "}, {"assistant", "Hello."}, {"user", "Bye"}}, true)
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
		{[]ChatMessage{{"user", "a"}, {"user", "b"}}, "Conversation roles must alternate user/assistant/user/assistant/..."},
		{[]ChatMessage{{"tool", "a"}}, "Conversation roles must alternate"},
		{nil, "no messages"},
		{[]ChatMessage{{"", "a"}}, "message 0 has no role"},
	} {
		_, err := inst.Render(tc.msgs, true)
		assert.ErrorIs(t, err, ErrChat)
		assert.ErrorContains(t, err, tc.want)
	}
	// A template's own failure is not the request's fault.
	broken, err := ParseChatTemplate("{{ messages[0].content | nosuchfilter }}", nil)
	require.NoError(t, err)
	_, err = broken.Render([]ChatMessage{{"user", "a"}}, true)
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
		out, err := ct.Render([]ChatMessage{{"user", "x"}}, false)
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
