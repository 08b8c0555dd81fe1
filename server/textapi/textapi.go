package textapi

// The text APIs (OpenAI's embeddings, openai.go; Hugging Face's
// text-embeddings-inference, tei.go) on the path OIP requests take: the
// same body limit and in-flight budget, the same batcher, the same
// request metrics (with their own protocol label), log lines and model
// statistics. A request's texts become the model's text (and text_pair)
// inputs of an inferRequest, which [Server.run] runs as it runs a decoded
// OIP request; only the JSON on either side is the API's own.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/serving"
)

// labelFormat names a class without a name, as Hugging Face does.
const labelFormat = "LABEL_%d"

// maxClientBatch bounds the texts of one request of the text APIs, as
// OpenAI's embeddings endpoint bounds its input list.
const maxClientBatch = 2048

// textKind is what a text model serves, read from its signature.
type textKind int

const (
	kindNone       textKind = iota
	kindEmbedding           // output embedding: /v1/embeddings, /embed
	kindClassifier          // output logits: /predict
	kindReranker            // output logits of 1 label, with a text_pair input: /rerank (and /predict)
)

func (k textKind) String() string {
	switch k {
	case kindEmbedding:
		return "embeddings (/v1/embeddings, /embed)"
	case kindClassifier:
		return "classification (/predict)"
	case kindReranker:
		return "reranking (/rerank, /predict)"
	}
	return "no text API (it takes no text input)"
}

// textSig is a text model's signature as the text APIs use it.
type textSig struct {
	kind   textKind
	text   int // the text input's index
	pair   int // the text_pair input's index; -1 when the model scores single texts
	output int // the embedding or logits output's index
	width  int // the output's elements a row: H, or the labels
}

// textSigOf reads what m serves: a model with a text BYTES [-1] input
// and an embedding or logits FP32 [-1, n] output.
func textSigOf(m *models.Model) textSig {
	cfg := m.Config
	tm := textSig{text: -1, pair: -1, output: -1}
	for i, in := range cfg.Inputs {
		if in.Datatype != models.BYTES || !slices.Equal(in.Shape, []int{-1}) {
			continue
		}
		switch in.Name {
		case models.TextInput:
			tm.text = i
		case models.TextPairInput:
			tm.pair = i
		}
	}
	if tm.text < 0 || m.Tokenizer == nil {
		return textSig{kind: kindNone}
	}
	for i, o := range cfg.Outputs {
		if o.Datatype != models.FP32 || len(o.Shape) != 2 || o.Shape[1] < 1 {
			continue
		}
		switch o.Name {
		case models.EmbeddingOutput:
			tm.kind, tm.output, tm.width = kindEmbedding, i, o.Shape[1]
		case models.LogitsOutput:
			if tm.kind != kindEmbedding {
				tm.kind, tm.output, tm.width = kindClassifier, i, o.Shape[1]
				if tm.width == 1 && tm.pair >= 0 {
					tm.kind = kindReranker
				}
			}
		}
	}
	return tm
}

// labels are the class names of a classifier's logits: its labels file's
// (or config.json's id2label), else LABEL_i.
func (tm textSig) labels(m *models.Model) []string {
	if tm.output < len(m.Labels) && len(m.Labels[tm.output]) == tm.width {
		return m.Labels[tm.output]
	}
	out := make([]string, tm.width)
	for i := range out {
		out[i] = fmt.Sprintf(labelFormat, i)
	}
	return out
}

// serves reports whether a model of kind k serves an endpoint that wants
// one of kinds.
func (k textKind) serves(kinds []textKind) bool { return slices.Contains(kinds, k) }

// textProtocol is one text API: its metrics label and its error shape.
type textProtocol struct {
	protocol int
	// writeError writes err, whose status statusOf gives (or the
	// protocol's own), in the API's error shape.
	writeError func(w http.ResponseWriter, status int, err error)
}

// textAPIState is the server's state of the text APIs.
type textAPIState struct {
	// served creates each text protocol's series, at zero, with its
	// first request: a server whose clients never use an API does not
	// list its series.
	served [len(core.ProtocolLabels)]sync.Once
}

// textRequest is one request of a text API as it goes through the server.
type textRequest struct {
	s     *API
	w     http.ResponseWriter
	r     *http.Request
	api   *textProtocol
	ch    core.Charge
	m     *serving.Model // once the request names one that exists
	began time.Time
	info  core.RequestInfo
}

// serveText answers one request of a text API: it reads the body within
// the server's limits, has handle answer it, and counts and logs it as
// OIP requests are, under the API's protocol label. handle chooses the
// model (t.m) and answers, through t.fail or t.ok, with the status it
// returns.
func (s *API) serveText(w http.ResponseWriter, r *http.Request, api *textProtocol, handle func(t *textRequest, body []byte) int) {
	start := time.Now()
	s.served[api.protocol].Do(func() { s.c.Metrics.Serve(api.protocol) })
	t := &textRequest{s: s, w: w, r: r, api: api, ch: s.c.Charge(), began: start}
	defer t.ch.Release()
	if id := r.Header.Get("X-Request-Id"); id != "" {
		t.info.ID = id
	}
	var status int
	if body, err := s.c.ReadBody(w, r, &t.ch); err != nil {
		status = t.fail(err)
	} else {
		t.began = time.Now()
		status = handle(t, body)
	}
	t.info.Trace.Done(status) // its response is written
	took := time.Since(start)
	name := ""
	if t.m != nil {
		// Unknown names are not counted: they would let any client
		// create series without bound.
		name = t.m.Model().Name
		s.c.Metrics.Observe(api.protocol, name, status, took)
	}
	s.c.LogRequest(r.Context(), api.protocol, r.Method, r.URL.Path, name, status, t.info, r.ContentLength, took)
}

// fail answers err in the API's shape and returns its status.
func (t *textRequest) fail(err error) int {
	st := core.StatusOf(err)
	if t.m != nil {
		t.m.Report(nil, false, time.Since(t.began))
	}
	level := slog.LevelDebug
	if st >= 500 && st != http.StatusServiceUnavailable && st != http.StatusGatewayTimeout {
		level = slog.LevelError
	}
	if t.s.c.Logger.Enabled(t.r.Context(), level) {
		name := ""
		if t.m != nil {
			name = t.m.Model().Name
		}
		t.s.c.Logger.Log(t.r.Context(), level, "inference failed", "protocol", core.ProtocolLabels[t.api.protocol], "model", name, "status", st, "err", err)
	}
	t.api.writeError(t.w, st, err)
	return st
}

// ok writes a JSON answer, and reports a request that ran (sr) to the
// model's statistics.
func (t *textRequest) ok(body []byte, res *serving.Result) int {
	h := t.w.Header()
	h["Content-Type"] = core.ContentTypeJSON
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	t.w.WriteHeader(http.StatusOK)
	t.w.Write(body)
	if t.m != nil && res != nil {
		t.m.Report(res, true, time.Since(t.began))
	}
	return http.StatusOK
}

// decodeJSON decodes a request body into v with encoding/json, once the
// most it may build is charged: the body again, and a string header and
// a slice's share for every string it may hold (at most one per two
// quotes), so that a body of many tiny strings costs the server its
// budget, not more.
// field names the body's texts in the message of a texts field that does
// not decode.
func (t *textRequest) decodeJSON(body []byte, v any, field string) error {
	return t.decode(body, v, field, false)
}

// decodeStrict is decodeJSON refusing keys v does not have, by name.
func (t *textRequest) decodeStrict(body []byte, v any) error {
	return t.decode(body, v, "", true)
}

// decodeIDs is decodeJSON for a body of token ids (/decode's): each
// value is charged as an int64 or a list's header in a slice that doubles
// as it grows, and their number is bounded by the body's limit alone (a
// sequence is hundreds of ids).
// field names the ids in the message of an ids field that does not
// decode.
func (t *textRequest) decodeIDs(body []byte, v any, field string) error {
	const perValue = 32
	return t.decodeCharged(body, v, field, false, perValue, math.MaxInt)
}

func (t *textRequest) decode(body []byte, v any, field string, strict bool) error {
	// What decoding builds is bounded before it is built: every JSON value
	// (a string, a null, an empty object) may become a header of up to 48
	// bytes in a slice that doubles as it grows, whatever its own length.
	// No request of these APIs needs more values than its texts (2048, or
	// 2048 pairs) and a few keys, so more is refused unread.
	const perValue = 48
	return t.decodeCharged(body, v, field, strict, perValue, maxTextValues)
}

// decodeCharged decodes body into v once len(body) and perValue bytes for
// each of its JSON values are charged, refusing more than maxValues.
func (t *textRequest) decodeCharged(body []byte, v any, field string, strict bool, perValue int64, maxValues int) error {
	values, most, mostN := jsonValues(body)
	if values > maxValues {
		where, field := "", string(most)
		if field != "" {
			where = fmt.Sprintf(" (%s holds %d)", core.ClipName(field), mostN)
		}
		return withParam(field, &core.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf(
			"the request holds more than %d JSON values%s; a request sends at most %d texts (or pairs): split it", maxValues, where, maxClientBatch)})
	}
	if err := t.ch.Take(t.r.Context(), int64(len(body))+perValue*int64(values+1), "decoding the request"); err != nil {
		return err
	}
	if !utf8.Valid(body) {
		return core.BadRequest("the request body is not valid UTF-8")
	}
	var err error
	if strict {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err = dec.Decode(v); err == nil && dec.More() {
			err = errors.New("the body holds more than one JSON value")
		}
		if err != nil && strings.HasPrefix(err.Error(), "json: unknown field ") {
			name, _ := strconv.Unquote(strings.TrimPrefix(err.Error(), "json: unknown field "))
			return withParam(name, core.BadRequest(fmt.Sprintf("unknown parameter %q; see the API's reference for the parameters stepserve takes", core.ClipName(name))))
		}
	} else {
		err = json.Unmarshal(body, v)
	}
	var typ *json.UnmarshalTypeError
	if strict && errors.As(err, &typ) && typ.Field != "" {
		// The embedded struct's name is not the client's: the last
		// segment of the path is the parameter.
		name := typ.Field
		if i := strings.LastIndexByte(name, '.'); i >= 0 && strings.HasPrefix(name, "openaiSampling.") {
			name = name[i+1:]
		}
		typ.Field = name
		param := name
		if i := strings.IndexByte(param, '.'); i >= 0 {
			param = param[:i]
		}
		return withParam(param, core.BadRequest(core.JSONErrorMessage(body, typ)))
	}
	if err != nil {
		var te *textsError
		if errors.As(err, &te) {
			return core.BadRequest(field + ": " + te.msg)
		}
		return core.BadRequest(core.JSONErrorMessage(body, err))
	}
	return nil
}

// maxTextValues bounds the JSON values of a text API request: 2048 pairs
// (three values each) and room for the other keys.
const maxTextValues = 3*maxClientBatch + 1024

// jsonValues counts the values in a JSON document, as the elements and
// members its arrays and objects hold (a comma or an opening bracket each,
// outside strings), in one pass: a bound, not a parse. It also returns
// the top-level key whose value holds the most of them (a span of b), and
// how many, so that a refusal can name the field at fault.
func jsonValues(b []byte) (n int, most []byte, mostN int) {
	inString := false
	depth, cur := 0, 0
	// The current top-level key and the one holding the most values, as
	// spans of b: a string is built only for the one a refusal names.
	key, mostKey := [2]int{}, [2]int{}
	keyStart, expectKey := -1, false
	endKey := func() {
		if cur > mostN {
			mostKey, mostN = key, cur
		}
		cur = 0
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case inString:
			if c == '\\' {
				i++
			} else if c == '"' {
				inString = false
				if keyStart >= 0 {
					key, keyStart = [2]int{keyStart, i}, -1
				}
			}
		case c == '"':
			inString = true
			if depth == 1 && expectKey {
				keyStart, expectKey = i+1, false
			}
		case c == '[' || c == '{':
			n++
			if depth >= 1 {
				cur++
			}
			depth++
			expectKey = depth == 1 && c == '{'
		case c == ',':
			n++
			if depth >= 2 {
				cur++
			}
			if depth == 1 {
				endKey()
				expectKey = true
			}
		case c == ']' || c == '}':
			depth--
			if depth == 0 {
				endKey()
			}
		}
	}
	return n, b[mostKey[0]:mostKey[1]], mostN
}

// find chooses the model a request names (name, or the query's model=),
// or, without a name, the one chosen already (POST / chose it to
// dispatch), else the only model of the kinds the endpoint wants.
// endpoint names the endpoint in messages.
func (t *textRequest) find(name, endpoint string, kinds ...textKind) (textSig, error) {
	if name == "" {
		name = t.r.URL.Query().Get("model")
	}
	switch {
	case name == "" && t.m != nil:
		// Chosen already: kept, not chosen again (a model loaded since
		// could make the choice ambiguous).
	case name == "":
		var names []string
		var only *serving.Model
		for _, m := range t.s.c.Opts.Models.Models() {
			if textSigOf(m.Model()).kind.serves(kinds) {
				names = append(names, m.Model().Name)
				only = m
			}
		}
		switch len(names) {
		case 1:
			t.m = only
		case 0:
			return textSig{}, &core.Error{Status: http.StatusUnprocessableEntity, Msg: fmt.Sprintf("no model served here answers %s", endpoint)}
		default:
			slices.Sort(names)
			return textSig{}, &core.Error{Status: http.StatusUnprocessableEntity, Msg: fmt.Sprintf(
				"%d models answer %s; name one with \"model\" in the body or ?model=: %s", len(names), endpoint, strings.Join(names, ", "))}
		}
	default:
		m, err := t.s.c.Lookup(name, "")
		if err != nil {
			return textSig{}, err
		}
		t.m = m
	}
	tm := textSigOf(t.m.Model())
	if !tm.kind.serves(kinds) {
		return tm, &core.Error{Status: http.StatusUnprocessableEntity, Msg: fmt.Sprintf("model %s serves %s, not %s", t.m.Model().Name, tm.kind, endpoint)}
	}
	if !t.m.Ready() {
		return tm, core.NotReady(t.m.Model().Name)
	}
	return tm, nil
}

// clientBatch is the most texts (or id lists) one request may send:
// maxClientBatch, within the server's element limit.
func (s *API) clientBatch() int {
	return min(maxClientBatch, int(min(s.c.Opts.MaxRequestElements, math.MaxInt32)))
}

// checkTexts bounds a request's texts: at least one, at most
// clientBatch.
func (t *textRequest) checkTexts(n int, what string) error {
	switch limit := t.s.clientBatch(); {
	case n == 0:
		return emptyRequest(what + " is empty; send at least one text")
	case n > limit:
		return &core.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("%s holds %d texts, more than the %d a request may send; split it", what, n, limit)}
	}
	return nil
}

// infer runs texts (and, for a pair model, pairs) through the model, as
// an OIP request with those inputs runs: the same footprint taken from
// the in-flight budget, plus extraJSON for the API's response beyond
// OIP's, the same batcher, and the same retry on a reload. It returns the
// step request, whose Outputs hold the model's outputs and whose Inputs
// the token tensors, and the footprint's JSON bound (what the response's
// buffer may take, charged already).
func (t *textRequest) infer(tm textSig, texts, pairs []string, extraJSON int64) (*serving.Result, int64, error) {
	m := t.m.Model()
	cfg := m.Config
	req := &core.InferRequest{Rows: len(texts)}
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
	req.Inputs[tm.text] = models.Input{Shape: shape, Strings: texts}
	if pairs != nil {
		if tm.pair < 0 {
			return nil, 0, &core.Error{Status: http.StatusUnprocessableEntity, Msg: fmt.Sprintf("model %s scores single texts; it takes no %q input for pairs", m.Name, models.TextPairInput)}
		}
		req.Inputs[tm.pair] = models.Input{Shape: shape, Strings: pairs}
		for _, s := range pairs {
			decoded += stringHeader + int64(len(s))
		}
	}
	req.Outputs = append(req.OutputsBuf[:0], core.OutputChoice{Index: tm.output})
	f := core.FootprintOf(m, req, decoded, 0)
	f.JSON += extraJSON
	var res *serving.Result
	var err error
	if t.info.Trace == nil {
		// Traced as OIP requests are: one atomic load while tracing is off.
		t.info.Trace = t.s.c.Opts.Tracer.Sample(t.m.Model().Name)
	}
	req.Trace = t.info.Trace
	t.m, res, err = t.s.c.Run(t.r.Context(), &t.ch, t.m, req, f)
	t.info.Rows = req.Rows
	return res, f.JSON, err
}

// rowFloats is row i of an FP32 output of width values a row.
func rowFloats(out []byte, i, width int) []float32 {
	row := make([]float32, width)
	b := out[i*width*4:]
	for k := range row {
		row[k] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*k:]))
	}
	return row
}

// normalize scales v to unit L2 norm (a zero vector stays zero).
func normalize(v []float32) {
	var ss float64
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	if ss == 0 {
		return
	}
	inv := 1 / math.Sqrt(ss)
	for i, x := range v {
		v[i] = float32(float64(x) * inv)
	}
}

// appendFloats appends v as a JSON array of float32 values, each the
// shortest that reads back the same.
func appendFloats(b []byte, v []float32) ([]byte, error) {
	b = append(b, '[')
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = appendFloat(b, x); err != nil {
			return b, err
		}
	}
	return append(b, ']'), nil
}

func appendFloat(b []byte, x float32) ([]byte, error) {
	if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
		return b, fmt.Errorf("the model produced %v, which JSON cannot carry", x)
	}
	return strconv.AppendFloat(b, float64(x), 'g', -1, 32), nil
}

// sigmoid is the logistic function, as a single logit's score.
func sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

// softmax turns logits into probabilities, in place.
func softmax(v []float32) {
	mx := float32(math.Inf(-1))
	for _, x := range v {
		mx = max(mx, x)
	}
	var sum float64
	for i, x := range v {
		e := math.Exp(float64(x - mx))
		v[i] = float32(e)
		sum += e
	}
	for i := range v {
		v[i] = float32(float64(v[i]) / sum)
	}
}

// stringOrList is a JSON string or an array of strings, the two forms both
// APIs take their texts in. An array of numbers (token ids) is refused
// with its own error.
type stringOrList struct {
	list []string
	set  bool
}

// textsError is a texts field that is neither a string nor an array of
// strings; decodeJSON names the field.
type textsError struct{ msg string }

func (e *textsError) Error() string { return e.msg }

var errTokenIDs = &textsError{"token id arrays are not supported; send the text"}

func (s *stringOrList) UnmarshalJSON(b []byte) error {
	s.set = true
	b = bytes.TrimLeft(b, " \t\r\n")
	switch {
	case len(b) > 0 && b[0] == '"':
		var one string
		if err := json.Unmarshal(b, &one); err != nil {
			return &textsError{"want a string or an array of strings"}
		}
		s.list = []string{one}
		return nil
	case len(b) > 0 && b[0] == '[':
		if rest := bytes.TrimLeft(b[1:], " \t\r\n"); len(rest) > 0 && (rest[0] == '-' || rest[0] == '[' || '0' <= rest[0] && rest[0] <= '9') {
			return errTokenIDs
		}
		var list []string
		if err := json.Unmarshal(b, &list); err != nil {
			return &textsError{"want a string or an array of strings"}
		}
		if list == nil {
			list = []string{}
		}
		s.list = list
		return nil
	case bytes.Equal(b, []byte("null")):
		s.set = false
		return nil
	}
	return &textsError{"want a string or an array of strings"}
}

// overloaded reports whether err says the server is busy (a full queue,
// the in-flight budget spent), as opposed to a model that is not ready or
// is going away: the APIs answer those with statuses of their own.
func overloaded(err error) bool {
	var ae *core.Error
	return errors.Is(err, serving.ErrQueueFull) ||
		errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable && strings.HasPrefix(ae.Msg, busyPrefix)
}

// busyPrefix begins the budget's 503 (budget.go).
const busyPrefix = "the server is busy"

// textRoutes adds the text APIs' routes, behind the inference tokens,
// each refusing in its own API's error shape.
func (s *API) Routes(r chi.Router) {
	deny := func(api *textProtocol) func(http.ResponseWriter, int, string) {
		return func(w http.ResponseWriter, status int, msg string) { api.writeError(w, status, errors.New(msg)) }
	}
	r.Group(func(r chi.Router) {
		r.Use(core.BearerAs(s.c.InferenceTokens, deny(&openaiAPI)))
		r.Post("/v1/embeddings", s.openaiEmbeddings)
		r.Post("/v1/completions", s.openaiCompletions)
		r.Post("/v1/chat/completions", s.openaiChat)
		r.Get("/v1/models", s.openaiModels)
		r.Get("/v1/models/{model}", s.openaiModelInfo)
	})
	r.Group(func(r chi.Router) {
		r.Use(core.BearerAs(s.c.InferenceTokens, deny(&tritonGenerateAPI)))
		for _, p := range []string{"/v2/models/{model}", "/v2/models/{model}/versions/{version}"} {
			r.Post(p+"/generate", s.tritonGenerate(false))
			r.Post(p+"/generate_stream", s.tritonGenerate(true))
		}
	})
	r.Group(func(r chi.Router) {
		r.Use(core.BearerAs(s.c.InferenceTokens, deny(&teiAPI)))
		r.Post("/embed", s.tei(s.teiEmbed))
		r.Post("/embed_all", s.tei(s.teiEmbedAll))
		r.Post("/similarity", s.tei(s.teiSimilarity))
		r.Post("/rerank", s.tei(s.teiRerank))
		r.Post("/predict", s.tei(s.teiPredict))
		r.Post("/tokenize", s.tei(s.teiTokenize))
		r.Post("/decode", s.tei(s.teiDecode))
		r.Get("/info", s.teiInfo)
		// Hugging Face's Inference Endpoints post to /, SageMaker to
		// /invocations.
		r.Post("/", s.tei(s.teiDispatch))
		r.Post("/invocations", s.tei(s.teiDispatch))
	})
	// TEI's health checks are open, as /v2/health is: probes carry no
	// token. /ping is SageMaker's; GET / the Inference API's.
	r.Get("/health", s.teiHealth)
	r.Get("/ping", s.teiHealth)
	r.Get("/", s.teiHealth)
}

// appendJSONText appends s, valid UTF-8, as a JSON string, as
// appendJSONString does.
func appendJSONText(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\t':
			b = append(b, '\\', 't')
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		case c < utf8.RuneSelf:
			b = append(b, c)
		default:
			// Invalid UTF-8 (a byte-level token's part of a character)
			// is written as U+FFFD, as encoding/json writes it: the
			// answer stays valid JSON.
			r, n := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && n == 1 {
				b = append(b, `\ufffd`...)
				continue
			}
			b = append(b, s[i:i+n]...)
			i += n - 1
		}
	}
	return append(b, '"')
}
