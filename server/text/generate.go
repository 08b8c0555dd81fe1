package text

// The generation loop the text doors share: OpenAI's completions and
// chat, and Triton's generate extension. A request becomes one
// serving.GenerateRequest; the answer is one JSON body, or server-sent
// events each written under a deadline: a client that stops reading is
// cut off after streamWriteTimeout, and its sequence cancelled (its KV
// cache blocks freed at the next step).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/wire"
	"github.com/stepserve/stepserve/serving"
)

// streamWriteTimeout bounds one event's write to a streaming client.
const streamWriteTimeout = wire.StreamWriteTimeout

// OrParam is err naming param, unless it names one already.
func OrParam(param string, err error) error {
	var pe *ParamError
	if errors.As(err, &pe) {
		return err
	}
	return WithParam(param, err)
}

// FindGenerative chooses the language model a request names.
func (t *Request) FindGenerative(name, version string) error {
	if name == "" {
		return WithParam("model", apierr.BadRequest("model is required: the name of a language model served here (GET /v1/models lists them)"))
	}
	if strings.HasPrefix(name, "http://") || strings.HasPrefix(name, "https://") {
		// Hugging Face's JS client names the endpoint's URL: the only
		// language model served here, or a refusal listing them.
		_, err := t.Choose("", "a model named by the endpoint's URL", KindGenerative)
		return WithParam("model", err)
	}
	m, err := t.Find(name, version)
	if err != nil {
		return WithParam("model", err)
	}
	if !m.Generative() {
		return WithParam("model", apierr.BadRequest(fmt.Sprintf("model %s is not a language model; it serves %s", name, SigOf(m.Model()).Kind)))
	}
	return t.Ready()
}

// paramOf names the request field a generation refusal is about, for
// OpenAI's error's param.
func paramOf(err error) string {
	if errors.Is(err, models.ErrChat) {
		return "messages"
	}
	msg := err.Error()
	if strings.Contains(msg, "structured output") || strings.Contains(msg, "constraint") {
		return "response_format"
	}
	for _, p := range []string{"max_tokens", "temperature", "top_p", "top_k", "top_logprobs", "frequency_penalty", "presence_penalty",
		"repetition_penalty", "logit_bias", "stop_token_ids", "stop", "messages", "prompt"} {
		if strings.Contains(msg, p) {
			return p
		}
	}
	if strings.Contains(msg, "chat template") {
		return "messages"
	}
	return "prompt"
}

// generateError is err, serving's refusal of gr, as a request error
// naming the field it is about.
func generateError(err error, gr *serving.GenerateRequest) error {
	if !errors.Is(err, serving.ErrBadParameter) {
		return err
	}
	param := paramOf(err)
	if param == "prompt" && gr.Messages != nil {
		param = "messages"
	}
	msg := strings.TrimPrefix(err.Error(), serving.ErrBadParameter.Error()+": ")
	return WithParam(param, apierr.BadRequest(strings.TrimPrefix(msg, "models: chat: ")))
}

// Writer writes one API's answer to a generation: whole, or as a
// stream of events.
type Writer interface {
	Streaming() bool
	// Whole is the answer of a generation that ended.
	Whole(text string, tokens []serving.TokenInfo, finish string, prompt, completion int) []byte
	// First is the stream's first event (nil for none), once the prompt
	// is known to be prompt tokens.
	First(prompt int) []byte
	// Chunk is a streamed piece; finish is set on the last.
	Chunk(ev serving.TextEvent) []byte
	// End is what follows the last piece, usage counted (nil for none).
	End(prompt, completion int) []byte
	// StreamError is an error event after the stream began.
	StreamError(err error) []byte
}

// GenerateTo runs gr on the request's model and answers through gw: one
// answer once the generation ends, or server-sent events as it goes.
func (t *Request) GenerateTo(gr *serving.GenerateRequest, gw Writer) int {
	ctx := t.Context()
	ts, err := t.Generate(gr)
	if err != nil {
		return t.Fail(generateError(err, gr))
	}
	defer ts.Close()
	rc := http.NewResponseController(t.W)
	if !gw.Streaming() {
		var text strings.Builder
		var tokens []serving.TokenInfo
		for {
			ev, ok := ts.Next(ctx)
			if !ok {
				break
			}
			if ev.Err != nil {
				return t.Fail(ev.Err)
			}
			if pw, ok := gw.(interface{ PromptTokens([]serving.TokenInfo) }); ok && ev.Prompt != nil {
				pw.PromptTokens(ev.Prompt) // the prompt's scores, for the APIs that answer them
			}
			text.WriteString(ev.Text)
			tokens = append(tokens, ev.Tokens...)
			if ev.Finish != "" {
				// A generation may outlast server.write_timeout: the
				// answer gets its own deadline, as each streamed event.
				rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
				if sw, ok := gw.(interface{ StopString(string) }); ok {
					sw.StopString(ev.Stop) // which stop string ended it, for the APIs that say
				}
				if ew, ok := gw.(interface{ EndOfSequence(serving.TokenInfo) }); ok && ev.EOS != nil {
					ew.EndOfSequence(*ev.EOS) // the end-of-sequence token, for the APIs that list it
				}
				return t.OK(gw.Whole(text.String(), tokens, ev.Finish, ts.PromptTokens, ts.CompletionTokens), nil)
			}
		}
		return t.Fail(context.Canceled)
	}
	write, ok := t.beginEvents(rc, gw.StreamError)
	if !ok {
		return t.Gone()
	}
	if !write(gw.First(ts.PromptTokens)) {
		return t.Gone()
	}
	for {
		ev, ok := ts.Next(ctx)
		if !ok {
			break
		}
		if ev.Err != nil {
			return t.Fail(ev.Err)
		}
		if !write(gw.Chunk(ev)) {
			return t.Gone()
		}
		if ev.Finish != "" {
			write(gw.End(ts.PromptTokens, ts.CompletionTokens))
			return t.Succeed(nil)
		}
	}
	return t.Gone()
}

// beginEvents starts a stream of server-sent events: the headers now
// (sent at once, before the first token: queueing and prefill may take a
// while); false when the client is gone. write sends an event (nil is
// none) under its own deadline; from here a failure is the stream's
// error event.
func (t *Request) beginEvents(rc *http.ResponseController, streamError func(error) []byte) (write func([]byte) bool, ok bool) {
	h := t.W.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	t.W.WriteHeader(http.StatusOK)
	rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	if rc.Flush() != nil {
		return nil, false
	}
	write = func(b []byte) bool {
		if b == nil {
			return true
		}
		rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		if _, err := t.W.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	t.Sink(func(_ int, err error) {
		if t.Context().Err() == nil {
			write(streamError(err))
		}
	})
	return write, true
}

// SSE frames a JSON event.
func SSE(b []byte) []byte { return append(append([]byte("data: "), b...), '\n', '\n') }

func Marshal(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
