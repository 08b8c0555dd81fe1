package openai

// OpenAI's Responses API, for language models:
//
//	POST   /v1/responses       a response, whole or streamed (its events)
//	GET    /v1/responses/{id}  a stored response
//	DELETE /v1/responses/{id}  forgets it
//
// The input (a string, or items: messages of text parts, function calls
// and their outputs) and the instructions become chat messages rendered
// by the model's template; tools of type function, tool_choice and
// text.format (json_schema, json_object) run as on chat completions. A
// response is kept only where store is not false, in a bounded store
// (responseStore), for previous_response_id and GET.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/text"
	"github.com/stepserve/stepserve/serving"
)

// responsesRequest is the body of POST /v1/responses.
type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Temperature        *float64        `json:"temperature"`
	TopP               *float64        `json:"top_p"`
	TopLogprobs        *int            `json:"top_logprobs"`
	Stream             bool            `json:"stream"`
	StreamOptions      json.RawMessage `json:"stream_options"`
	Store              *bool           `json:"store"`
	PreviousResponseID string          `json:"previous_response_id"`
	Text               *struct {
		Format    json.RawMessage `json:"format"`
		Verbosity string          `json:"verbosity"`
	} `json:"text"`
	Tools             json.RawMessage `json:"tools"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`
	MaxToolCalls      *int            `json:"max_tool_calls"`
	Metadata          json.RawMessage `json:"metadata"`
	User              string          `json:"user"`
	Truncation        string          `json:"truncation"`
	Reasoning         json.RawMessage `json:"reasoning"`
	Include           []string        `json:"include"`
	Background        bool            `json:"background"`
	ServiceTier       string          `json:"service_tier"`      // accepted, and ignored
	PromptCacheKey    string          `json:"prompt_cache_key"`  // accepted, and ignored
	SafetyIdentifier  string          `json:"safety_identifier"` // accepted, and ignored
	// Beside OpenAI's keys, as on chat: a seed.
	Seed *int64 `json:"seed"`
}

// inputItem is one item of input: a message (role and content), a
// function call the model made, or a function call's output.
type inputItem struct {
	Type    string          `json:"type"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	ID      string          `json:"id"`
	Status  string          `json:"status"`
	// function_call and function_call_output
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// responseTool is a tool of the Responses API: a function, flat.
type responseTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      *bool           `json:"strict"`
}

func badParam(param, format string, args ...any) error {
	return text.WithParam(param, apierr.BadRequest(fmt.Sprintf(format, args...)))
}

// partsText is a content field's text: a string, or text parts of the
// types named.
func partsText(raw json.RawMessage, field string, types ...string) (string, error) {
	b := bytes.TrimSpace(raw)
	if len(b) == 0 || bytes.Equal(b, []byte("null")) {
		return "", nil
	}
	if b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return "", fmt.Errorf("%s: want a string or an array of text parts", field)
		}
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(b, &parts); err != nil {
		return "", fmt.Errorf("%s: want a string or an array of text parts", field)
	}
	var sb strings.Builder
	for j, p := range parts {
		if !slices.Contains(types, p.Type) {
			return "", fmt.Errorf("%s[%d]: type %q is not supported; this model takes %s parts", field, j, apierr.ClipName(p.Type), strings.Join(types, " and "))
		}
		sb.WriteString(p.Text)
	}
	return sb.String(), nil
}

// inputMessages reads input: a string (a user message), or items;
// history is what comes before it (previous_response_id's), whose calls
// name the functions its outputs answer.
func inputMessages(raw json.RawMessage, history []models.ChatMessage) ([]models.ChatMessage, error) {
	b := bytes.TrimSpace(raw)
	if len(b) == 0 || bytes.Equal(b, []byte("null")) {
		return nil, nil
	}
	if b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return nil, badParam("input", "input: want a string or an array of items")
		}
		return []models.ChatMessage{{Role: "user", Content: s}}, nil
	}
	var items []inputItem
	if err := json.Unmarshal(b, &items); err != nil {
		return nil, badParam("input", "input: want a string or an array of items (messages, function_call, function_call_output)")
	}
	var out []models.ChatMessage
	names := map[string]string{} // a call's function, by call_id
	for _, m := range history {
		for _, c := range m.ToolCalls {
			names[c.ID] = c.Name
		}
	}
	for i, it := range items {
		typ := it.Type
		if typ == "" && it.Role != "" {
			typ = "message"
		}
		switch typ {
		case "message":
			if !slices.Contains([]string{"user", "assistant", "system", "developer"}, it.Role) {
				return nil, badParam("input", "input[%d].role %q; want user, assistant, system or developer", i, apierr.ClipName(it.Role))
			}
			types := []string{"input_text", "text"}
			if it.Role == "assistant" {
				types = []string{"output_text", "text", "input_text"}
			}
			c, err := partsText(it.Content, fmt.Sprintf("input[%d].content", i), types...)
			if err != nil {
				return nil, text.WithParam("input", apierr.BadRequest(err.Error()))
			}
			out = append(out, models.ChatMessage{Role: it.Role, Content: c})
		case "function_call":
			if it.Name == "" || it.CallID == "" {
				return nil, badParam("input", "input[%d]: a function_call needs call_id and name", i)
			}
			names[it.CallID] = it.Name
			call := models.ToolCall{ID: it.CallID, Name: it.Name, Arguments: argumentsValue(it.Arguments)}
			if n := len(out); n > 0 && out[n-1].Role == "assistant" && out[n-1].ToolCallID == "" {
				out[n-1].ToolCalls = append(out[n-1].ToolCalls, call) // the calls of one turn
			} else {
				out = append(out, models.ChatMessage{Role: "assistant", ToolCalls: []models.ToolCall{call}})
			}
		case "function_call_output":
			if it.CallID == "" {
				return nil, badParam("input", "input[%d]: a function_call_output needs the call_id it answers", i)
			}
			o, err := partsText(it.Output, fmt.Sprintf("input[%d].output", i), "input_text", "output_text", "text")
			if err != nil {
				return nil, text.WithParam("input", apierr.BadRequest(err.Error()))
			}
			out = append(out, models.ChatMessage{Role: "tool", Content: o, ToolCallID: it.CallID, Name: names[it.CallID]})
		case "reasoning":
			// Another model's reasoning, sent back: this model writes
			// none and its template renders none.
		default:
			return nil, badParam("input", "input[%d].type %q is not supported; want message, function_call or function_call_output", i, apierr.ClipName(typ))
		}
	}
	return out, nil
}

// responseTools reads the Responses API's tools and tool_choice (flat
// functions) in chat's shapes.
func responseTools(raw, choiceRaw json.RawMessage, format string) (*text.Tools, error) {
	var tools []responseTool
	if !empty(raw) {
		if err := json.Unmarshal(raw, &tools); err != nil {
			return nil, badParam("tools", "tools: want an array of {type: function, name, description, parameters}")
		}
	}
	chat := make([]openaiTool, len(tools))
	for i, t := range tools {
		if t.Type != "function" {
			return nil, badParam("tools", "tools[%d].type %q is not supported; want function (no hosted tools run here)", i, apierr.ClipName(t.Type))
		}
		chat[i].Type = "function"
		chat[i].Function.Name, chat[i].Function.Description, chat[i].Function.Parameters = t.Name, t.Description, t.Parameters
	}
	choice := choiceRaw
	if !isNull(choiceRaw) {
		var named struct {
			Type string `json:"type"`
			Name string `json:"name"`
		}
		if json.Unmarshal(choiceRaw, &named) == nil && named.Type != "" {
			if named.Type != "function" || named.Name == "" {
				return nil, badParam("tool_choice", "tool_choice: want none, auto, required or {type: function, name}")
			}
			choice, _ = json.Marshal(map[string]any{"type": "function", "function": map[string]string{"name": named.Name}})
		}
	}
	var chatRaw json.RawMessage
	if len(chat) > 0 {
		chatRaw, _ = json.Marshal(chat)
	}
	return parseTools(chatRaw, choice, format)
}

// textFormat reads text.format into the constraint it asks for.
func textFormat(raw json.RawMessage) (*serving.Constraint, error) {
	if isNull(raw) {
		return nil, nil
	}
	var f struct {
		Type   string          `json:"type"`
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
		Strict *bool           `json:"strict"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, badParam("text.format", "text.format: want {type: text}, {type: json_object} or {type: json_schema, name, schema}")
	}
	switch f.Type {
	case "", "text":
		return nil, nil
	case "json_object":
		return &serving.Constraint{JSONObject: true}, nil
	case "json_schema":
		if isNull(f.Schema) {
			return nil, badParam("text.format", "text.format json_schema needs schema: the JSON Schema the output follows")
		}
		return &serving.Constraint{JSONSchema: f.Schema}, nil
	}
	return nil, badParam("text.format", "text.format.type %q; want text, json_object or json_schema", apierr.ClipName(f.Type))
}

func (s *API) responses(w http.ResponseWriter, r *http.Request) {
	text.Serve(s.c, w, r, &openaiAPI, func(t *text.Request, body []byte) int {
		var req responsesRequest
		if err := t.DecodeStrict(body, &req); err != nil {
			return t.Fail(text.OrParam("input", err))
		}
		if err := t.FindGenerative(req.Model, ""); err != nil {
			return t.Fail(err)
		}
		switch {
		case req.Background:
			return t.Fail(badParam("background", "background responses are not run here; leave it out or false"))
		case req.Truncation != "" && req.Truncation != "disabled":
			return t.Fail(badParam("truncation", "truncation %q; want disabled (a prompt past max_model_len is refused)", apierr.ClipName(req.Truncation)))
		case !isNull(req.Reasoning) && !bytes.Equal(bytes.TrimSpace(req.Reasoning), []byte("{}")):
			return t.Fail(badParam("reasoning", "reasoning options are not supported: this model writes no reasoning; leave it out"))
		case len(req.Include) > 0:
			return t.Fail(badParam("include", "include %q is not supported; leave it out", apierr.ClipName(req.Include[0])))
		case req.TopLogprobs != nil:
			return t.Fail(badParam("top_logprobs", "top_logprobs is not answered by the Responses API here; use chat completions' logprobs"))
		case req.MaxToolCalls != nil && *req.MaxToolCalls < 1:
			return t.Fail(badParam("max_tool_calls", "max_tool_calls %d; want at least 1", *req.MaxToolCalls))
		case !isNull(req.StreamOptions) && !req.Stream:
			return t.Fail(badParam("stream_options", "stream_options is only allowed with stream: true"))
		}
		var history []models.ChatMessage
		if req.PreviousResponseID != "" {
			stored, ok := s.stored.conversation(req.PreviousResponseID)
			if !ok {
				return t.Fail(text.WithParam("previous_response_id", &apierr.Error{Status: http.StatusBadRequest,
					Msg: fmt.Sprintf("previous response %q is not stored here (responses are kept in this server's memory, at most %d, while store is not false)", apierr.ClipName(req.PreviousResponseID), maxStoredResponses)}))
			}
			history = stored
		}
		input, err := inputMessages(req.Input, history)
		if err != nil {
			return t.Fail(err)
		}
		if len(input) == 0 {
			return t.Fail(badParam("input", "input is required: a string, or an array of items"))
		}
		conversation := append(slices.Clone(history), input...)
		messages := conversation
		if req.Instructions != nil && *req.Instructions != "" {
			messages = append([]models.ChatMessage{{Role: "system", Content: *req.Instructions}}, conversation...)
		}
		m := t.Model()
		tools, err := responseTools(req.Tools, req.ToolChoice, m.ToolFormat())
		if err != nil {
			return t.Fail(err)
		}
		var format json.RawMessage
		if req.Text != nil {
			format = req.Text.Format
		}
		constraint, err := textFormat(format)
		if err != nil {
			return t.Fail(err)
		}
		if c, err := tools.Constraint(); err != nil {
			return t.Fail(err)
		} else if c != nil {
			if constraint != nil {
				return t.Fail(badParam("tool_choice", "tool_choice required (or a named function) and text.format both constrain the output; give one"))
			}
			constraint = c
		}
		gr := &serving.GenerateRequest{Messages: messages, MaxTokens: req.MaxOutputTokens, Temperature: req.Temperature, TopP: req.TopP,
			Seed: req.Seed, Logprobs: -1, Constraint: constraint}
		if tools.Active() {
			gr.Tools = tools.TemplateValues()
		}
		rw := newResponsesWriter(m.Model().Name, &req, tools, format)
		if req.Store == nil || *req.Store {
			rw.save = func(id string, output []models.ChatMessage, body []byte) {
				s.stored.put(id, append(slices.Clip(conversation), output...), body)
			}
		}
		return t.GenerateTo(gr, rw)
	})
}

// storedResponse answers GET /v1/responses/{id}.
func (s *API) storedResponse(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	body, ok := s.stored.body(id)
	if !ok {
		writeOpenAIError(w, http.StatusNotFound, text.WithParam("id", fmt.Errorf("response %q is not stored here", apierr.ClipName(id))))
		return
	}
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}

// deleteResponse answers DELETE /v1/responses/{id}.
func (s *API) deleteResponse(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	if !s.stored.remove(id) {
		writeOpenAIError(w, http.StatusNotFound, text.WithParam("id", fmt.Errorf("response %q is not stored here", apierr.ClipName(id))))
		return
	}
	w.Header()["Content-Type"] = []string{"application/json"}
	w.WriteHeader(http.StatusOK)
	w.Write(text.Marshal(map[string]any{"id": id, "object": "response.deleted", "deleted": true}))
}
