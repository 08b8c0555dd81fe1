// Package text is what the text doors share (OpenAI's, TEI's and
// Triton's generate extension): a text model's signature (what it
// serves: embeddings, classes, reranking), a request of texts run on the
// OIP path (the same footprint and in-flight budget, the same batcher,
// the same metrics, log lines and model statistics, through the core's
// call), JSON bodies decoded within the budget, and the generation loop
// that writes one answer or a stream of server-sent events. It is not a
// door: it registers no route, and imports no door, engine, batcher,
// generation loop or step runner.
package text

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/wire"
	"github.com/stepserve/stepserve/serving"
)

// LabelFormat names a class without a name, as Hugging Face does.
const LabelFormat = "LABEL_%d"

// MaxClientBatch bounds the texts of one request of the text APIs, as
// OpenAI's embeddings endpoint bounds its input list.
const MaxClientBatch = 2048

// Kind is what a text model serves, read from its signature.
type Kind int

const (
	KindNone       Kind = iota
	KindEmbedding       // output embedding: /v1/embeddings, /embed
	KindClassifier      // output logits: /predict
	KindReranker        // output logits of 1 label, with a text_pair input: /rerank (and /predict)
	KindGenerative      // a language model: /v1/completions, TGI's /generate (and POST /, GET /info)
)

func (k Kind) String() string {
	switch k {
	case KindEmbedding:
		return "embeddings (/v1/embeddings, /embed)"
	case KindClassifier:
		return "classification (/predict)"
	case KindReranker:
		return "reranking (/rerank, /predict)"
	case KindGenerative:
		return "text generation (/v1/completions, /v1/chat/completions, /generate)"
	}
	return "no text API (it takes no text input)"
}

// Sig is a text model's signature as the text APIs use it.
type Sig struct {
	Kind   Kind
	Text   int // the text input's index
	Pair   int // the text_pair input's index; -1 when the model scores single texts
	Output int // the embedding or logits output's index
	Width  int // the output's elements a row: H, or the labels
}

// SigOf reads what m serves: a model with a text BYTES [-1] input
// and an embedding or logits FP32 [-1, n] output, or a language model.
func SigOf(m *models.Model) Sig {
	cfg := m.Config
	tm := Sig{Text: -1, Pair: -1, Output: -1}
	if m.Decoder != nil {
		tm.Kind = KindGenerative
		return tm
	}
	for i, in := range cfg.Inputs {
		if in.Datatype != models.BYTES || !slices.Equal(in.Shape, []int{-1}) {
			continue
		}
		switch in.Name {
		case models.TextInput:
			tm.Text = i
		case models.TextPairInput:
			tm.Pair = i
		}
	}
	if tm.Text < 0 || m.Tokenizer == nil {
		return Sig{Kind: KindNone}
	}
	for i, o := range cfg.Outputs {
		if o.Datatype != models.FP32 || len(o.Shape) != 2 || o.Shape[1] < 1 {
			continue
		}
		switch o.Name {
		case models.EmbeddingOutput:
			tm.Kind, tm.Output, tm.Width = KindEmbedding, i, o.Shape[1]
		case models.LogitsOutput:
			if tm.Kind != KindEmbedding {
				tm.Kind, tm.Output, tm.Width = KindClassifier, i, o.Shape[1]
				if tm.Width == 1 && tm.Pair >= 0 {
					tm.Kind = KindReranker
				}
			}
		}
	}
	return tm
}

// labels are the class names of a classifier's logits: its labels file's
// (or config.json's id2label), else LABEL_i.
func (tm Sig) Labels(m *models.Model) []string {
	if tm.Output < len(m.Labels) && len(m.Labels[tm.Output]) == tm.Width {
		return m.Labels[tm.Output]
	}
	out := make([]string, tm.Width)
	for i := range out {
		out[i] = fmt.Sprintf(LabelFormat, i)
	}
	return out
}

// serves reports whether a model of kind k serves an endpoint that wants
// one of kinds.
func (k Kind) Serves(kinds []Kind) bool { return slices.Contains(kinds, k) }

// Protocol is one text API: its metrics label and its error shape.
type Protocol struct {
	Label int // core.ProtocolOpenAI, ...
	// WriteError writes err, whose status core.StatusOf gives (or the
	// protocol's own), in the API's error shape.
	WriteError func(w http.ResponseWriter, status int, err error)
}

// Request is one request of a text API: its call through the core
// (core.Call: the budget, the model, its statistics, metrics and log),
// and the HTTP exchange it answers.
type Request struct {
	*core.Call
	W http.ResponseWriter
	R *http.Request
}

// Serve answers one request of a text API: it reads the body within the
// server's limits, has handle answer it, and counts and logs it under
// the API's protocol label. handle chooses the model and answers through
// t.Fail or t.OK, or a stream of its own.
func Serve(c *core.Core, w http.ResponseWriter, r *http.Request, api *Protocol, handle func(t *Request, body []byte) int) {
	ServeOn(c, w, r, api, nil, handle)
}

// ServeOn is Serve for a route that names its model (Triton's generate):
// find chooses it before the body is read, as OIP's infer does, so that a
// refusal while the body arrives is counted under the model.
func ServeOn(c *core.Core, w http.ResponseWriter, r *http.Request, api *Protocol, find func(t *Request) error, handle func(t *Request, body []byte) int) {
	call := c.BeginHTTP(w, r, api.Label, api.WriteError)
	defer call.End()
	t := &Request{Call: call, W: w, R: r}
	if id := r.Header.Get("X-Request-Id"); id != "" {
		t.Info.ID = id
	}
	if find != nil {
		if err := find(t); err != nil {
			t.Fail(err)
			return
		}
	}
	body, err := t.Read(w, r)
	if err != nil {
		t.Fail(err)
		return
	}
	handle(t, body)
}

// OK writes a JSON answer, and reports the request to its model's
// statistics (res when a step ran it).
func (t *Request) OK(body []byte, res *serving.Result) int {
	h := t.W.Header()
	h["Content-Type"] = core.ContentTypeJSON
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	t.W.WriteHeader(http.StatusOK)
	t.W.Write(body)
	return t.Succeed(res)
}

// ParamError is a request error about one of the body's fields: OpenAI's
// errors name it as their param.
type ParamError struct {
	Param string
	Err   error
}

func (e *ParamError) Error() string { return e.Err.Error() }
func (e *ParamError) Unwrap() error { return e.Err }

// WithParam is err naming param, the field at fault, unless an error it
// wraps names one already (the innermost names the field).
func WithParam(param string, err error) error {
	if err == nil {
		return nil
	}
	if pe := (*ParamError)(nil); errors.As(err, &pe) || param == "" {
		return err
	}
	return &ParamError{param, err}
}

// ErrEmpty marks the refusals of a request with nothing to run (TEI
// calls them Empty).
var ErrEmpty = errors.New("empty")

// emptyError is a 400 with nothing to run.
type emptyError struct{ err *apierr.Error }

// EmptyRequest is a 400 for a request with nothing to run.
func EmptyRequest(msg string) error { return &emptyError{apierr.BadRequest(msg)} }

func (e *emptyError) Error() string        { return e.err.Msg }
func (e *emptyError) Unwrap() error        { return e.err }
func (e *emptyError) Is(target error) bool { return target == ErrEmpty }

// Choose chooses the model a request names (name, or the query's model=),
// or, without a name, the one chosen already (POST / chose it to
// dispatch), else the only model of the kinds the endpoint wants.
// endpoint names the endpoint in messages.
func (t *Request) Choose(name, endpoint string, kinds ...Kind) (Sig, error) {
	m, tm, err := Choose(t.Core(), t.R, t.Model(), name, endpoint, kinds...)
	if m != nil {
		t.Use(m)
	}
	return tm, err
}

// Choose is [Request.Choose] for a route that runs nothing (TEI's /info):
// the model chosen (nil when none is), its signature, and why it cannot
// answer endpoint.
func Choose(c *core.Core, r *http.Request, chosen *serving.Model, name, endpoint string, kinds ...Kind) (*serving.Model, Sig, error) {
	if name == "" {
		name = r.URL.Query().Get("model")
	}
	m := chosen
	switch {
	case name == "" && m != nil:
		// Chosen already: kept, not chosen again (a model loaded since
		// could make the choice ambiguous).
	case name == "":
		var names []string
		for _, sm := range c.Opts.Models.Models() {
			if SigOf(sm.Model()).Kind.Serves(kinds) {
				names = append(names, sm.Model().Name)
				m = sm
			}
		}
		switch len(names) {
		case 1:
		case 0:
			return nil, Sig{}, &apierr.Error{Status: http.StatusUnprocessableEntity, Msg: fmt.Sprintf("no model served here answers %s", endpoint)}
		default:
			slices.Sort(names)
			return nil, Sig{}, &apierr.Error{Status: http.StatusUnprocessableEntity, Msg: fmt.Sprintf(
				"%d models answer %s; name one with \"model\" in the body or ?model=: %s", len(names), endpoint, strings.Join(names, ", "))}
		}
	default:
		var err error
		if m, err = c.Lookup(name, ""); err != nil {
			return nil, Sig{}, err
		}
	}
	tm := SigOf(m.Model())
	if !tm.Kind.Serves(kinds) {
		return m, tm, &apierr.Error{Status: http.StatusUnprocessableEntity, Msg: fmt.Sprintf("model %s serves %s, not %s", m.Model().Name, tm.Kind, endpoint)}
	}
	if !m.Ready() {
		return m, tm, core.NotReady(m.Model().Name)
	}
	return m, tm, nil
}

// ClientBatch is the most texts (or id lists) one request may send:
// MaxClientBatch, within the server's element limit.
func ClientBatch(c *core.Core) int {
	return min(MaxClientBatch, int(min(c.Opts.MaxRequestElements, math.MaxInt32)))
}

// CheckTexts bounds a request's texts: at least one, at most
// clientBatch.
func (t *Request) CheckTexts(n int, what string) error {
	switch limit := ClientBatch(t.Core()); {
	case n == 0:
		return EmptyRequest(what + " is empty; send at least one text")
	case n > limit:
		return &apierr.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("%s holds %d texts, more than the %d a request may send; split it", what, n, limit)}
	}
	return nil
}

// InferTexts runs texts (and, for a pair model, pairs) through the model, as
// an OIP request with those inputs runs: the same footprint taken from
// the in-flight budget, plus extraJSON for the API's response beyond
// OIP's, the same batcher, and the same retry on a reload. It returns the
// step request, whose Outputs hold the model's outputs and whose Inputs
// the token tensors, and the footprint's JSON bound (what the response's
// buffer may take, charged already).
func (t *Request) InferTexts(tm Sig, texts, pairs []string, extraJSON int64) (*serving.Result, int64, error) {
	m := t.Model().Model()
	cfg := m.Config
	req := &wire.InferRequest{Rows: len(texts)}
	req.Inputs = req.InputsBuf[:0]
	if len(cfg.Inputs) > len(req.InputsBuf) {
		req.Inputs = make([]models.Input, 0, len(cfg.Inputs))
	}
	req.Inputs = req.Inputs[:len(cfg.Inputs)]
	shape := []int64{int64(len(texts))}
	const stringHeader = 16
	decoded := int64(0)
	for _, s := range texts {
		decoded += stringHeader + int64(len(s))
	}
	req.Inputs[tm.Text] = models.Input{Shape: shape, Strings: texts}
	if pairs != nil {
		if tm.Pair < 0 {
			return nil, 0, &apierr.Error{Status: http.StatusUnprocessableEntity, Msg: fmt.Sprintf("model %s scores single texts; it takes no %q input for pairs", m.Name, models.TextPairInput)}
		}
		req.Inputs[tm.Pair] = models.Input{Shape: shape, Strings: pairs}
		for _, s := range pairs {
			decoded += stringHeader + int64(len(s))
		}
	}
	req.Outputs = append(req.OutputsBuf[:0], wire.OutputChoice{Index: tm.Output})
	f := wire.FootprintOf(m, req, decoded, 0)
	f.JSON += extraJSON
	res, err := t.Infer(req, f)
	return res, f.JSON, err
}

// Overloaded reports whether err says the server is busy (a full queue,
// the in-flight budget spent), as opposed to a model that is not ready or
// is going away: the APIs answer those with statuses of their own.
func Overloaded(err error) bool {
	var ae *apierr.Error
	return errors.Is(err, serving.ErrQueueFull) ||
		errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable && strings.HasPrefix(ae.Msg, busyPrefix)
}

// busyPrefix begins the budget's 503 (budget.go).
const busyPrefix = "the server is busy"
