package openai

// Tools: OpenAI's tools and tool_choice on chat completions. The tools
// are rendered by the model's own chat template (its tools variable);
// the model's answer is read for calls in its family's format
// (models.ParseToolCalls), and answered as message.tool_calls with
// finish_reason tool_calls. tool_choice required, or a named function,
// is enforced by the grammar: the output can only be one call of an
// offered function, with arguments valid for its parameters' schema, so
// that even a weak model's call parses. Streams send the calls as
// OpenAI does (index, id and name first, then the arguments).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/text"
	"github.com/stepserve/stepserve/serving"
)

// openaiTool is one of a request's tools.
type openaiTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
		Strict      *bool           `json:"strict"` // the grammar enforces the schema when it constrains
	} `json:"function"`
}

// maxTools bounds a request's tools.
const maxTools = 128

var toolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// toolSet is a request's tools as the generation uses them.
type toolSet struct {
	tools  []openaiTool
	values []any  // as the template reads them
	choice string // none, auto, required, or the function named
	format string // the format its calls are read in
}

// active reports whether the answer is read for calls.
func (ts *toolSet) active() bool { return ts != nil && ts.choice != "none" }

// parseTools reads tools and tool_choice, for a model whose template
// writes calls in format; nil when the request has no tools.
func parseTools(raw, choiceRaw json.RawMessage, format string) (*toolSet, error) {
	if empty(raw) {
		if !isNull(choiceRaw) {
			var c string
			if json.Unmarshal(choiceRaw, &c) == nil && (c == "none" || c == "auto") {
				return nil, nil
			}
			return nil, text.WithParam("tool_choice", apierr.BadRequest("tool_choice needs tools"))
		}
		return nil, nil
	}
	ts := &toolSet{choice: "auto"}
	if err := json.Unmarshal(raw, &ts.tools); err != nil {
		return nil, text.WithParam("tools", apierr.BadRequest("tools: want an array of {type: function, function: {name, description, parameters}}"))
	}
	if len(ts.tools) > maxTools {
		return nil, text.WithParam("tools", apierr.BadRequest(fmt.Sprintf("%d tools; want at most %d", len(ts.tools), maxTools)))
	}
	if err := json.Unmarshal(raw, &ts.values); err != nil {
		return nil, text.WithParam("tools", apierr.BadRequest("tools: want an array of objects"))
	}
	names := map[string]bool{}
	for i, tool := range ts.tools {
		switch {
		case tool.Type != "function":
			return nil, text.WithParam("tools", apierr.BadRequest(fmt.Sprintf("tools[%d].type %q; want function", i, apierr.ClipName(tool.Type))))
		case !toolName.MatchString(tool.Function.Name):
			return nil, text.WithParam("tools", apierr.BadRequest(fmt.Sprintf("tools[%d].function.name %q; want 1 to 64 letters, digits, _ or -", i, apierr.ClipName(tool.Function.Name))))
		case names[tool.Function.Name]:
			return nil, text.WithParam("tools", apierr.BadRequest(fmt.Sprintf("tools[%d]: function %s is given twice", i, tool.Function.Name)))
		}
		if p := bytes.TrimSpace(tool.Function.Parameters); len(p) > 0 && p[0] != '{' && !bytes.Equal(p, []byte("null")) {
			return nil, text.WithParam("tools", apierr.BadRequest(fmt.Sprintf("tools[%d].function.parameters: want a JSON Schema object", i)))
		}
		names[tool.Function.Name] = true
	}
	if !isNull(choiceRaw) {
		var c string
		if json.Unmarshal(choiceRaw, &c) == nil {
			if !slices.Contains([]string{"none", "auto", "required"}, c) {
				return nil, text.WithParam("tool_choice", apierr.BadRequest(fmt.Sprintf("tool_choice %q; want none, auto, required or {type: function, function: {name}}", apierr.ClipName(c))))
			}
			ts.choice = c
		} else {
			var named struct {
				Type     string `json:"type"`
				Function struct {
					Name string `json:"name"`
				} `json:"function"`
			}
			if err := json.Unmarshal(choiceRaw, &named); err != nil || named.Type != "function" {
				return nil, text.WithParam("tool_choice", apierr.BadRequest("tool_choice: want none, auto, required or {type: function, function: {name}}"))
			}
			if !names[named.Function.Name] {
				return nil, text.WithParam("tool_choice", apierr.BadRequest(fmt.Sprintf("tool_choice names function %q, which tools do not offer", apierr.ClipName(named.Function.Name))))
			}
			ts.choice = named.Function.Name
		}
	}
	ts.format = models.ToolFormatHermes // the most common, for a template that names none
	if format != "" {
		ts.format = format
	}
	if ts.choice != "none" && ts.choice != "auto" {
		ts.format = models.ToolFormatJSON // the grammar writes a bare call
	}
	return ts, nil
}

// constraint is the grammar a required or named tool_choice makes: one
// call {"name", "arguments"} of an offered function (the one named),
// its arguments valid for its parameters. nil for none and auto.
func (ts *toolSet) constraint() (*serving.Constraint, error) {
	if ts == nil || ts.choice == "none" || ts.choice == "auto" {
		return nil, nil
	}
	var calls []any
	for _, tool := range ts.tools {
		if ts.choice != "required" && tool.Function.Name != ts.choice {
			continue
		}
		params := any(map[string]any{"type": "object"})
		if p := bytes.TrimSpace(tool.Function.Parameters); len(p) > 0 && !bytes.Equal(p, []byte("null")) {
			params = json.RawMessage(p)
		}
		calls = append(calls, map[string]any{
			"type":                 "object",
			"properties":           map[string]any{"name": map[string]any{"const": tool.Function.Name}, "arguments": params},
			"required":             []string{"name", "arguments"},
			"additionalProperties": false,
		})
	}
	schema := calls[0]
	if len(calls) > 1 {
		schema = map[string]any{"anyOf": calls}
	}
	b, err := json.Marshal(schema)
	if err != nil {
		return nil, text.WithParam("tools", apierr.BadRequest("tools: a function's parameters are not JSON"))
	}
	return &serving.Constraint{JSONSchema: b}, nil
}

// calls reads the tool calls out of output: nil, and the output as the
// message's text, when it holds none (or a call of a function not
// offered: no malformed call is answered).
func (ts *toolSet) calls(output string) ([]toolCall, string) {
	parsed, content, ok := models.ParseToolCalls(ts.format, output)
	if !ok {
		return nil, output
	}
	out := make([]toolCall, len(parsed))
	for i, c := range parsed {
		if !slices.ContainsFunc(ts.tools, func(t openaiTool) bool { return t.Function.Name == c.Name }) {
			return nil, output
		}
		out[i] = toolCall{ID: newID("call_"), Type: "function", Function: toolFunction{Name: c.Name, Arguments: c.Arguments.(string)}}
	}
	return out, content
}

// toolCall is a call in an answer: message.tool_calls, or a stream's
// delta.tool_calls (with its index).
type toolCall struct {
	Index    *int         `json:"index,omitempty"` // a stream's delta's; none in a message`
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// historyCalls reads an assistant message's tool_calls, sent back in the
// history, for the template (arguments as objects, as transformers
// passes them).
func historyCalls(raw json.RawMessage, i int) ([]models.ToolCall, error) {
	if empty(raw) {
		return nil, nil
	}
	var calls []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &calls); err != nil {
		return nil, fmt.Errorf("messages[%d].tool_calls: want an array of {id, type: function, function: {name, arguments}}", i)
	}
	out := make([]models.ToolCall, len(calls))
	for j, c := range calls {
		var args any = c.Function.Arguments
		var obj map[string]any
		if json.Unmarshal([]byte(c.Function.Arguments), &obj) == nil {
			args = obj
		}
		out[j] = models.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: args}
	}
	return out, nil
}
