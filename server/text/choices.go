package text

// Several choices in one answer: OpenAI's n, best_of and prompt arrays.
// Each choice is a generation of its own; the choices of one prompt are
// submitted one after the other (serving.GenerateRequest.After), so that
// they share the prompt's computed blocks. An answer is written once
// every choice has ended, or streamed with each event tagged by its
// choice's index.

import (
	"cmp"
	"context"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/stepserve/stepserve/serving"
)

// Group is one prompt's generations: Requests[0] first, the others of
// the same prompt after it; the Keep with the highest log-probability
// (summed over their tokens) are its choices (best_of), all of them when
// Keep is 0.
type Group struct {
	Requests []*serving.GenerateRequest
	Keep     int
}

// Choice is one generation's answer.
type Choice struct {
	Index  int
	Text   string
	Tokens []serving.TokenInfo
	Finish string
	Stop   string
	// Prompt are the prompt's tokens with their log-probabilities, where
	// the generation asked (serving.GenerateRequest.ScorePrompt).
	Prompt []serving.TokenInfo
	// Logprob sums the tokens' log-probabilities (best_of's measure).
	Logprob float64
}

// ChoicesWriter writes an answer of several choices.
type ChoicesWriter interface {
	Streaming() bool
	// WholeN is the answer once every choice has ended; prompt counts
	// each prompt's tokens once, completion every generated token.
	WholeN(choices []Choice, prompt, completion int) []byte
	// ChunkN is choice i's piece of a stream.
	ChunkN(i int, ev serving.TextEvent) []byte
	End(prompt, completion int) []byte
	StreamError(err error) []byte
}

// indexed is a choice's event.
type indexed struct {
	i  int
	ev serving.TextEvent
}

// GenerateChoices runs every group's generations on the request's model
// and answers through gw: every choice whole, or their events as they
// come, each tagged with its index (group g's choices are g*keep..).
func (t *Request) GenerateChoices(groups []Group, gw ChoicesWriter) int {
	var streams []*serving.TextStream
	var index []int // by stream: its choice index
	var readers sync.WaitGroup
	defer func() {
		for _, ts := range streams {
			ts.Close()
		}
	}()
	defer readers.Wait() // before the streams are closed
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel() // first: the readers stop
	prompt := 0
	for g, grp := range groups {
		keep := grp.Keep
		if keep == 0 {
			keep = len(grp.Requests)
		}
		var first *serving.TextStream
		for j, gr := range grp.Requests {
			gr.After = first
			ts, err := t.Generate(gr)
			if err != nil {
				return t.Fail(generateError(err, gr))
			}
			if first == nil {
				first = ts
				prompt += ts.PromptTokens
			}
			streams = append(streams, ts)
			index = append(index, g*keep+j)
		}
	}
	t.Info.Rows = len(streams)
	// One reader a stream, into one channel; they end when their stream
	// ends or the request does.
	events := make(chan indexed, len(streams))
	for s, ts := range streams {
		readers.Go(func() {
			for {
				ev, ok := ts.Next(ctx)
				if !ok {
					return
				}
				select {
				case events <- indexed{s, ev}:
				case <-ctx.Done():
					return
				}
				if ev.Finish != "" || ev.Err != nil {
					return
				}
			}
		})
	}
	completion := func() int {
		n := 0
		for _, ts := range streams {
			n += ts.CompletionTokens
		}
		return n
	}
	rc := http.NewResponseController(t.W)
	if !gw.Streaming() {
		choices := make([]Choice, len(streams))
		texts := make([]strings.Builder, len(streams))
		for ended := 0; ended < len(streams); {
			var e indexed
			select {
			case e = <-events:
			case <-ctx.Done():
				return t.Fail(context.Cause(ctx))
			}
			if e.ev.Err != nil {
				return t.Fail(e.ev.Err)
			}
			c := &choices[e.i]
			if e.ev.Prompt != nil {
				c.Prompt = e.ev.Prompt
			}
			texts[e.i].WriteString(e.ev.Text)
			c.Tokens = append(c.Tokens, e.ev.Tokens...)
			for _, tk := range e.ev.Tokens {
				c.Logprob += float64(tk.Logprob)
			}
			if e.ev.EOS != nil && !math.IsNaN(float64(e.ev.EOS.Logprob)) {
				c.Logprob += float64(e.ev.EOS.Logprob) // best_of counts how likely the end was
			}
			if e.ev.Finish != "" {
				c.Finish, c.Stop, c.Text = e.ev.Finish, e.ev.Stop, texts[e.i].String()
				ended++
			}
		}
		var out []Choice
		at := 0
		for _, grp := range groups {
			mine := choices[at : at+len(grp.Requests)]
			if grp.Keep > 0 && grp.Keep < len(mine) {
				mine = slices.Clone(mine)
				slices.SortStableFunc(mine, func(a, b Choice) int { return cmp.Compare(b.Logprob, a.Logprob) })
				mine = mine[:grp.Keep]
			}
			out = append(out, mine...)
			at += len(grp.Requests)
		}
		for i := range out {
			out[i].Index = i
		}
		rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		return t.OK(gw.WholeN(out, prompt, completion()), nil)
	}
	write, ok := t.beginEvents(rc, gw.StreamError)
	if !ok {
		return t.Gone()
	}
	for ended := 0; ended < len(streams); {
		var e indexed
		select {
		case e = <-events:
		case <-ctx.Done():
			return t.Gone()
		}
		if e.ev.Err != nil {
			return t.Fail(e.ev.Err)
		}
		if !write(gw.ChunkN(index[e.i], e.ev)) {
			return t.Gone()
		}
		if e.ev.Finish != "" {
			ended++
		}
	}
	write(gw.End(prompt, completion()))
	return t.Succeed(nil)
}
