package models

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each family's tool-call format reads out of an output; a call half
// written, or with arguments that are no object, leaves the output text.
func TestParseToolCalls(t *testing.T) {
	for _, c := range []struct {
		format, output string
		calls          []ToolCall
		content        string
		ok             bool
	}{
		{ToolFormatHermes, "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
			[]ToolCall{{Name: "get_weather", Arguments: `{"city":"Paris"}`}}, "Let me look.", true},
		{ToolFormatHermes, "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n<tool_call>{\"name\":\"b\",\"arguments\":{\"x\":[1,2]}}</tool_call>",
			[]ToolCall{{Name: "a", Arguments: `{}`}, {Name: "b", Arguments: `{"x":[1,2]}`}}, "", true},
		{ToolFormatHermes, "<tool_call>{\"name\":\"a\",\"arguments\":{\"x\":", nil, "<tool_call>{\"name\":\"a\",\"arguments\":{\"x\":", false},
		{ToolFormatHermes, "<tool_call>{\"name\":\"a\",\"arguments\":\"x\"}</tool_call>", nil, "<tool_call>{\"name\":\"a\",\"arguments\":\"x\"}</tool_call>", false},
		{ToolFormatHermes, "no call here", nil, "no call here", false},
		{ToolFormatMistral, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"n\": 1}}]", []ToolCall{{Name: "f", Arguments: `{"n":1}`}}, "", true},
		{ToolFormatLlama3, "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"n\": 1}}", []ToolCall{{Name: "f", Arguments: `{"n":1}`}}, "", true},
		{ToolFormatLlama3, "{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"parameters\": {\"a\": \"b\"}}",
			[]ToolCall{{Name: "f", Arguments: `{}`}, {Name: "g", Arguments: `{"a":"b"}`}}, "", true},
		{ToolFormatJSON, `{"name":"f","arguments":{"n":1}}`, []ToolCall{{Name: "f", Arguments: `{"n":1}`}}, "", true},
		{ToolFormatJSON, `[{"name":"f","arguments":{}},{"name":"g","arguments":{"k":true}}]`, []ToolCall{{Name: "f", Arguments: `{}`}, {Name: "g", Arguments: `{"k":true}`}}, "", true},
		{ToolFormatJSON, `{"name":"","arguments":{}}`, nil, `{"name":"","arguments":{}}`, false},
	} {
		calls, content, ok := ParseToolCalls(c.format, c.output)
		assert.Equal(t, c.ok, ok, "%s %q", c.format, c.output)
		assert.Equal(t, c.calls, calls, "%s %q", c.format, c.output)
		assert.Equal(t, c.content, content, "%s %q", c.format, c.output)
	}
}

// A template renders the tools, an assistant's calls (arguments as
// objects) and a tool's result, as transformers passes them; its format
// is read from its source.
func TestRenderTools(t *testing.T) {
	const src = `{%- if tools %}<tools>{% for tool in tools %}{{ tool.function.name }}({{ tool.function.parameters | tojson }});{% endfor %}</tools>
{% endif %}{% for m in messages %}{{ m.role }}:{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}{% elif m.role == "tool" %}[{{ m.tool_call_id }}] {{ m.content }}{% else %}{{ m.content }}{% endif %}
{% endfor %}`
	ct, err := ParseChatTemplate(src, nil)
	require.NoError(t, err)
	assert.Equal(t, ToolFormatHermes, ct.ToolFormat())
	tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "get_weather",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}}}}
	out, err := ct.RenderTools(context.Background(), []ChatMessage{
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "call_1", Name: "get_weather", Arguments: map[string]any{"city": "Paris"}}}},
		{Role: "tool", ToolCallID: "call_1", Content: "sunny"},
	}, tools, false)
	require.NoError(t, err)
	// trim_blocks, as transformers renders: a block tag's newline goes.
	assert.Equal(t, `<tools>get_weather({"properties": {"city": {"type": "string"}}, "type": "object"});</tools>
user:Weather in Paris?assistant:<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>tool:[call_1] sunny`, out)
	out, err = ct.Render(context.Background(), []ChatMessage{{Role: "user", Content: "Hi"}}, false)
	require.NoError(t, err)
	assert.Equal(t, "user:Hi", out, "no tools: the template's tools variable is undefined")
}

// model.yaml's generation.tool_format names the format the model writes
// tool calls in, one the server reads; another is refused by name.
func TestToolFormatKey(t *testing.T) {
	m, err := Load(tinyLlama(t, "generation:\n  tool_format: mistral\n"))
	require.NoError(t, err)
	assert.Equal(t, ToolFormatMistral, m.Config.Generation.ToolFormat)
	_, err = Load(tinyLlama(t, "generation:\n  tool_format: xml\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `generation.tool_format: "xml"; want hermes, mistral or llama3_json`)
}
