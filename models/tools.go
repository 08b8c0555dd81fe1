package models

import (
	"bytes"
	"encoding/json"
	"strings"
)

// Tool calling: a chat template renders the tools a conversation may call
// (ChatTemplate.RenderTools) and the calls and results in its history;
// the model answers a call in its family's format, which ParseToolCalls
// reads out of its output.

// ToolCall is one call of a function: its id (the client's, or one made
// for the answer), the function's name, and its arguments, as decoded
// JSON for a template (a string the client sent that is not JSON stays
// a string).
type ToolCall struct {
	ID        string
	Name      string
	Arguments any
}

// The tool-call formats ParseToolCalls reads.
const (
	// ToolFormatHermes is Hermes' and Qwen2.5's: each call a JSON object
	// {"name", "arguments"} between <tool_call> and </tool_call>.
	ToolFormatHermes = "hermes"
	// ToolFormatMistral is Mistral's: [TOOL_CALLS] then a JSON array of
	// {"name", "arguments"}.
	ToolFormatMistral = "mistral"
	// ToolFormatLlama3 is Llama 3.1's JSON calls: the output a JSON
	// object {"name", "parameters"} (or "arguments"), after an optional
	// <|python_tag|>, several separated by ";".
	ToolFormatLlama3 = "llama3_json"
	// ToolFormatJSON is stepserve's own, for an output the grammar
	// constrained to a call (tool_choice required or a named function):
	// one JSON object {"name", "arguments"}, or an array of them.
	ToolFormatJSON = "json"
)

// ToolFormat is the format the model's template writes tool calls in,
// read from its source ("" when it renders no tools).
func (t *ChatTemplate) ToolFormat() string { return t.toolFormat }

// toolFormatOf reads a template's tool-call format from its source.
func toolFormatOf(source string) string {
	switch {
	case strings.Contains(source, "<tool_call>"):
		return ToolFormatHermes
	case strings.Contains(source, "[TOOL_CALLS]"):
		return ToolFormatMistral
	case strings.Contains(source, "<|python_tag|>"), strings.Contains(source, "ipython") && strings.Contains(source, "tools"):
		return ToolFormatLlama3
	}
	return ""
}

// templateValue is the message as a template reads it: OpenAI's shape,
// arguments as objects, as transformers passes them.
func (m ChatMessage) templateValue() map[string]any {
	v := map[string]any{"role": m.Role, "content": m.Content}
	if len(m.ToolCalls) > 0 {
		calls := make([]any, len(m.ToolCalls))
		for i, c := range m.ToolCalls {
			calls[i] = map[string]any{"id": c.ID, "type": "function",
				"function": map[string]any{"name": c.Name, "arguments": c.Arguments}}
		}
		v["tool_calls"] = calls
	}
	if m.ToolCallID != "" {
		v["tool_call_id"] = m.ToolCallID
	}
	if m.Name != "" {
		v["name"] = m.Name
	}
	return v
}

// jsonSize is the size of v as JSON, for the template's budget.
func jsonSize(v any) int64 {
	b, _ := json.Marshal(v)
	return int64(len(b))
}

// ParseToolCalls reads the tool calls out of a model's output in format:
// the calls, each with its arguments as a JSON object's text, and the
// text beside them (before the first call). ok is false when the output
// holds no well-formed call: it is then text, whole (a call half written,
// or with arguments that are not a JSON object, is no call).
func ParseToolCalls(format, output string) (calls []ToolCall, content string, ok bool) {
	switch format {
	case ToolFormatHermes:
		i := strings.Index(output, "<tool_call>")
		if i < 0 {
			return nil, output, false
		}
		content, rest := output[:i], output[i:]
		for strings.HasPrefix(strings.TrimSpace(rest), "<tool_call>") {
			rest = strings.TrimPrefix(strings.TrimSpace(rest), "<tool_call>")
			end := strings.Index(rest, "</tool_call>")
			if end < 0 {
				return nil, output, false
			}
			c, good := callOf(rest[:end], "arguments")
			if !good {
				return nil, output, false
			}
			calls = append(calls, c)
			rest = rest[end+len("</tool_call>"):]
		}
		if strings.TrimSpace(rest) != "" {
			return nil, output, false
		}
		return calls, strings.TrimSpace(content), true
	case ToolFormatMistral:
		i := strings.Index(output, "[TOOL_CALLS]")
		if i < 0 {
			return nil, output, false
		}
		calls, good := callList(output[i+len("[TOOL_CALLS]"):], "arguments")
		if !good {
			return nil, output, false
		}
		return calls, strings.TrimSpace(output[:i]), true
	case ToolFormatLlama3:
		body := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(output), "<|python_tag|>"))
		if !strings.HasPrefix(body, "{") {
			return nil, output, false
		}
		for part := range strings.SplitSeq(body, ";") {
			c, good := callOf(part, "parameters", "arguments")
			if !good {
				return nil, output, false
			}
			calls = append(calls, c)
		}
		return calls, "", true
	case ToolFormatJSON:
		body := strings.TrimSpace(output)
		if strings.HasPrefix(body, "[") {
			calls, good := callList(body, "arguments")
			return calls, "", good && len(calls) > 0
		}
		c, good := callOf(body, "arguments")
		if !good {
			return nil, output, false
		}
		return []ToolCall{c}, "", true
	}
	return nil, output, false
}

// callOf reads one call, a JSON object with a string name and an object
// of arguments under one of keys; its Arguments is the object's text.
func callOf(s string, keys ...string) (ToolCall, bool) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(strings.TrimSpace(s)), &obj); err != nil {
		return ToolCall{}, false
	}
	var name string
	if err := json.Unmarshal(obj["name"], &name); err != nil || name == "" {
		return ToolCall{}, false
	}
	for _, k := range keys {
		if args, ok := obj[k]; ok {
			args = bytes.TrimSpace(args)
			if len(args) == 0 || args[0] != '{' {
				return ToolCall{}, false
			}
			var compact bytes.Buffer
			if json.Compact(&compact, args) != nil {
				return ToolCall{}, false
			}
			return ToolCall{Name: name, Arguments: compact.String()}, true
		}
	}
	return ToolCall{Name: name, Arguments: "{}"}, true
}

// callList reads a JSON array of calls.
func callList(s string, keys ...string) ([]ToolCall, bool) {
	var list []json.RawMessage
	if err := json.Unmarshal([]byte(strings.TrimSpace(s)), &list); err != nil || len(list) == 0 {
		return nil, false
	}
	calls := make([]ToolCall, 0, len(list))
	for _, raw := range list {
		c, ok := callOf(string(raw), keys...)
		if !ok {
			return nil, false
		}
		calls = append(calls, c)
	}
	return calls, true
}
