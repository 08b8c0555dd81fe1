package openai

// Tools: OpenAI's tools and tool_choice on chat completions, over the
// text doors' shared tools (text.Tools): rendered by the model's own
// chat template, calls read out of its answer in its family's format and
// answered as message.tool_calls with finish_reason tool_calls;
// tool_choice required, or a named function, enforced by the grammar.
// Streams send the calls as OpenAI does (index, id and name first, then
// the arguments).

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/text"
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

// parseTools reads tools and tool_choice, for a model whose template
// writes calls in format; nil when the request has no tools.
func parseTools(raw, choiceRaw json.RawMessage, format string) (*text.Tools, error) {
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
	var tools []openaiTool
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, text.WithParam("tools", apierr.BadRequest("tools: want an array of {type: function, function: {name, description, parameters}}"))
	}
	if len(tools) > text.MaxTools {
		return nil, text.WithParam("tools", apierr.BadRequest(fmt.Sprintf("%d tools; want at most %d", len(tools), text.MaxTools)))
	}
	list := make([]text.Tool, len(tools))
	for i, t := range tools {
		if t.Type != "function" {
			return nil, text.WithParam("tools", apierr.BadRequest(fmt.Sprintf("tools[%d].type %q; want function", i, apierr.ClipName(t.Type))))
		}
		list[i] = text.Tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: t.Function.Parameters}
	}
	choice := ""
	if !isNull(choiceRaw) {
		var c string
		if json.Unmarshal(choiceRaw, &c) == nil {
			if !slices.Contains([]string{"none", "auto", "required"}, c) {
				return nil, text.WithParam("tool_choice", apierr.BadRequest(fmt.Sprintf("tool_choice %q; want none, auto, required or {type: function, function: {name}}", apierr.ClipName(c))))
			}
			choice = c
		} else {
			var named struct {
				Type     string `json:"type"`
				Function struct {
					Name string `json:"name"`
				} `json:"function"`
			}
			if err := json.Unmarshal(choiceRaw, &named); err != nil || named.Type != "function" || named.Function.Name == "" {
				return nil, text.WithParam("tool_choice", apierr.BadRequest("tool_choice: want none, auto, required or {type: function, function: {name}}"))
			}
			if !slices.ContainsFunc(list, func(t text.Tool) bool { return t.Name == named.Function.Name }) {
				return nil, text.WithParam("tool_choice", apierr.BadRequest(fmt.Sprintf("tool_choice names function %q, which tools do not offer", apierr.ClipName(named.Function.Name))))
			}
			choice = named.Function.Name
		}
	}
	return text.NewTools(list, choice, format)
}

// toolCall is a call in an answer: message.tool_calls, or a stream's
// delta.tool_calls (with its index).
type toolCall struct {
	Index    *int         `json:"index,omitempty"` // a stream's delta's; none in a message
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// answerCalls reads the calls out of output as OpenAI answers them, with
// the text beside them; nil when it holds none.
func answerCalls(ts *text.Tools, output string) ([]toolCall, string) {
	calls, content := ts.Calls(output)
	if calls == nil {
		return nil, content
	}
	out := make([]toolCall, len(calls))
	for i, c := range calls {
		out[i] = toolCall{ID: newID("call_"), Type: "function", Function: toolFunction{Name: c.Name, Arguments: c.Arguments}}
	}
	return out, content
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
		out[j] = models.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: argumentsValue(c.Function.Arguments)}
	}
	return out, nil
}

// argumentsValue is a call's arguments as a template reads them: the
// object a JSON text holds, else the text.
func argumentsValue(s string) any {
	var obj map[string]any
	if json.Unmarshal([]byte(s), &obj) == nil {
		return obj
	}
	return s
}
