package openai

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/text"
	"github.com/stepserve/stepserve/serving"
)

// The generation APIs, for language models (architecture decoder):
//
//	POST /v1/completions                       OpenAI's completions
//	POST /v1/chat/completions                  OpenAI's chat completions
//	POST /v2/models/{model}[/versions/{v}]/generate         Triton's generate extension
//	POST /v2/models/{model}[/versions/{v}]/generate_stream  the same as server-sent events
//
// Every request becomes one serving.GenerateRequest: the same checks,
// the same continuous batcher, the same metrics; only the JSON on either
// side is each API's own. Streams are server-sent events, each written
// under a deadline: a client that stops reading is cut off after
// a deadline, and its sequence cancelled (its KV cache blocks
// freed at the next step).

// maxOpenAIStops is OpenAI's bound on stop strings.
const maxOpenAIStops = 4

// openaiSampling are the sampling keys OpenAI's two APIs share, with
// vLLM's extensions (top_k, ignore_eos) that OpenAI clients send as extra
// body keys.
type openaiSampling struct {
	Model            string            `json:"model"`
	MaxTokens        *int              `json:"max_tokens"`
	Temperature      *float64          `json:"temperature"`
	TopP             *float64          `json:"top_p"`
	TopK             *int              `json:"top_k"`
	N                *int              `json:"n"`
	Stream           bool              `json:"stream"`
	StreamOptions    *streamOptions    `json:"stream_options"`
	Stop             text.StringOrList `json:"stop"`
	Seed             *int64            `json:"seed"`
	User             string            `json:"user"` // accepted, and ignored
	FrequencyPenalty *float64          `json:"frequency_penalty"`
	PresencePenalty  *float64          `json:"presence_penalty"`
	LogitBias        map[string]any    `json:"logit_bias"`
	// vLLM's extensions.
	RepetitionPenalty *float64 `json:"repetition_penalty"`
	StopTokenIDs      []int32  `json:"stop_token_ids"`
	IgnoreEOS         bool     `json:"ignore_eos"`
	MinTokens         int      `json:"min_tokens"`
	Priority          int      `json:"priority"`
	// SpeculativeDecoding false keeps the request out of the model's
	// speculative decoding (stepserve's extension).
	SpeculativeDecoding *bool           `json:"speculative_decoding"`
	Metadata            json.RawMessage `json:"metadata"` // accepted, and ignored
	Store               *bool           `json:"store"`    // accepted, and ignored: nothing is stored
	// ReturnTokensAsTokenIDs is vLLM's extension: logprobs name each
	// token "token_id:<id>", so that a client can compare ids.
	ReturnTokensAsTokenIDs bool `json:"return_tokens_as_token_ids"`
	guided                      // structured output (structured.go)
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type completionRequest struct {
	openaiSampling
	Prompt   json.RawMessage `json:"prompt"`
	Logprobs *int            `json:"logprobs"`
	Echo     bool            `json:"echo"`
	BestOf   *int            `json:"best_of"`
	Suffix   *string         `json:"suffix"`
	tgiKeys
}

// tgiKeys are text-generation-inference's parameters, which Hugging
// Face's JS client (@huggingface/inference's textGeneration at an
// endpoint) sends to the endpoint's /v1/completions beside the prompt,
// read with TGI's meaning where the completions API has one.
type tgiKeys struct {
	DoSample            *bool `json:"do_sample"`        // false: greedy, unless a temperature is given
	ReturnFullText      *bool `json:"return_full_text"` // true: the prompt first, as echo
	Truncate            *int  `json:"truncate"`         // the prompt's last tokens kept
	TopNTokens          *int  `json:"top_n_tokens"`     // logprobs, unless given
	Details             *bool `json:"details"`
	DecoderInputDetails *bool `json:"decoder_input_details"`
	Watermark           *bool `json:"watermark"`
}

// apply reads k into gr, checked.
func (k *tgiKeys) apply(gr *serving.GenerateRequest, temperatureGiven bool) error {
	for _, f := range []struct {
		name string
		v    *bool
	}{{"details", k.Details}, {"decoder_input_details", k.DecoderInputDetails}, {"watermark", k.Watermark}} {
		if f.v != nil && *f.v {
			return text.WithParam(f.name, apierr.BadRequest(f.name+" (text-generation-inference's) is not answered by the completions API; POST /generate answers TGI's shape with details"))
		}
	}
	if k.DoSample != nil && !*k.DoSample && !temperatureGiven {
		greedy := 0.0
		gr.Temperature = &greedy
	}
	if k.Truncate != nil {
		gr.Truncate = *k.Truncate
	}
	return nil
}

type chatRequest struct {
	openaiSampling
	Messages            []chatMessage   `json:"messages"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Logprobs            bool            `json:"logprobs"`
	TopLogprobs         *int            `json:"top_logprobs"`
	Tools               json.RawMessage `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name"`
	// What an assistant message carries back from OpenAI's answers,
	// which clients replay in the history: taken while empty.
	Refusal      *string         `json:"refusal"`
	ToolCalls    json.RawMessage `json:"tool_calls"`
	ToolCallID   string          `json:"tool_call_id"`
	FunctionCall json.RawMessage `json:"function_call"`
	Audio        json.RawMessage `json:"audio"`
}

// empty reports whether raw is absent, null or an empty array.
func empty(raw json.RawMessage) bool {
	b := bytes.TrimSpace(raw)
	return len(b) == 0 || bytes.Equal(b, []byte("null")) || bytes.Equal(b, []byte("[]"))
}

// chatRoles are the roles OpenAI's chat API defines: a role is text the
// template writes into the prompt, so no other is taken.
var chatRoles = []string{"system", "developer", "user", "assistant", "tool"}

// content is a message's text: a string, or an array of text parts.
func (m chatMessage) content(i int) (string, error) {
	b := bytes.TrimSpace(m.Content)
	if len(b) == 0 || bytes.Equal(b, []byte("null")) {
		return "", nil
	}
	var s string
	if b[0] == '"' {
		if err := json.Unmarshal(b, &s); err != nil {
			return "", fmt.Errorf("messages[%d].content: want a string or an array of text parts", i)
		}
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(b, &parts); err != nil {
		return "", fmt.Errorf("messages[%d].content: want a string or an array of text parts", i)
	}
	var sb strings.Builder
	for j, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("messages[%d].content[%d]: type %q is not supported; this model takes text parts only", i, j, apierr.ClipName(p.Type))
		}
		sb.WriteString(p.Text)
	}
	return sb.String(), nil
}

// generateRequest is the common part of the OpenAI requests, checked:
// what the two APIs share becomes a serving.GenerateRequest.
func (o *openaiSampling) generateRequest(maxTokens *int) (*serving.GenerateRequest, error) {
	bias, err := logitBias(o.LogitBias)
	if err != nil {
		return nil, err
	}
	if len(o.Stop.List) > maxOpenAIStops {
		return nil, text.WithParam("stop", apierr.BadRequest(fmt.Sprintf("%d stop sequences; want at most %d", len(o.Stop.List), maxOpenAIStops)))
	}
	if o.StreamOptions != nil && !o.Stream {
		return nil, text.WithParam("stream_options", apierr.BadRequest("stream_options is only allowed with stream: true"))
	}
	constraint, err := o.constraint()
	if err != nil {
		return nil, err
	}
	return &serving.GenerateRequest{MaxTokens: maxTokens, Temperature: o.Temperature, TopP: o.TopP, TopK: o.TopK,
		Seed: o.Seed, Stop: o.Stop.List, Logprobs: -1, IgnoreEOS: o.IgnoreEOS, MinTokens: o.MinTokens, Priority: o.Priority,
		Constraint: constraint, FrequencyPenalty: o.FrequencyPenalty, PresencePenalty: o.PresencePenalty,
		RepetitionPenalty: o.RepetitionPenalty, LogitBias: bias, StopTokenIDs: o.StopTokenIDs,
		NoSpeculation: o.SpeculativeDecoding != nil && !*o.SpeculativeDecoding}, nil
}

// nChoices are n generations of gr: the first gr, the others its copies,
// each drawing with its own seed (gr's plus its index) where gr names
// one, so that seeded choices differ and are reproducible.
func nChoices(gr *serving.GenerateRequest, n int) []*serving.GenerateRequest {
	out := []*serving.GenerateRequest{gr}
	for j := 1; j < n; j++ {
		c := *gr
		if gr.Seed != nil {
			seed := *gr.Seed + int64(j)
			c.Seed = &seed
		}
		out = append(out, &c)
	}
	return out
}

// logitBias reads OpenAI's logit_bias: token ids (as strings) to biases.
func logitBias(m map[string]any) (map[int32]float64, error) {
	if len(m) == 0 {
		return nil, nil
	}
	out := make(map[int32]float64, len(m))
	for k, v := range m {
		id, err := strconv.ParseInt(k, 10, 32)
		b, ok := v.(float64)
		if err != nil || !ok {
			return nil, text.WithParam("logit_bias", apierr.BadRequest(fmt.Sprintf("logit_bias: want token ids (as strings) mapped to numbers; %q is not", apierr.ClipName(k))))
		}
		out[int32(id)] = b
	}
	return out, nil
}

// maxChoices bounds a request's generations: its prompts times best_of
// (or n).
const maxChoices = 64

// completionPrompt is one prompt of completions': text, or token ids.
type completionPrompt struct {
	text string
	ids  []int32
}

// completionPrompts reads completions' prompt: a string, token ids (an
// array of integers), or an array of either, a choice (or n) each.
func completionPrompts(raw json.RawMessage) ([]completionPrompt, error) {
	b := bytes.TrimSpace(raw)
	if len(b) == 0 || bytes.Equal(b, []byte("null")) {
		return nil, apierr.BadRequest("prompt is required: a string, or an array of token ids")
	}
	var one string
	if json.Unmarshal(b, &one) == nil {
		return []completionPrompt{{text: one}}, nil
	}
	var ids []int32
	if json.Unmarshal(b, &ids) == nil {
		if ids == nil {
			ids = []int32{}
		}
		return []completionPrompt{{ids: ids}}, nil
	}
	var texts []string
	if json.Unmarshal(b, &texts) == nil && len(texts) > 0 {
		out := make([]completionPrompt, len(texts))
		for i, s := range texts {
			out[i].text = s
		}
		return out, nil
	}
	var lists [][]int32
	if json.Unmarshal(b, &lists) == nil && len(lists) > 0 {
		out := make([]completionPrompt, len(lists))
		for i, l := range lists {
			if l == nil {
				l = []int32{}
			}
			out[i].ids = l
		}
		return out, nil
	}
	return nil, apierr.BadRequest("prompt: want a string, an array of token ids (32-bit integers), or a non-empty array of strings or of token id arrays")
}

func (s *API) openaiCompletions(w http.ResponseWriter, r *http.Request) {
	text.Serve(s.c, w, r, &openaiAPI, func(t *text.Request, body []byte) int {
		var req completionRequest
		if err := t.DecodeStrict(body, &req); err != nil {
			return t.Fail(text.OrParam("prompt", err))
		}
		if err := t.FindGenerative(req.Model, ""); err != nil {
			return t.Fail(err)
		}
		prompts, err := completionPrompts(req.Prompt)
		if err != nil {
			return t.Fail(text.WithParam("prompt", err))
		}
		if req.ReturnFullText != nil && *req.ReturnFullText {
			req.Echo = true
		}
		if req.TopNTokens != nil && req.Logprobs == nil {
			req.Logprobs = req.TopNTokens
		}
		n, bestOf := 1, 0
		if req.N != nil {
			n = *req.N
		}
		if req.BestOf != nil {
			bestOf = *req.BestOf
		}
		switch {
		case n < 1 || n > maxChoices:
			return t.Fail(text.WithParam("n", apierr.BadRequest(fmt.Sprintf("n %d; want 1 to %d", n, maxChoices))))
		case req.BestOf != nil && (bestOf < n || bestOf > maxChoices):
			return t.Fail(text.WithParam("best_of", apierr.BadRequest(fmt.Sprintf("best_of %d; want n (%d) to %d", bestOf, n, maxChoices))))
		case bestOf > n && req.Stream:
			return t.Fail(text.WithParam("best_of", apierr.BadRequest("best_of above n cannot be streamed: the best are known once all have ended")))
		case len(prompts)*max(n, bestOf) > maxChoices:
			return t.Fail(text.WithParam("prompt", apierr.BadRequest(fmt.Sprintf("%d prompts of %d generations each make %d; want at most %d a request", len(prompts), max(n, bestOf), len(prompts)*max(n, bestOf), maxChoices))))
		case req.Suffix != nil && *req.Suffix != "":
			return t.Fail(text.WithParam("suffix", apierr.BadRequest("suffix is not supported; leave it out")))
		case req.Logprobs != nil && (*req.Logprobs < 0 || *req.Logprobs > 5):
			return t.Fail(text.WithParam("logprobs", apierr.BadRequest(fmt.Sprintf("logprobs %d; want 0 to 5", *req.Logprobs))))
		}
		base, err := req.generateRequest(req.MaxTokens)
		if err != nil {
			return t.Fail(err)
		}
		if err := req.tgiKeys.apply(base, req.Temperature != nil); err != nil {
			return t.Fail(err)
		}
		if req.Logprobs != nil {
			base.Logprobs = *req.Logprobs
			base.ScorePrompt = req.Echo // the prompt's tokens scored in its prefill steps
		}
		m := t.Model()
		cw := &completionWriter{model: m.Model().Name, stream: req.Stream,
			usage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage, logprobs: req.Logprobs != nil, ids: req.ReturnTokensAsTokenIDs}
		if len(prompts) == 1 && n == 1 && bestOf <= 1 && !req.Echo {
			base.Prompt, base.PromptIDs = prompts[0].text, prompts[0].ids
			return t.GenerateTo(base, cw)
		}
		gens := max(n, bestOf)
		keep := 0
		if gens > n {
			keep = n
			base.Logprobs = max(base.Logprobs, 0) // best_of ranks by them
		}
		groups := make([]text.Group, len(prompts))
		for i, p := range prompts {
			if req.Echo {
				echo := p.text
				if p.ids != nil {
					echo = m.Decode(p.ids)
				}
				for range n {
					cw.echo = append(cw.echo, echo)
				}
			}
			gr := *base
			gr.Prompt, gr.PromptIDs = p.text, p.ids
			groups[i] = text.Group{Requests: nChoices(&gr, gens), Keep: keep}
		}
		return t.GenerateChoices(groups, cw)
	})
}

func (s *API) openaiChat(w http.ResponseWriter, r *http.Request) {
	text.Serve(s.c, w, r, &openaiAPI, func(t *text.Request, body []byte) int {
		var req chatRequest
		if err := t.DecodeStrict(body, &req); err != nil {
			return t.Fail(text.OrParam("messages", err))
		}
		if err := t.FindGenerative(req.Model, ""); err != nil {
			return t.Fail(err)
		}
		if len(req.Messages) == 0 {
			return t.Fail(text.WithParam("messages", apierr.BadRequest("messages is required: a non-empty array of {role, content}")))
		}
		tools, err := parseTools(req.Tools, req.ToolChoice, t.Model().ToolFormat())
		if err != nil {
			return t.Fail(err)
		}
		maxTokens := req.MaxCompletionTokens
		if maxTokens == nil {
			maxTokens = req.MaxTokens
		}
		n := 1
		if req.N != nil {
			n = *req.N
		}
		if n < 1 || n > maxChoices {
			return t.Fail(text.WithParam("n", apierr.BadRequest(fmt.Sprintf("n %d; want 1 to %d", n, maxChoices))))
		}
		gr, err := req.generateRequest(maxTokens)
		if err != nil {
			return t.Fail(err)
		}
		if c, err := tools.Constraint(); err != nil {
			return t.Fail(err)
		} else if c != nil {
			if gr.Constraint != nil {
				return t.Fail(text.WithParam("tool_choice", apierr.BadRequest("tool_choice required (or a named function) and response_format both constrain the output; give one")))
			}
			gr.Constraint = c
		}
		if tools.Active() {
			gr.Tools = tools.TemplateValues()
		}
		gr.Messages = make([]models.ChatMessage, len(req.Messages))
		for i, m := range req.Messages {
			if !empty(m.FunctionCall) || !empty(m.Audio) {
				return t.Fail(text.WithParam("messages", apierr.BadRequest(fmt.Sprintf("messages[%d]: function_call (use tool_calls) and audio are not supported; send text", i))))
			}
			c, err := m.content(i)
			if err != nil {
				return t.Fail(text.WithParam("messages", apierr.BadRequest(err.Error())))
			}
			if !slices.Contains(chatRoles, m.Role) {
				return t.Fail(text.WithParam("messages", apierr.BadRequest(fmt.Sprintf("messages[%d].role %q; want one of %s", i, apierr.ClipName(m.Role), strings.Join(chatRoles, ", ")))))
			}
			calls, err := historyCalls(m.ToolCalls, i)
			if err != nil {
				return t.Fail(text.WithParam("messages", apierr.BadRequest(err.Error())))
			}
			gr.Messages[i] = models.ChatMessage{Role: m.Role, Content: c, ToolCalls: calls, ToolCallID: m.ToolCallID, Name: m.Name}
		}
		if req.TopLogprobs != nil && (*req.TopLogprobs < 0 || *req.TopLogprobs > serving.MaxLogprobs) {
			return t.Fail(text.WithParam("top_logprobs", apierr.BadRequest(fmt.Sprintf("top_logprobs %d; want 0 to %d", *req.TopLogprobs, serving.MaxLogprobs))))
		}
		if req.TopLogprobs != nil && !req.Logprobs {
			return t.Fail(text.WithParam("top_logprobs", apierr.BadRequest("top_logprobs needs logprobs: true")))
		}
		if req.Logprobs {
			gr.Logprobs = 0
			if req.TopLogprobs != nil {
				gr.Logprobs = *req.TopLogprobs
			}
		}
		cw := &chatWriter{model: t.Model().Model().Name, stream: req.Stream,
			usage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage, logprobs: req.Logprobs, ids: req.ReturnTokensAsTokenIDs, tools: tools}
		if n == 1 {
			return t.GenerateTo(gr, cw)
		}
		return t.GenerateChoices([]text.Group{{Requests: nChoices(gr, n)}}, cw)
	})
}

func newID(prefix string) string {
	var b [12]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func usageOf(prompt, completion int) *usage {
	return &usage{prompt, completion, prompt + completion}
}

// openaiStreamError is an error event of an OpenAI stream.
func openaiStreamError(err error) []byte {
	st := core.StatusOf(err)
	typ := "server_error"
	if st < 500 {
		typ = "invalid_request_error"
	}
	// The error, then the end of the stream, as vLLM's OpenAI server ends one.
	return append(text.SSE(text.Marshal(map[string]any{"error": map[string]any{"message": err.Error(), "type": typ, "param": nil, "code": nil}})),
		"data: [DONE]\n\n"...)
}

// completionWriter is OpenAI's completions answer.
type completionWriter struct {
	model         string
	stream, usage bool
	logprobs, ids bool
	id            string
	created       int64
	offset        int      // text_offset of the next token
	offsets       []int    // by choice, of several
	echo          []string // by choice: the prompt it echoes (echo), sent first
}

type completionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []*float32           `json:"token_logprobs"` // null for the prompt's first token (echo)
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

func (c *completionWriter) Streaming() bool { return c.stream }

func (c *completionWriter) init() {
	if c.id == "" {
		c.id, c.created = newID("cmpl-"), time.Now().Unix()
	}
}

func (c *completionWriter) logprobsOf(tokens ...[]serving.TokenInfo) *completionLogprobs {
	if !c.logprobs {
		return nil
	}
	lp := &completionLogprobs{Tokens: []string{}, TokenLogprobs: []*float32{}, TopLogprobs: []map[string]float32{}, TextOffset: []int{}}
	for _, list := range tokens {
		for _, t := range list {
			lp.Tokens = append(lp.Tokens, tokenName(t.ID, t.Text, c.ids))
			lp.TextOffset = append(lp.TextOffset, c.offset)
			c.offset += len(t.Text)
			if math.IsNaN(float64(t.Logprob)) { // the prompt's first token: nothing before it
				lp.TokenLogprobs, lp.TopLogprobs = append(lp.TokenLogprobs, nil), append(lp.TopLogprobs, nil)
				continue
			}
			v := t.Logprob
			lp.TokenLogprobs = append(lp.TokenLogprobs, &v)
			top := map[string]float32{}
			for _, x := range t.Top {
				top[tokenName(x.ID, x.Text, c.ids)] = x.Logprob
			}
			lp.TopLogprobs = append(lp.TopLogprobs, top)
		}
	}
	return lp
}

func (c *completionWriter) object(choices []completionChoice, u *usage) []byte {
	c.init()
	return text.Marshal(struct {
		ID      string             `json:"id"`
		Object  string             `json:"object"`
		Created int64              `json:"created"`
		Model   string             `json:"model"`
		Choices []completionChoice `json:"choices"`
		Usage   *usage             `json:"usage,omitempty"`
	}{c.id, "text_completion", c.created, c.model, choices, u})
}

func (c *completionWriter) Whole(out string, tokens []serving.TokenInfo, finish string, prompt, completion int) []byte {
	return c.object([]completionChoice{{Text: out, Logprobs: c.logprobsOf(tokens), FinishReason: &finish}}, usageOf(prompt, completion))
}

func (c *completionWriter) First(int) []byte { return nil }

func (c *completionWriter) Chunk(ev serving.TextEvent) []byte {
	ch := completionChoice{Text: ev.Text, Logprobs: c.logprobsOf(ev.Tokens)}
	if ev.Finish != "" {
		ch.FinishReason = &ev.Finish
	}
	return text.SSE(c.object([]completionChoice{ch}, nil))
}

// WholeN implements [text.ChoicesWriter].
func (c *completionWriter) WholeN(choices []text.Choice, prompt, completion int) []byte {
	out := make([]completionChoice, len(choices))
	for i, ch := range choices {
		c.offset = 0
		if i < len(c.echo) {
			ch.Text = c.echo[i] + ch.Text
		}
		out[i] = completionChoice{Index: ch.Index, Text: ch.Text, Logprobs: c.logprobsOf(ch.Prompt, ch.Tokens), FinishReason: &ch.Finish}
	}
	return c.object(out, usageOf(prompt, completion))
}

// ChunkN implements [text.ChoicesWriter]: choice i's piece, its echoed
// prompt before its first.
func (c *completionWriter) ChunkN(i int, ev serving.TextEvent) []byte {
	for len(c.offsets) <= i {
		c.offsets = append(c.offsets, -1)
	}
	ch := completionChoice{Index: i, Text: ev.Text}
	if c.offsets[i] < 0 {
		c.offsets[i] = 0
		if i < len(c.echo) {
			ch.Text = c.echo[i] + ch.Text
		}
	}
	c.offset = c.offsets[i]
	ch.Logprobs = c.logprobsOf(ev.Prompt, ev.Tokens)
	c.offsets[i] = c.offset
	if ev.Finish != "" {
		ch.FinishReason = &ev.Finish
	}
	return text.SSE(c.object([]completionChoice{ch}, nil))
}

func (c *completionWriter) End(prompt, completion int) []byte {
	var b []byte
	if c.usage {
		b = text.SSE(c.object([]completionChoice{}, usageOf(prompt, completion)))
	}
	return append(b, "data: [DONE]\n\n"...)
}

func (c *completionWriter) StreamError(err error) []byte { return openaiStreamError(err) }
