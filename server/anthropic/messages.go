package anthropic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/text"
	"github.com/stepserve/stepserve/serving"
)

// messagesRequest is the body of POST /v1/messages.
type messagesRequest struct {
	Model         string          `json:"model"`
	MaxTokens     *int            `json:"max_tokens"`
	Messages      []message       `json:"messages"`
	System        json.RawMessage `json:"system"`
	StopSequences []string        `json:"stop_sequences"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	TopK          *int            `json:"top_k"`
	Stream        bool            `json:"stream"`
	Tools         []tool          `json:"tools"`
	ToolChoice    *toolChoice     `json:"tool_choice"`
	Metadata      json.RawMessage `json:"metadata"`     // accepted, and ignored
	ServiceTier   string          `json:"service_tier"` // accepted, and ignored
	Thinking      *struct {
		Type string `json:"type"`
	} `json:"thinking"`
}

// countRequest is the body of POST /v1/messages/count_tokens.
type countRequest struct {
	Model      string          `json:"model"`
	Messages   []message       `json:"messages"`
	System     json.RawMessage `json:"system"`
	Tools      []tool          `json:"tools"`
	ToolChoice *toolChoice     `json:"tool_choice"`
	Thinking   json.RawMessage `json:"thinking"`
}

type message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// block is a content block of a message.
type block struct {
	Type         string          `json:"type"`
	Text         string          `json:"text"`
	ID           string          `json:"id"`          // tool_use
	Name         string          `json:"name"`        // tool_use
	Input        json.RawMessage `json:"input"`       // tool_use
	ToolUseID    string          `json:"tool_use_id"` // tool_result
	Content      json.RawMessage `json:"content"`     // tool_result: a string or text blocks
	IsError      bool            `json:"is_error"`    // tool_result
	CacheControl json.RawMessage `json:"cache_control"`
	Citations    json.RawMessage `json:"citations"`
}

type tool struct {
	Type         string          `json:"type"` // "custom" or none; Anthropic's server tools are refused
	Name         string          `json:"name"`
	Description  string          `json:"description"`
	InputSchema  json.RawMessage `json:"input_schema"`
	CacheControl json.RawMessage `json:"cache_control"`
}

type toolChoice struct {
	Type                   string `json:"type"` // auto, any, tool, none
	Name                   string `json:"name"`
	DisableParallelToolUse bool   `json:"disable_parallel_tool_use"`
}

// blocks reads a content field: a string (one text block) or blocks.
func blocks(raw json.RawMessage, field string) ([]block, error) {
	b := bytes.TrimSpace(raw)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return nil, fmt.Errorf("%s: want a string or an array of content blocks", field)
		}
		return []block{{Type: "text", Text: s}}, nil
	}
	var out []block
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("%s: want a string or an array of content blocks", field)
	}
	return out, nil
}

// textOf joins text blocks; another kind is refused.
func textOf(bs []block, field string) (string, error) {
	var sb strings.Builder
	for i, b := range bs {
		if b.Type != "text" {
			return "", fmt.Errorf("%s[%d]: a %q block here is not supported; send text", field, i, apierr.ClipName(b.Type))
		}
		sb.WriteString(b.Text)
	}
	return sb.String(), nil
}

// conversation is the request's system prompt and messages as the chat
// template reads them: tool_use blocks as an assistant's calls,
// tool_result blocks as tool messages.
func conversation(system json.RawMessage, msgs []message) ([]models.ChatMessage, error) {
	var out []models.ChatMessage
	if !isNull(system) {
		bs, err := blocks(system, "system")
		if err != nil {
			return nil, err
		}
		s, err := textOf(bs, "system")
		if err != nil {
			return nil, err
		}
		out = append(out, models.ChatMessage{Role: "system", Content: s})
	}
	if len(msgs) == 0 {
		return nil, fmt.Errorf("messages: want at least one message")
	}
	for i, m := range msgs {
		field := fmt.Sprintf("messages[%d].content", i)
		if m.Role != "user" && m.Role != "assistant" {
			return nil, fmt.Errorf("messages[%d].role %q; want user or assistant (the system prompt is the system field)", i, apierr.ClipName(m.Role))
		}
		bs, err := blocks(m.Content, field)
		if err != nil {
			return nil, err
		}
		var sb strings.Builder
		var calls []models.ToolCall
		for j, b := range bs {
			switch {
			case b.Type == "text":
				sb.WriteString(b.Text)
			case b.Type == "tool_use" && m.Role == "assistant":
				var input any = map[string]any{}
				if !isNull(b.Input) {
					if err := json.Unmarshal(b.Input, &input); err != nil {
						return nil, fmt.Errorf("%s[%d].input: want a JSON object", field, j)
					}
				}
				calls = append(calls, models.ToolCall{ID: b.ID, Name: b.Name, Arguments: input})
			case b.Type == "tool_result" && m.Role == "user":
				result := ""
				if !isNull(b.Content) {
					rb, err := blocks(b.Content, fmt.Sprintf("%s[%d].content", field, j))
					if err != nil {
						return nil, err
					}
					if result, err = textOf(rb, fmt.Sprintf("%s[%d].content", field, j)); err != nil {
						return nil, err
					}
				}
				if b.IsError {
					result = "Error: " + result
				}
				out = append(out, models.ChatMessage{Role: "tool", ToolCallID: b.ToolUseID, Content: result})
			default:
				return nil, fmt.Errorf("%s[%d]: a %q block in a %s message is not supported (text; tool_use from the assistant, tool_result from the user)",
					field, j, apierr.ClipName(b.Type), m.Role)
			}
		}
		if sb.Len() > 0 || len(calls) > 0 || len(bs) == 0 {
			out = append(out, models.ChatMessage{Role: m.Role, Content: sb.String(), ToolCalls: calls})
		}
	}
	return out, nil
}

// tools reads the request's tools and tool_choice; nil without tools.
func readTools(ts []tool, choice *toolChoice, format string) (*text.Tools, error) {
	if len(ts) == 0 {
		if choice != nil && choice.Type != "auto" && choice.Type != "none" {
			return nil, apierr.BadRequest("tool_choice needs tools")
		}
		return nil, nil
	}
	list := make([]text.Tool, len(ts))
	for i, t := range ts {
		if t.Type != "" && t.Type != "custom" {
			return nil, apierr.BadRequest(fmt.Sprintf("tools[%d].type %q: Anthropic's server tools do not run here; give custom tools (name, description, input_schema)", i, apierr.ClipName(t.Type)))
		}
		list[i] = text.Tool{Name: t.Name, Description: t.Description, Parameters: t.InputSchema}
	}
	name := "auto"
	if choice != nil {
		switch choice.Type {
		case "auto", "":
		case "none":
			name = "none"
		case "any":
			name = "required"
		case "tool":
			if choice.Name == "" {
				return nil, apierr.BadRequest("tool_choice type tool needs a name")
			}
			name = choice.Name
		default:
			return nil, apierr.BadRequest(fmt.Sprintf("tool_choice type %q; want auto, any, tool or none", apierr.ClipName(choice.Type)))
		}
	}
	return text.NewTools(list, name, format)
}

// messages answers POST /v1/messages.
func (s *API) messages(w http.ResponseWriter, r *http.Request) {
	text.Serve(s.c, w, r, &anthropicAPI, func(t *text.Request, body []byte) int {
		var req messagesRequest
		if err := t.DecodeStrict(body, &req); err != nil {
			return t.Fail(err)
		}
		if err := t.FindGenerative(req.Model, ""); err != nil {
			return t.Fail(unparam(err))
		}
		if req.MaxTokens == nil {
			return t.Fail(apierr.BadRequest("max_tokens is required: the most tokens to generate"))
		}
		if req.Thinking != nil && req.Thinking.Type != "disabled" {
			return t.Fail(apierr.BadRequest("thinking is not supported; leave it out or {type: disabled}"))
		}
		gr, tools, err := s.generateRequest(t, req.System, req.Messages, req.Tools, req.ToolChoice)
		if err != nil {
			return t.Fail(err)
		}
		gr.MaxTokens, gr.Temperature, gr.TopP, gr.TopK, gr.Stop = req.MaxTokens, req.Temperature, req.TopP, req.TopK, req.StopSequences
		return t.GenerateTo(gr, &writer{model: t.Model().Model().Name, stream: req.Stream, tools: tools})
	})
}

// generateRequest is the generation a request's conversation and tools
// make.
func (s *API) generateRequest(t *text.Request, system json.RawMessage, msgs []message, ts []tool, choice *toolChoice) (*serving.GenerateRequest, *text.Tools, error) {
	conv, err := conversation(system, msgs)
	if err != nil {
		return nil, nil, apierr.BadRequest(err.Error())
	}
	tools, err := readTools(ts, choice, t.Model().ToolFormat())
	if err != nil {
		return nil, nil, unparam(err)
	}
	gr := &serving.GenerateRequest{Messages: conv, Logprobs: -1}
	if tools.Active() {
		gr.Tools = tools.TemplateValues()
		if gr.Constraint, err = tools.Constraint(); err != nil {
			return nil, nil, unparam(err)
		}
	}
	return gr, tools, nil
}

// countTokens answers POST /v1/messages/count_tokens: the tokens the
// request's prompt is, as /v1/messages would read it.
func (s *API) countTokens(w http.ResponseWriter, r *http.Request) {
	text.Serve(s.c, w, r, &anthropicAPI, func(t *text.Request, body []byte) int {
		var req countRequest
		if err := t.DecodeStrict(body, &req); err != nil {
			return t.Fail(err)
		}
		if err := t.FindGenerative(req.Model, ""); err != nil {
			return t.Fail(unparam(err))
		}
		gr, _, err := s.generateRequest(t, req.System, req.Messages, req.Tools, req.ToolChoice)
		if err != nil {
			return t.Fail(err)
		}
		n, err := t.Model().CountTokens(t.Context(), gr)
		if err != nil {
			return t.Fail(err)
		}
		t.NotInference()
		return t.OK(text.Marshal(map[string]int{"input_tokens": n}), nil)
	})
}

// unparam is err without the request field OpenAI's errors name.
func unparam(err error) error {
	var pe *text.ParamError
	for {
		var ok bool
		if pe, ok = err.(*text.ParamError); !ok {
			return err
		}
		err = pe.Err
	}
}
