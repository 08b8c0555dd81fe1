package openai

import (
	"strconv"
	"strings"
	"time"

	"github.com/stepserve/stepserve/server/text"
	"github.com/stepserve/stepserve/serving"
)

// chatWriter is OpenAI's chat completions answer.
type chatWriter struct {
	model         string
	stream, usage bool
	logprobs, ids bool
	id            string
	created       int64
	// tools, when active, has the answer read for tool calls: a stream
	// holds its text back until the end, where it is calls or text.
	tools *text.Tools
	held  map[int]*strings.Builder // by choice
	// started marks the choices whose first chunk (the role) is sent, of
	// several (ChunkN).
	started map[int]bool
}

type chatDelta struct {
	Role      string     `json:"role,omitempty"`
	Content   *string    `json:"content,omitempty"`
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
}

// message is the answer's message: content, or tool calls (content
// null, or what the model wrote before them).
type message struct {
	Role      string     `json:"role"`
	Content   *string    `json:"content"`
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
}

type chatTokenLogprob struct {
	Token       string             `json:"token"`
	Logprob     float32            `json:"logprob"`
	Bytes       []int              `json:"bytes"`
	TopLogprobs []chatTokenLogprob `json:"top_logprobs"`
}

type chatLogprobs struct {
	Content []chatTokenLogprob `json:"content"`
}

func (c *chatWriter) Streaming() bool { return c.stream }

func (c *chatWriter) init() {
	if c.id == "" {
		c.id, c.created = newID("chatcmpl-"), time.Now().Unix()
	}
}

// tokenName is how logprobs name a token: its text, or "token_id:<id>"
// when the request asked for ids (vLLM's return_tokens_as_token_ids).
func tokenName(id int32, text string, ids bool) string {
	if ids {
		return "token_id:" + strconv.Itoa(int(id))
	}
	return text
}

// tokenBytes are a token's raw bytes as OpenAI's logprobs list them:
// joined, a client rebuilds a character split over tokens.
func tokenBytes(b []byte) []int {
	out := make([]int, len(b))
	for i, c := range b {
		out[i] = int(c)
	}
	return out
}

func (c *chatWriter) logprobsOf(tokens []serving.TokenInfo) *chatLogprobs {
	if !c.logprobs {
		return nil
	}
	lp := &chatLogprobs{Content: []chatTokenLogprob{}}
	for _, t := range tokens {
		e := chatTokenLogprob{Token: tokenName(t.ID, t.Text, c.ids), Logprob: t.Logprob, Bytes: tokenBytes(t.Bytes), TopLogprobs: []chatTokenLogprob{}}
		for _, x := range t.Top {
			e.TopLogprobs = append(e.TopLogprobs, chatTokenLogprob{Token: tokenName(x.ID, x.Text, c.ids), Logprob: x.Logprob, Bytes: tokenBytes(x.Bytes)})
		}
		lp.Content = append(lp.Content, e)
	}
	return lp
}

func (c *chatWriter) object(object string, choices any, u *usage) []byte {
	c.init()
	return text.Marshal(struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		Model   string `json:"model"`
		Choices any    `json:"choices"`
		Usage   *usage `json:"usage,omitempty"`
	}{c.id, object, c.created, c.model, choices, u})
}

type chatChoice struct {
	Index        int           `json:"index"`
	Message      *message      `json:"message,omitempty"`
	Delta        *chatDelta    `json:"delta,omitempty"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

// choice is one choice of a whole answer: its message (text, or the
// tool calls read from it) and finish reason.
func (c *chatWriter) choice(i int, out string, tokens []serving.TokenInfo, finish string) chatChoice {
	msg := &message{Role: "assistant", Content: &out}
	if c.tools.Active() {
		if calls, content := answerCalls(c.tools, out); calls != nil {
			msg.ToolCalls, msg.Content, finish = calls, nil, "tool_calls"
			if content != "" {
				msg.Content = &content
			}
		}
	}
	return chatChoice{Index: i, Message: msg, Logprobs: c.logprobsOf(tokens), FinishReason: &finish}
}

func (c *chatWriter) Whole(out string, tokens []serving.TokenInfo, finish string, prompt, completion int) []byte {
	return c.object("chat.completion", []chatChoice{c.choice(0, out, tokens, finish)}, usageOf(prompt, completion))
}

// WholeN implements [text.ChoicesWriter].
func (c *chatWriter) WholeN(choices []text.Choice, prompt, completion int) []byte {
	out := make([]chatChoice, len(choices))
	for i, ch := range choices {
		out[i] = c.choice(ch.Index, ch.Text, ch.Tokens, ch.Finish)
	}
	return c.object("chat.completion", out, usageOf(prompt, completion))
}

// role is choice i's first chunk: the role.
func (c *chatWriter) role(i int) []byte {
	empty := ""
	return text.SSE(c.object("chat.completion.chunk", []chatChoice{{Index: i, Delta: &chatDelta{Role: "assistant", Content: &empty}}}, nil))
}

func (c *chatWriter) First(int) []byte { return c.role(0) }

func (c *chatWriter) Chunk(ev serving.TextEvent) []byte { return c.chunkAt(0, ev) }

// ChunkN implements [text.ChoicesWriter]: choice i's piece, after its
// role chunk.
func (c *chatWriter) ChunkN(i int, ev serving.TextEvent) []byte {
	if c.started == nil {
		c.started = map[int]bool{}
	}
	var b []byte
	if !c.started[i] {
		c.started[i] = true
		b = c.role(i)
	}
	return append(b, c.chunkAt(i, ev)...)
}

func (c *chatWriter) chunkAt(i int, ev serving.TextEvent) []byte {
	if c.tools.Active() {
		return c.toolChunk(i, ev)
	}
	ch := chatChoice{Index: i, Delta: &chatDelta{}, Logprobs: c.logprobsOf(ev.Tokens)}
	if ev.Text != "" {
		ch.Delta.Content = &ev.Text
	}
	if ev.Finish != "" {
		ch.FinishReason = &ev.Finish
	}
	return text.SSE(c.object("chat.completion.chunk", []chatChoice{ch}, nil))
}

func (c *chatWriter) End(prompt, completion int) []byte {
	var b []byte
	if c.usage {
		b = text.SSE(c.object("chat.completion.chunk", []chatChoice{}, usageOf(prompt, completion)))
	}
	return append(b, "data: [DONE]\n\n"...)
}

func (c *chatWriter) StreamError(err error) []byte { return openaiStreamError(err) }

// toolChunk holds a stream's text back until its end, where it is sent
// as tool calls, as OpenAI streams them (a chunk with each call's index,
// id and name, then one with its arguments, then the finish
// tool_calls), or as the text it is.
func (c *chatWriter) toolChunk(at int, ev serving.TextEvent) []byte {
	if c.held == nil {
		c.held = map[int]*strings.Builder{}
	}
	held := c.held[at]
	if held == nil {
		held = &strings.Builder{}
		c.held[at] = held
	}
	held.WriteString(ev.Text)
	if ev.Finish == "" {
		return nil
	}
	out, finish := held.String(), ev.Finish
	calls, content := answerCalls(c.tools, out)
	var b []byte
	chunk := func(d *chatDelta, finish *string) {
		b = append(b, text.SSE(c.object("chat.completion.chunk", []chatChoice{{Index: at, Delta: d, FinishReason: finish}}, nil))...)
	}
	if calls == nil {
		chunk(&chatDelta{Content: &out}, &finish)
		return b
	}
	if content != "" {
		chunk(&chatDelta{Content: &content}, nil)
	}
	for i, call := range calls {
		args := call.Function.Arguments
		call.Index, call.Function.Arguments = &i, ""
		chunk(&chatDelta{ToolCalls: []toolCall{call}}, nil)
		chunk(&chatDelta{ToolCalls: []toolCall{{Index: &i, Function: toolFunction{Arguments: args}}}}, nil)
	}
	finish = "tool_calls"
	chunk(&chatDelta{}, &finish)
	return b
}
