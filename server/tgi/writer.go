package tgi

import (
	"math"
	"slices"

	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/text"
	"github.com/stepserve/stepserve/serving"
)

// writer is TGI's answer to a generation: GenerateResponse, an array of
// one on POST /, or StreamResponse events, one a token, the last with
// the whole text (and the details, where asked).
type writer struct {
	stream, compat, details bool
	prefix                  string // return_full_text's prompt
	seed                    *int64 // the draw's seed, when sampled
	top                     int    // top_n_tokens
	end                     serving.TokenInfo

	eos     *serving.TokenInfo  // the end-of-sequence token that ended it, listed as TGI lists it
	stop    string              // the stop sequence that ended it
	prefill []serving.TokenInfo // the prompt's tokens, scored (decoder_input_details)
	prompt  int                 // its tokens
	text    []byte              // the text so far (a stream's last event carries it)
	held    *serving.TokenInfo
	index   int
}

// token is TGI's Token.
type token struct {
	ID      int32    `json:"id"`
	Text    string   `json:"text"`
	Logprob *float32 `json:"logprob"`
	Special bool     `json:"special"`
}

func tokenOf(ti *serving.TokenInfo) token {
	t := token{ID: ti.ID, Text: ti.Text, Special: ti.Special}
	if !math.IsNaN(float64(ti.Logprob)) {
		lp := ti.Logprob
		t.Logprob = &lp
	}
	return t
}

func topOf(ti *serving.TokenInfo) []token {
	var out []token
	for _, tt := range ti.Top {
		lp := tt.Logprob
		out = append(out, token{ID: tt.ID, Text: tt.Text, Logprob: &lp})
	}
	return out
}

type details struct {
	FinishReason    string         `json:"finish_reason"`
	GeneratedTokens int            `json:"generated_tokens"`
	Seed            *int64         `json:"seed"`
	Prefill         []prefillToken `json:"prefill"`
	Tokens          []token        `json:"tokens"`
	TopTokens       [][]token      `json:"top_tokens,omitempty"`
}

// prefillToken is TGI's PrefillToken: a prompt token, its
// log-probability null for the first.
type prefillToken struct {
	ID      int32    `json:"id"`
	Text    string   `json:"text"`
	Logprob *float32 `json:"logprob"`
}

type response struct {
	GeneratedText string   `json:"generated_text"`
	Details       *details `json:"details"`
}

type streamDetails struct {
	FinishReason    string `json:"finish_reason"`
	GeneratedTokens int    `json:"generated_tokens"`
	InputLength     int    `json:"input_length"`
	Seed            *int64 `json:"seed"`
}

type streamResponse struct {
	Index         int            `json:"index"`
	Token         token          `json:"token"`
	TopTokens     []token        `json:"top_tokens,omitempty"`
	GeneratedText *string        `json:"generated_text"`
	Details       *streamDetails `json:"details"`
}

// finishReason is TGI's name for how the generation ended.
func (w *writer) finishReason(finish string) string {
	switch {
	case finish == "length":
		return "length"
	case w.stop != "":
		return "stop_sequence"
	}
	return "eos_token"
}

// generated is the answer's generated_text: the prompt first where
// return_full_text asks, and the stop sequence that ended it last, as
// TGI writes them.
func (w *writer) generated(out string) string { return w.prefix + out + w.stop }

func (w *writer) Streaming() bool { return w.stream }

// EndOfSequence records the end-of-sequence token that ended a whole
// answer.
func (w *writer) EndOfSequence(t serving.TokenInfo) { w.eos = &t }

// PromptTokens records the prompt's scored tokens.
func (w *writer) PromptTokens(p []serving.TokenInfo) { w.prefill = p }

// StopString records the stop sequence that ended a whole answer.
func (w *writer) StopString(s string) { w.stop = s }

func (w *writer) Whole(out string, tokens []serving.TokenInfo, finish string, _, completion int) []byte {
	r := response{GeneratedText: w.generated(out)}
	if w.details {
		d := &details{FinishReason: w.finishReason(finish), GeneratedTokens: completion, Seed: w.seed, Prefill: []prefillToken{}, Tokens: []token{}}
		for i := range w.prefill {
			t := tokenOf(&w.prefill[i])
			d.Prefill = append(d.Prefill, prefillToken{ID: t.ID, Text: t.Text, Logprob: t.Logprob})
		}
		if w.eos != nil { // TGI lists the end-of-sequence token last, and counts it
			tokens = append(slices.Clip(tokens), *w.eos)
			d.GeneratedTokens++
		}
		for i := range tokens {
			d.Tokens = append(d.Tokens, tokenOf(&tokens[i]))
			if w.top > 0 {
				d.TopTokens = append(d.TopTokens, topOf(&tokens[i]))
			}
		}
		r.Details = d
	}
	if w.compat {
		return text.Marshal([]response{r})
	}
	return text.Marshal(r)
}

func (w *writer) First(prompt int) []byte {
	w.prompt = prompt
	return nil
}

// event is one StreamResponse for ti.
func (w *writer) event(ti *serving.TokenInfo, last *string, d *streamDetails) []byte {
	w.index++
	ev := streamResponse{Index: w.index, Token: tokenOf(ti), GeneratedText: last, Details: d}
	if w.top > 0 {
		ev.TopTokens = topOf(ti)
	}
	return text.SSE(text.Marshal(ev))
}

// Chunk writes an event for each token but the last one seen, which is
// held: TGI's last event carries the last token with the whole text.
func (w *writer) Chunk(ev serving.TextEvent) []byte {
	var b []byte
	for i := range ev.Tokens {
		if w.held != nil {
			b = append(b, w.event(w.held, nil, nil)...)
		}
		tk := ev.Tokens[i]
		w.held = &tk
	}
	w.text = append(w.text, ev.Text...)
	if ev.Finish == "" {
		return b
	}
	w.stop = ev.Stop
	last := w.held
	if ev.EOS != nil {
		// TGI's last event carries the end-of-sequence token.
		if w.held != nil {
			b = append(b, w.event(w.held, nil, nil)...)
		}
		last = ev.EOS
	} else if last == nil { // nothing generated, nor an end token: the model's
		last = &w.end
	}
	all := w.generated(string(w.text))
	var d *streamDetails
	if w.details {
		d = &streamDetails{FinishReason: w.finishReason(ev.Finish), GeneratedTokens: w.index + 1, InputLength: w.prompt, Seed: w.seed}
	}
	return append(b, w.event(last, &all, d)...)
}

func (w *writer) End(int, int) []byte { return nil }

func (w *writer) StreamError(err error) []byte {
	typ, _ := errorType(core.StatusOf(err), err)
	return text.SSE(errorBody(typ, err))
}
