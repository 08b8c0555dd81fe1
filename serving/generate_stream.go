package serving

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/models/tokenizers"
)

// TextStream is one generation's text, as it is generated. Next reads
// it; Close ends it (a generation not read to its end is cancelled, its
// KV cache blocks freed at the next step).
type TextStream struct {
	g        *generator
	st       *generation.Stream
	cancel   context.CancelFunc
	release  func() // gives the generation's place back, once
	dec      *tokenizers.Stream
	stops    []string
	logprobs bool
	prompt   []int32 // its prompt's tokens
	scored   bool    // its prompt's tokens are scored (GenerateRequest.ScorePrompt)
	pending  string  // text held back: it may begin a stop string
	done     bool
	start    time.Time
	first    time.Time
	last     time.Time
	once     sync.Once

	maxTokens int // the most tokens it generates
	top       int // the most likely tokens each one's logprobs list

	// PromptTokens and CompletionTokens count the prompt's tokens and
	// those generated so far (the usage the APIs report).
	PromptTokens, CompletionTokens int
}

// Next returns the next piece of text. The last event has Finish or Err
// set; after it, Next reports false.
func (s *TextStream) Next(ctx context.Context) (TextEvent, bool) {
	if s.done {
		return TextEvent{}, false
	}
	var out TextEvent
	for {
		ev, ok := s.st.Next(ctx)
		if !ok && ev.Err == nil {
			ev.Err = ErrDraining // the stream ended without its last event: cannot happen
		}
		if ev.Prompt != nil {
			out.Prompt = s.promptInfo(ev.Prompt)
		}
		if ev.Err != nil {
			s.done = true
			out.Err = ev.Err
			if errors.Is(ev.Err, generation.ErrStopped) {
				out.Err = fmt.Errorf("%w: the model was unloaded during the generation", ErrDraining)
			}
			return out, true
		}
		if ev.Finish == generation.NotFinished {
			now := time.Now()
			if s.CompletionTokens == 0 {
				s.first = now
				s.g.metrics.firstToken(now.Sub(s.start).Seconds())
			}
			s.last = now
			s.CompletionTokens++
			s.g.metrics.generatedToken()
			if s.logprobs {
				out.Tokens = append(out.Tokens, s.info(ev))
			} else {
				out.Tokens = append(out.Tokens, TokenInfo{ID: ev.Token})
			}
			s.pending += s.dec.Next(int64(ev.Token))
			if s.cut(&out) {
				return out, true
			}
			keep := s.holdBack()
			out.Text += s.pending[:len(s.pending)-keep]
			s.pending = s.pending[len(s.pending)-keep:]
			if out.Text != "" {
				return out, true
			}
			continue
		}
		// The last event: what is held back, and the bytes the
		// detokenizer kept, go out (unless they make a stop string).
		if ev.EOS {
			eos := s.info(ev)
			if !s.logprobs {
				eos.Logprob, eos.Top = float32(math.NaN()), nil // not asked, not computed
			}
			out.EOS = &eos
		}
		s.pending += s.dec.Flush()
		if s.cut(&out) {
			return out, true
		}
		out.Text += s.pending
		s.pending = ""
		s.done = true
		switch ev.Finish {
		case generation.FinishStop, generation.FinishComplete:
			out.Finish = "stop"
		case generation.FinishLength:
			out.Finish = "length"
		default:
			out.Err = context.Canceled
		}
		return out, true
	}
}

// Per generated token, what a stream may hold until its client reads it:
// the loop's event (in a queue that doubles as it grows) and the text
// the door builds from it (a token is at most a few dozen bytes of
// text), and with logprobs each listed token's entry, as the loop's (8
// bytes) and the door's (its text and bytes besides).
const (
	heldPerToken    = 2*64 + 64
	heldPerTopToken = 80
)

// MaxHeld bounds the memory the stream's events and text may take while
// they wait for its client: what a door charges to the in-flight budget
// for the generation's life, so that clients that do not read cannot
// hold memory the budget does not see.
func (s *TextStream) MaxHeld() int64 {
	n := int64(s.maxTokens)
	if s.scored { // the prompt's tokens come back too, scored
		n += int64(len(s.prompt))
	}
	return n * (heldPerToken + int64(s.top)*heldPerTopToken)
}

// cut ends the stream at the first stop string in the pending text.
func (s *TextStream) cut(out *TextEvent) bool {
	at, which := -1, ""
	for _, stop := range s.stops {
		if i := strings.Index(s.pending, stop); i >= 0 && (at < 0 || i < at) {
			at, which = i, stop
		}
	}
	if at < 0 {
		return false
	}
	out.Text += s.pending[:at]
	out.Finish, out.Stop = "stop", which
	s.pending = ""
	s.done = true
	s.cancel() // the sequence stops at the next step
	return true
}

// holdBack is how many bytes at the end of the pending text may begin a
// stop string.
func (s *TextStream) holdBack() int {
	keep := 0
	for _, stop := range s.stops {
		for n := min(len(stop)-1, len(s.pending)); n > keep; n-- {
			if strings.HasSuffix(s.pending, stop[:n]) {
				keep = n
				break
			}
		}
	}
	return keep
}

func (s *TextStream) info(ev generation.Event) TokenInfo {
	tok := s.g.tok.Tokenizers()
	ti := TokenInfo{ID: ev.Token, Text: tok.Decode([]int64{int64(ev.Token)}, false), Bytes: tok.TokenBytes(int64(ev.Token)),
		Special: tok.Special(int64(ev.Token)), Logprob: finiteLogprob(ev.Logprob)}
	for _, t := range ev.Top {
		ti.Top = append(ti.Top, TopToken{ID: t.Token, Text: tok.Decode([]int64{int64(t.Token)}, false), Bytes: tok.TokenBytes(int64(t.Token)),
			Logprob: finiteLogprob(t.Logprob)})
	}
	return ti
}

// promptInfo is the prompt's tokens with their scores (of tokens 1..).
func (s *TextStream) promptInfo(scored []generation.PromptLogprob) []TokenInfo {
	tok := s.g.tok.Tokenizers()
	out := make([]TokenInfo, len(s.prompt))
	for i, id := range s.prompt {
		out[i] = TokenInfo{ID: id, Text: tok.Decode([]int64{int64(id)}, false), Bytes: tok.TokenBytes(int64(id)), Special: tok.Special(int64(id)),
			Logprob: float32(math.NaN())}
		if i == 0 || i-1 >= len(scored) {
			continue
		}
		sc := scored[i-1]
		out[i].Logprob = finiteLogprob(sc.Logprob)
		for _, t := range sc.Top {
			out[i].Top = append(out[i].Top, TopToken{ID: t.Token, Text: tok.Decode([]int64{int64(t.Token)}, false), Bytes: tok.TokenBytes(int64(t.Token)),
				Logprob: finiteLogprob(t.Logprob)})
		}
	}
	return out
}

// finiteLogprob is lp, or -9999 (what OpenAI answers for a token of no
// probability) where it is not finite: JSON has no infinities.
func finiteLogprob(lp float32) float32 {
	if math.IsNaN(float64(lp)) || math.IsInf(float64(lp), 0) {
		return -9999
	}
	return lp
}

// Close ends the generation: one not read to its end is cancelled. It
// records the request's latencies, once.
func (s *TextStream) Close() {
	s.once.Do(func() {
		s.cancel()
		tpot := 0.0
		if s.CompletionTokens > 1 {
			tpot = s.last.Sub(s.first).Seconds() / float64(s.CompletionTokens-1)
		}
		s.g.metrics.ended(time.Since(s.start).Seconds(), tpot, s.CompletionTokens)
		s.release()
	})
}
