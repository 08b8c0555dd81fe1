package anthropic

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"strings"

	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/text"
	"github.com/stepserve/stepserve/serving"
)

// writer is the Messages API's answer: one message, or Anthropic's
// stream of events (message_start, content_block_start,
// content_block_delta, content_block_stop, message_delta, message_stop).
type writer struct {
	model  string
	stream bool
	tools  *text.Tools
	id     string
	stop   string // the stop sequence that ended it
	// A stream's state: its text block is open; with tools, the text is
	// held back to the end, where it is text or tool_use blocks.
	open bool
	held strings.Builder
	// reason and seq are the stop the last chunk saw, which End sends
	// with the usage.
	reason string
	seq    *string
}

type usage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// contentBlock is a block of the answer: text, or a tool_use.
type contentBlock struct {
	Type  string          `json:"type"`
	Text  *string         `json:"text,omitempty"`
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
}

func newID(prefix string) string {
	var b [18]byte
	rand.Read(b[:])
	return prefix + base64.RawURLEncoding.EncodeToString(b[:])
}

func (c *writer) Streaming() bool { return c.stream }

// StopString records the stop sequence that ended a whole answer.
func (c *writer) StopString(s string) { c.stop = s }

func (c *writer) msgID() string {
	if c.id == "" {
		c.id = newID("msg_")
	}
	return c.id
}

// stopReason is Anthropic's stop_reason for a finish.
func (c *writer) stopReason(finish string, calls bool) (string, *string) {
	switch {
	case calls:
		return "tool_use", nil
	case finish == "length":
		return "max_tokens", nil
	case c.stop != "":
		stop := c.stop
		return "stop_sequence", &stop
	}
	return "end_turn", nil
}

// content is the answer's blocks: its text, or the text before its
// calls and a tool_use block each.
func (c *writer) content(out string) ([]contentBlock, bool) {
	if c.tools.Active() {
		if calls, before := c.tools.Calls(out); calls != nil {
			var bs []contentBlock
			if before != "" {
				bs = append(bs, contentBlock{Type: "text", Text: &before})
			}
			for _, call := range calls {
				bs = append(bs, contentBlock{Type: "tool_use", ID: newID("toolu_"), Name: call.Name, Input: json.RawMessage(call.Arguments)})
			}
			return bs, true
		}
	}
	return []contentBlock{{Type: "text", Text: &out}}, false
}

func (c *writer) message(content []contentBlock, stopReason string, stopSeq *string, u usage) map[string]any {
	return map[string]any{"id": c.msgID(), "type": "message", "role": "assistant", "model": c.model,
		"content": content, "stop_reason": nullable(stopReason), "stop_sequence": stopSeq, "usage": u}
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func (c *writer) Whole(out string, _ []serving.TokenInfo, finish string, prompt, completion int) []byte {
	content, calls := c.content(out)
	reason, seq := c.stopReason(finish, calls)
	return text.Marshal(c.message(content, reason, seq, usage{prompt, completion}))
}

// event frames one of Anthropic's stream events.
func event(typ string, v map[string]any) []byte {
	v["type"] = typ
	b := append([]byte("event: "+typ+"\ndata: "), text.Marshal(v)...)
	return append(b, '\n', '\n')
}

func (c *writer) First(prompt int) []byte {
	return event("message_start", map[string]any{"message": c.message([]contentBlock{}, "", nil, usage{prompt, 0})})
}

func (c *writer) Chunk(ev serving.TextEvent) []byte {
	var b []byte
	if c.tools.Active() {
		c.held.WriteString(ev.Text)
		if ev.Finish == "" {
			return nil
		}
		content, calls := c.content(c.held.String())
		for i, block := range content {
			switch block.Type {
			case "text":
				b = append(b, event("content_block_start", map[string]any{"index": i, "content_block": contentBlock{Type: "text", Text: new(string)}})...)
				b = append(b, event("content_block_delta", map[string]any{"index": i, "delta": map[string]any{"type": "text_delta", "text": *block.Text}})...)
			case "tool_use":
				start := block
				start.Input = json.RawMessage("{}")
				b = append(b, event("content_block_start", map[string]any{"index": i, "content_block": start})...)
				b = append(b, event("content_block_delta", map[string]any{"index": i, "delta": map[string]any{"type": "input_json_delta", "partial_json": string(block.Input)}})...)
			}
			b = append(b, event("content_block_stop", map[string]any{"index": i})...)
		}
		c.stop = ev.Stop
		reason, seq := c.stopReason(ev.Finish, calls)
		c.reason, c.seq = reason, seq
		return b
	}
	if !c.open {
		c.open = true
		b = append(b, event("content_block_start", map[string]any{"index": 0, "content_block": contentBlock{Type: "text", Text: new(string)}})...)
	}
	if ev.Text != "" {
		b = append(b, event("content_block_delta", map[string]any{"index": 0, "delta": map[string]any{"type": "text_delta", "text": ev.Text}})...)
	}
	if ev.Finish != "" {
		b = append(b, event("content_block_stop", map[string]any{"index": 0})...)
		c.stop = ev.Stop
		c.reason, c.seq = c.stopReason(ev.Finish, false)
	}
	return b
}

// End is message_delta, with the stop reason and the usage, then
// message_stop.
func (c *writer) End(_, completion int) []byte {
	b := event("message_delta", map[string]any{"delta": map[string]any{"stop_reason": c.reason, "stop_sequence": c.seq},
		"usage": map[string]any{"output_tokens": completion}})
	return append(b, event("message_stop", map[string]any{})...)
}

func (c *writer) StreamError(err error) []byte {
	st := core.StatusOf(err)
	return event("error", map[string]any{"error": map[string]any{"type": errorType(st), "message": err.Error()}})
}
