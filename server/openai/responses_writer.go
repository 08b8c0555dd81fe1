package openai

import (
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/text"
	"github.com/stepserve/stepserve/serving"
)

// responsesWriter is the Responses API's answer: a response object, or
// its stream of events (response.created, the output items' and their
// parts' events, output_text deltas, response.completed), each with its
// sequence number.
type responsesWriter struct {
	model   string
	req     *responsesRequest
	tools   *text.Tools
	format  json.RawMessage
	single  bool // parallel_tool_calls false: the first call only
	id      string
	created int64
	msgID   string
	// save, when set, stores the finished response (store not false):
	// its output as messages, for previous_response_id, and its body.
	save func(id string, output []models.ChatMessage, body []byte)

	seq    int             // the next event's sequence number
	text   strings.Builder // the message's text so far
	finish string          // how the stream's generation ended
}

func newResponsesWriter(model string, req *responsesRequest, tools *text.Tools, format json.RawMessage) *responsesWriter {
	w := &responsesWriter{model: model, req: req, tools: tools, format: format, id: newID("resp_"), msgID: newID("msg_"),
		created: time.Now().Unix()}
	w.single = req.ParallelToolCalls != nil && !*req.ParallelToolCalls
	return w
}

// outputText is a message's part.
type outputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

// outputItem is an item of output: a message, or a function call.
type outputItem struct {
	Type    string        `json:"type"`
	ID      string        `json:"id"`
	Status  string        `json:"status"`
	Role    string        `json:"role,omitempty"`
	Content *[]outputText `json:"content,omitempty"` // a message's: never omitted there

	CallID    string  `json:"call_id,omitempty"`
	Name      string  `json:"name,omitempty"`
	Arguments *string `json:"arguments,omitempty"`
}

type responseUsage struct {
	InputTokens         int `json:"input_tokens"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// object is the response object, with status and output.
func (w *responsesWriter) object(status string, output []outputItem, u *responseUsage) map[string]any {
	if output == nil {
		output = []outputItem{}
	}
	r := w.req
	format := any(map[string]string{"type": "text"})
	if !isNull(w.format) {
		format = w.format
	}
	tools := any([]any{})
	if !empty(r.Tools) {
		tools = r.Tools
	}
	choice := any("auto")
	if !isNull(r.ToolChoice) {
		choice = r.ToolChoice
	}
	var incomplete any
	if status == "incomplete" {
		incomplete = map[string]string{"reason": "max_output_tokens"}
	}
	var prev any
	if r.PreviousResponseID != "" {
		prev = r.PreviousResponseID
	}
	metadata := any(map[string]any{})
	if !isNull(r.Metadata) {
		metadata = r.Metadata
	}
	o := map[string]any{
		"id": w.id, "object": "response", "created_at": w.created, "status": status, "error": nil,
		"incomplete_details": incomplete, "instructions": r.Instructions, "max_output_tokens": r.MaxOutputTokens,
		"model": w.model, "output": output, "parallel_tool_calls": !w.single, "previous_response_id": prev,
		"reasoning": map[string]any{"effort": nil, "summary": nil}, "store": r.Store == nil || *r.Store,
		"temperature": r.Temperature, "top_p": r.TopP, "text": map[string]any{"format": format},
		"tool_choice": choice, "tools": tools, "truncation": "disabled", "user": nilIfEmpty(r.User), "metadata": metadata,
		"usage": nil,
	}
	if u != nil {
		o["usage"] = u
	}
	return o
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// items is the output of a finished generation: the message, or the
// function calls read out of it (after the text before them).
func (w *responsesWriter) items(out string) ([]outputItem, []models.ChatMessage) {
	message := func(s string) outputItem {
		return outputItem{Type: "message", ID: w.msgID, Status: "completed", Role: "assistant",
			Content: &[]outputText{{Type: "output_text", Text: s, Annotations: []any{}}}}
	}
	if w.tools.Active() {
		if calls, content := answerCalls(w.tools, out); calls != nil {
			if w.single {
				calls = calls[:1]
			}
			var items []outputItem
			if content != "" {
				items = append(items, message(content))
			}
			msg := models.ChatMessage{Role: "assistant", Content: content}
			for _, c := range calls {
				args := c.Function.Arguments
				items = append(items, outputItem{Type: "function_call", ID: newID("fc_"), Status: "completed", CallID: c.ID,
					Name: c.Function.Name, Arguments: &args})
				msg.ToolCalls = append(msg.ToolCalls, models.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: argumentsValue(args)})
			}
			return items, []models.ChatMessage{msg}
		}
	}
	return []outputItem{message(out)}, []models.ChatMessage{{Role: "assistant", Content: out}}
}

// finished is the response of a generation that ended, stored where
// asked.
func (w *responsesWriter) finished(out, finish string, prompt, completion int) map[string]any {
	status := "completed"
	if finish == "length" {
		status = "incomplete"
	}
	items, msgs := w.items(out)
	u := &responseUsage{InputTokens: prompt, OutputTokens: completion, TotalTokens: prompt + completion}
	o := w.object(status, items, u)
	if w.save != nil {
		w.save(w.id, msgs, text.Marshal(o))
	}
	return o
}

func (w *responsesWriter) Streaming() bool { return w.req.Stream }

func (w *responsesWriter) Whole(out string, _ []serving.TokenInfo, finish string, prompt, completion int) []byte {
	return text.Marshal(w.finished(out, finish, prompt, completion))
}

// event is one server-sent event of the stream, named by its type.
func (w *responsesWriter) event(typ string, fields map[string]any) []byte {
	fields["type"], fields["sequence_number"] = typ, w.seq
	w.seq++
	b := append([]byte("event: "+typ+"\n"), text.SSE(text.Marshal(fields))...)
	return b
}

func (w *responsesWriter) First(int) []byte {
	b := w.event("response.created", map[string]any{"response": w.object("in_progress", nil, nil)})
	b = append(b, w.event("response.in_progress", map[string]any{"response": w.object("in_progress", nil, nil)})...)
	if !w.tools.Active() {
		b = append(b, w.openMessage(0)...)
	}
	return b
}

// openMessage adds the message item at index and its text part.
func (w *responsesWriter) openMessage(index int) []byte {
	item := outputItem{Type: "message", ID: w.msgID, Status: "in_progress", Role: "assistant", Content: &[]outputText{}}
	b := w.event("response.output_item.added", map[string]any{"output_index": index, "item": item})
	return append(b, w.event("response.content_part.added", map[string]any{"item_id": w.msgID, "output_index": index, "content_index": 0,
		"part": outputText{Type: "output_text", Text: "", Annotations: []any{}}})...)
}

// closeMessage ends the message item at index, whose text is s.
func (w *responsesWriter) closeMessage(index int, s string) []byte {
	part := outputText{Type: "output_text", Text: s, Annotations: []any{}}
	b := w.event("response.output_text.done", map[string]any{"item_id": w.msgID, "output_index": index, "content_index": 0, "text": s})
	b = append(b, w.event("response.content_part.done", map[string]any{"item_id": w.msgID, "output_index": index, "content_index": 0, "part": part})...)
	return append(b, w.event("response.output_item.done", map[string]any{"output_index": index,
		"item": outputItem{Type: "message", ID: w.msgID, Status: "completed", Role: "assistant", Content: &[]outputText{part}}})...)
}

func (w *responsesWriter) delta(index int, s string) []byte {
	return w.event("response.output_text.delta", map[string]any{"item_id": w.msgID, "output_index": index, "content_index": 0, "delta": s})
}

func (w *responsesWriter) Chunk(ev serving.TextEvent) []byte {
	w.text.WriteString(ev.Text)
	var b []byte
	if !w.tools.Active() && ev.Text != "" {
		b = w.delta(0, ev.Text)
	}
	if ev.Finish == "" {
		return b
	}
	w.finish = ev.Finish
	return append(b, w.end()...)
}

// end writes the output's last events and the response's: with tools,
// the text held until now is sent as the items it reads as.
func (w *responsesWriter) end() []byte {
	out := w.text.String()
	var b []byte
	if !w.tools.Active() {
		b = w.closeMessage(0, out)
	} else {
		items, _ := w.items(out)
		for i, it := range items {
			if it.Type == "message" {
				s := (*it.Content)[0].Text
				b = append(b, w.openMessage(i)...)
				b = append(b, w.delta(i, s)...)
				b = append(b, w.closeMessage(i, s)...)
				continue
			}
			args := *it.Arguments
			added := it
			added.Status, added.Arguments = "in_progress", new(string)
			b = append(b, w.event("response.output_item.added", map[string]any{"output_index": i, "item": added})...)
			b = append(b, w.event("response.function_call_arguments.delta", map[string]any{"item_id": it.ID, "output_index": i, "delta": args})...)
			b = append(b, w.event("response.function_call_arguments.done", map[string]any{"item_id": it.ID, "output_index": i, "arguments": args})...)
			b = append(b, w.event("response.output_item.done", map[string]any{"output_index": i, "item": it})...)
		}
	}
	return b
}

// End writes the response's last event, usage counted: completed, or
// incomplete where max_output_tokens cut it.
func (w *responsesWriter) End(prompt, completion int) []byte {
	o := w.finished(w.text.String(), w.finish, prompt, completion)
	typ := "response.completed"
	if o["status"] == "incomplete" {
		typ = "response.incomplete"
	}
	return w.event(typ, map[string]any{"response": o})
}

func (w *responsesWriter) StreamError(err error) []byte {
	return w.event("error", map[string]any{"code": "server_error", "message": err.Error(), "param": nil})
}

// maxStoredResponses and maxStoredBytes bound the responses kept for
// previous_response_id and GET /v1/responses/{id}: the oldest go first.
const (
	maxStoredResponses = 1024
	maxStoredBytes     = 32 << 20
)

// responseStore keeps the stored responses: each one's conversation
// (its input, after its previous response's, and its output) and its
// body, in this server's memory.
type responseStore struct {
	mu    sync.Mutex
	byID  map[string]*storedResponse
	order []string // oldest first
	bytes int
}

type storedResponse struct {
	messages []models.ChatMessage
	body     []byte
	size     int
}

func (s *responseStore) put(id string, messages []models.ChatMessage, body []byte) {
	size := len(body)
	for _, m := range messages {
		size += len(m.Content) + 64
		for _, c := range m.ToolCalls {
			size += len(c.Name) + len(c.ID) + len(text.Marshal(c.Arguments))
		}
	}
	if size > maxStoredBytes {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID == nil {
		s.byID = map[string]*storedResponse{}
	}
	for len(s.order) > 0 && (len(s.order) >= maxStoredResponses || s.bytes+size > maxStoredBytes) {
		old := s.order[0]
		s.order = s.order[1:]
		if r, ok := s.byID[old]; ok {
			s.bytes -= r.size
			delete(s.byID, old)
		}
	}
	s.byID[id] = &storedResponse{messages: messages, body: body, size: size}
	s.order = append(s.order, id)
	s.bytes += size
}

func (s *responseStore) conversation(id string) ([]models.ChatMessage, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.byID[id]
	if !ok {
		return nil, false
	}
	return r.messages, true
}

func (s *responseStore) body(id string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.byID[id]
	if !ok {
		return nil, false
	}
	return r.body, true
}

func (s *responseStore) remove(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.byID[id]
	if !ok {
		return false
	}
	s.bytes -= r.size
	delete(s.byID, id)
	// Its place in order is dropped when it comes round.
	return true
}
