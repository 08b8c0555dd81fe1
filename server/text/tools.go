package text

// Tools as the generation doors share them (OpenAI's chat, Anthropic's
// Messages): the functions a model may call, rendered by its chat
// template; the grammar a required or named choice makes; and the calls
// read out of its answer in its family's format (models.ParseToolCalls).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/serving"
)

// Tool is a function a model may call: its name, what it does, and the
// JSON Schema of its arguments (nil: any object).
type Tool struct {
	Name        string
	Description string
	Parameters  json.RawMessage
}

// Tools are a request's tools as its generation uses them.
type Tools struct {
	List []Tool
	// Choice is none (not rendered, the answer text), auto, required,
	// or the name of the function the answer must call.
	Choice string
	// Format is the format calls are read in: the model's, or
	// models.ToolFormatJSON where the grammar writes a bare call.
	Format string
}

// MaxTools bounds a request's tools.
const MaxTools = 128

var toolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// NewTools checks list and choice for a model whose calls are written in
// format ("" for hermes, the most common); refusals name the tools or
// tool_choice parameter.
func NewTools(list []Tool, choice, format string) (*Tools, error) {
	if len(list) > MaxTools {
		return nil, WithParam("tools", apierr.BadRequest(fmt.Sprintf("%d tools; want at most %d", len(list), MaxTools)))
	}
	names := map[string]bool{}
	for i, t := range list {
		switch {
		case !toolName.MatchString(t.Name):
			return nil, WithParam("tools", apierr.BadRequest(fmt.Sprintf("tools[%d]: name %q; want 1 to 64 letters, digits, _ or -", i, apierr.ClipName(t.Name))))
		case names[t.Name]:
			return nil, WithParam("tools", apierr.BadRequest(fmt.Sprintf("tools[%d]: function %s is given twice", i, t.Name)))
		}
		if p := bytes.TrimSpace(t.Parameters); len(p) > 0 && p[0] != '{' && !bytes.Equal(p, []byte("null")) {
			return nil, WithParam("tools", apierr.BadRequest(fmt.Sprintf("tools[%d]: the parameters want a JSON Schema object", i)))
		}
		names[t.Name] = true
	}
	switch {
	case choice == "":
		choice = "auto"
	case choice == "none" || choice == "auto" || choice == "required":
	case !names[choice]:
		return nil, WithParam("tool_choice", apierr.BadRequest(fmt.Sprintf("tool_choice names function %q, which tools do not offer", apierr.ClipName(choice))))
	}
	ts := &Tools{List: list, Choice: choice, Format: models.ToolFormatHermes}
	if format != "" {
		ts.Format = format
	}
	if choice != "none" && choice != "auto" {
		ts.Format = models.ToolFormatJSON // the grammar writes a bare call
	}
	return ts, nil
}

// Active reports whether the answer is read for calls.
func (ts *Tools) Active() bool { return ts != nil && ts.Choice != "none" }

// TemplateValues are the tools as a chat template reads them (OpenAI's
// shape, as transformers passes them).
func (ts *Tools) TemplateValues() []any {
	out := make([]any, len(ts.List))
	for i, t := range ts.List {
		fn := map[string]any{"name": t.Name}
		if t.Description != "" {
			fn["description"] = t.Description
		}
		if p := bytes.TrimSpace(t.Parameters); len(p) > 0 && !bytes.Equal(p, []byte("null")) {
			var v any
			if json.Unmarshal(p, &v) == nil {
				fn["parameters"] = v
			}
		}
		out[i] = map[string]any{"type": "function", "function": fn}
	}
	return out
}

// Constraint is the grammar a required or named choice makes: one call
// {"name", "arguments"} of an offered function (the one named), its
// arguments valid for its parameters. nil for none and auto.
func (ts *Tools) Constraint() (*serving.Constraint, error) {
	if !ts.Active() || ts.Choice == "auto" {
		return nil, nil
	}
	var calls []any
	for _, t := range ts.List {
		if ts.Choice != "required" && t.Name != ts.Choice {
			continue
		}
		params := any(map[string]any{"type": "object"})
		if p := bytes.TrimSpace(t.Parameters); len(p) > 0 && !bytes.Equal(p, []byte("null")) {
			params = json.RawMessage(p)
		}
		calls = append(calls, map[string]any{
			"type":                 "object",
			"properties":           map[string]any{"name": map[string]any{"const": t.Name}, "arguments": params},
			"required":             []string{"name", "arguments"},
			"additionalProperties": false,
		})
	}
	if len(calls) == 0 {
		return nil, WithParam("tool_choice", apierr.BadRequest("tool_choice required needs at least one tool"))
	}
	schema := calls[0]
	if len(calls) > 1 {
		schema = map[string]any{"anyOf": calls}
	}
	b, err := json.Marshal(schema)
	if err != nil {
		return nil, WithParam("tools", apierr.BadRequest("tools: a function's parameters are not JSON"))
	}
	return &serving.Constraint{JSONSchema: b}, nil
}

// Call is a call read out of an answer: the function's name and its
// arguments, a JSON object's text.
type Call struct {
	Name      string
	Arguments string
}

// Calls reads the calls out of output: nil, and the output as the
// answer's text, when it holds none (or a call of a function not
// offered: no malformed call is answered); else the calls and the text
// before them.
func (ts *Tools) Calls(output string) ([]Call, string) {
	parsed, content, ok := models.ParseToolCalls(ts.Format, output)
	if !ok {
		return nil, output
	}
	out := make([]Call, len(parsed))
	for i, c := range parsed {
		if !slices.ContainsFunc(ts.List, func(t Tool) bool { return t.Name == c.Name }) {
			return nil, output
		}
		out[i] = Call{Name: c.Name, Arguments: c.Arguments.(string)}
	}
	return out, content
}
