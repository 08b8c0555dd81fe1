package textapi

// Hugging Face text-embeddings-inference's API (TEI):
//
//	POST /embed             embeddings
//	POST /embed_all         token embeddings: refused, no engine gives them (teiEmbedAll)
//	POST /similarity        sentences' cosine similarity to a source sentence (tei_similarity.go)
//	POST /rerank            a query against texts, by a reranker (a classifier of 1 label over pairs)
//	POST /predict           a classifier's labels and scores
//	POST /tokenize          the tokens of texts
//	POST /decode            the text of token ids (tei_decode.go)
//	GET  /info              the model's kind and limits
//	POST /, /invocations    one of the above, by the model's kind (tei_dispatch.go)
//	GET  /health, /ping, /  whether the model is ready (tei_health.go)
//
// TEI serves one model; stepserve serves many: a request names its model
// with "model" in the body or ?model=, and without one goes to the only
// model of the kind the endpoint needs. Errors are TEI's
// {"error", "error_type"} with TEI's statuses.

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/core"
)

var teiAPI = textProtocol{protocol: core.ProtocolTEI, writeError: writeTEIError}

// errEmpty marks the errors TEI calls Empty (400).
var errEmpty = errors.New("empty")

// emptyError is a 400 TEI calls Empty: a request with nothing to run.
type emptyError struct{ err *core.Error }

func emptyRequest(msg string) error { return &emptyError{core.BadRequest(msg)} }

func (e *emptyError) Error() string        { return e.err.Msg }
func (e *emptyError) Unwrap() error        { return e.err }
func (e *emptyError) Is(target error) bool { return target == errEmpty }

// teiHandler answers one TEI request whose body is read, through t.fail
// or t.ok, and returns the status it wrote.
type teiHandler func(t *textRequest, body []byte) int

// tei serves h as a TEI endpoint (serveText: limits, metrics, log).
func (s *API) tei(h teiHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { s.serveText(w, r, &teiAPI, h) }
}

// notAvailable is TEI's answer for an endpoint the model cannot serve
// (TEI's own: embed_all on a SPLADE model): 424, error_type Backend.
func notAvailable(msg string) error {
	return &core.Error{Status: http.StatusFailedDependency, Msg: msg}
}

// teiTruncation is the truncation fields every TEI request takes.
type teiTruncation struct {
	Truncate            *bool  `json:"truncate"`
	TruncationDirection string `json:"truncation_direction"`
}

// teiInputs is what /embed and /tokenize read alike: the texts, the
// model, and TEI's prompt_name (refused).
type teiInputs struct {
	Inputs     stringOrList `json:"inputs"`
	PromptName *string      `json:"prompt_name"`
	Model      string       `json:"model"`
}

// texts finds in's model for endpoint among kinds, refuses a prompt_name
// and checks the number of texts, in that order.
func (in *teiInputs) texts(t *textRequest, endpoint string, kinds ...textKind) (textSig, []string, error) {
	tm, err := t.find(in.Model, endpoint, kinds...)
	if err != nil {
		return textSig{}, nil, err
	}
	if err := refusePromptName(in.PromptName); err != nil {
		return textSig{}, nil, err
	}
	if err := t.checkTexts(len(in.Inputs.list), "inputs"); err != nil {
		return textSig{}, nil, err
	}
	return tm, in.Inputs.list, nil
}

type teiEmbedRequest struct {
	teiInputs
	Normalize  *bool `json:"normalize"`
	Dimensions *int  `json:"dimensions"`
	teiTruncation
}

// teiEmbedAllRequest is /embed_all's body: /embed's without normalize
// and dimensions.
type teiEmbedAllRequest struct {
	teiInputs
	teiTruncation
}

type teiRerankRequest struct {
	Query      *string  `json:"query"`
	Texts      []string `json:"texts"`
	RawScores  bool     `json:"raw_scores"`
	ReturnText bool     `json:"return_text"`
	Model      string   `json:"model"`
	teiTruncation
}

type teiPredictRequest struct {
	Inputs    predictInput `json:"inputs"`
	RawScores bool         `json:"raw_scores"`
	Model     string       `json:"model"`
	teiTruncation
}

type teiTokenizeRequest struct {
	teiInputs
	AddSpecialTokens *bool `json:"add_special_tokens"`
}

// refusePromptName refuses TEI's prompt_name: stepserve's models carry no
// prompts.
func refusePromptName(p *string) error {
	if p != nil {
		return core.BadRequest("prompt_name is not supported: stepserve's models carry no prompts; put the prompt in the text")
	}
	return nil
}

func (s *API) teiEmbed(t *textRequest, body []byte) int {
	var req teiEmbedRequest
	if err := t.decodeJSON(body, &req, "inputs"); err != nil {
		return t.fail(err)
	}
	tm, texts, err := req.texts(t, "/embed", kindEmbedding)
	if err != nil {
		return t.fail(err)
	}
	m := t.m.Model()
	normalized := m.Config.Encoder != nil && m.Config.Encoder.Normalize
	wantNorm := req.Normalize == nil || *req.Normalize
	if normalized && !wantNorm {
		return t.fail(core.BadRequest(fmt.Sprintf("normalize: false cannot be honoured: model %s normalizes its embeddings (encoder.normalize: true)", m.Name)))
	}
	dims := tm.width
	if req.Dimensions != nil {
		if d := *req.Dimensions; d < 1 || d > tm.width {
			return t.fail(core.BadRequest(fmt.Sprintf("dimensions %d is out of range; model %s gives embeddings of %d, so want 1..%[3]d", d, m.Name, tm.width)))
		}
		dims = *req.Dimensions
	}
	if texts, err = t.truncate(tm, req.teiTruncation, texts, false); err != nil {
		return t.fail(err)
	}
	res, bound, err := t.infer(tm, texts, nil, int64(len(texts))*4+16)
	if err != nil {
		return t.fail(err)
	}
	out := res.Outputs[tm.output]
	b := make([]byte, 0, bound)
	b = append(b, '[')
	for i := range texts {
		v := rowFloats(out, i, tm.width)[:dims]
		if wantNorm && (!normalized || dims < tm.width) {
			normalize(v)
		}
		if i > 0 {
			b = append(b, ',')
		}
		if b, err = appendFloats(b, v); err != nil {
			return t.fail(fmt.Errorf("model %s: %w", m.Name, err))
		}
	}
	return t.ok(append(b, ']'), res)
}

// teiEmbedAll answers /embed_all, TEI's token embeddings (each token's
// last hidden state, unpooled). No engine here gives them: an encoder's
// one output is its pooled row (models.Config allows no other), pooled
// inside the engine's step. So the request is checked as /embed checks
// it, then refused as TEI refuses embed_all on a model that cannot.
func (s *API) teiEmbedAll(t *textRequest, body []byte) int {
	var req teiEmbedAllRequest
	if err := t.decodeJSON(body, &req, "inputs"); err != nil {
		return t.fail(err)
	}
	if _, _, err := req.texts(t, "/embed_all", kindEmbedding); err != nil {
		return t.fail(err)
	}
	m := t.m.Model()
	pooled := "its engine pools the tokens' states inside the step"
	if enc := m.Config.Encoder; enc != nil {
		pooled += fmt.Sprintf(" (encoder.pooling: %s)", enc.Pooling)
	}
	return t.fail(notAvailable(fmt.Sprintf("embed_all is not available for model %s: %s and gives no per-token output; POST /embed answers the pooled embeddings", m.Name, pooled)))
}

func (s *API) teiRerank(t *textRequest, body []byte) int {
	var req teiRerankRequest
	if err := t.decodeJSON(body, &req, "texts"); err != nil {
		return t.fail(err)
	}
	tm, err := t.find(req.Model, "/rerank", kindReranker)
	if err != nil {
		return t.fail(err)
	}
	if req.Query == nil {
		return t.fail(core.BadRequest("query is required: the text the texts are ranked against"))
	}
	if len(req.Texts) == 0 {
		return t.fail(emptyRequest("`texts` cannot be empty"))
	}
	if err := t.checkTexts(len(req.Texts), "texts"); err != nil {
		return t.fail(err)
	}
	queries := make([]string, len(req.Texts))
	for i := range queries {
		queries[i] = *req.Query
	}
	if _, err := t.truncate(tm, req.teiTruncation, nil, true); err != nil {
		return t.fail(err)
	}
	// Each rank: its index, score and (return_text) its text, which
	// JSON may escape six bytes to one.
	extra := int64(len(req.Texts)) * 64
	if req.ReturnText {
		for _, s := range req.Texts {
			extra += 6 * int64(len(s))
		}
	}
	res, bound, err := t.infer(tm, queries, req.Texts, extra)
	if err != nil {
		return t.fail(err)
	}
	m := t.m.Model()
	type rank struct {
		index int
		score float32
	}
	ranks := make([]rank, len(req.Texts))
	out := res.Outputs[tm.output]
	for i := range ranks {
		score := rowFloats(out, i, 1)[0]
		if !req.RawScores {
			score = sigmoid(score)
		}
		ranks[i] = rank{i, score}
	}
	slices.SortStableFunc(ranks, func(a, b rank) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		}
		return 0
	})
	b := make([]byte, 0, bound)
	b = append(b, '[')
	for i, rk := range ranks {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(rk.index), 10)
		if req.ReturnText {
			b = append(b, `,"text":`...)
			b = appendJSONText(b, req.Texts[rk.index])
		}
		b = append(b, `,"score":`...)
		if b, err = appendFloat(b, rk.score); err != nil {
			return t.fail(fmt.Errorf("model %s: %w", m.Name, err))
		}
		b = append(b, '}')
	}
	return t.ok(append(b, ']'), res)
}

func (s *API) teiPredict(t *textRequest, body []byte) int {
	var req teiPredictRequest
	if err := t.decodeJSON(body, &req, "inputs"); err != nil {
		return t.fail(err)
	}
	tm, err := t.find(req.Model, "/predict", kindClassifier, kindReranker)
	if err != nil {
		return t.fail(err)
	}
	in := req.Inputs
	if !in.set {
		return t.fail(core.BadRequest("inputs is required: a string, a pair [text, text_pair], or a list of those"))
	}
	if err := t.checkTexts(len(in.texts), "inputs"); err != nil {
		return t.fail(err)
	}
	if in.pairs != nil && in.singles > 0 {
		return t.fail(core.BadRequest("inputs mixes single texts and pairs; send them in separate requests"))
	}
	texts := in.texts
	if texts, err = t.truncate(tm, req.teiTruncation, texts, in.pairs != nil); err != nil {
		return t.fail(err)
	}
	m := t.m.Model()
	labels := tm.labels(m)
	labelBytes := int64(0)
	for _, l := range labels {
		labelBytes += 6*int64(len(l)) + 48
	}
	res, bound, err := t.infer(tm, texts, in.pairs, int64(len(texts))*labelBytes)
	if err != nil {
		return t.fail(err)
	}
	m = t.m.Model()
	out := res.Outputs[tm.output]
	type prediction struct {
		label int
		score float32
	}
	preds := make([]prediction, tm.width)
	b := make([]byte, 0, bound)
	if in.batch {
		b = append(b, '[')
	}
	for i := range texts {
		v := rowFloats(out, i, tm.width)
		switch {
		case req.RawScores:
		case tm.width == 1:
			v[0] = sigmoid(v[0])
		default:
			softmax(v)
		}
		for k := range preds {
			preds[k] = prediction{k, v[k]}
		}
		slices.SortStableFunc(preds, func(a, b prediction) int {
			switch {
			case a.score > b.score:
				return -1
			case a.score < b.score:
				return 1
			}
			return 0
		})
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		for k, p := range preds {
			if k > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"score":`...)
			if b, err = appendFloat(b, p.score); err != nil {
				return t.fail(fmt.Errorf("model %s: %w", m.Name, err))
			}
			b = append(b, `,"label":`...)
			b = appendJSONText(b, labels[p.label])
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if in.batch {
		b = append(b, ']')
	}
	return t.ok(b, res)
}

func (s *API) teiTokenize(t *textRequest, body []byte) int {
	var req teiTokenizeRequest
	if err := t.decodeJSON(body, &req, "inputs"); err != nil {
		return t.fail(err)
	}
	_, texts, err := req.texts(t, "/tokenize", kindEmbedding, kindClassifier, kindReranker)
	if err != nil {
		return t.fail(err)
	}
	m := t.m.Model()
	special := req.AddSpecialTokens == nil || *req.AddSpecialTokens
	// Each text is bounded as a model input is, and its tokens (at
	// most one per byte, and the special ones) charged before they are
	// built.
	limit := textBytesLimit(m)
	tokens := int64(0)
	for i, text := range texts {
		if len(text) > limit {
			return t.fail(&core.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("inputs: element %d is %d bytes, more than the %d a text may have here", i, len(text), limit)})
		}
		tokens += int64(len(text)) + 4
	}
	const tokenBytes = 64 // a textToken and its text's header
	if err := t.ch.Take(t.r.Context(), tokens*tokenBytes, "tokenizing the request"); err != nil {
		return t.fail(err)
	}
	all := make([][]textToken, len(texts))
	size := int64(2)
	for i, text := range texts {
		toks, err := tokenize(m, text)
		if err != nil {
			return t.fail(&tokenizerError{err})
		}
		// Normalizing may make more tokens than bytes (NFKC turns
		// U+FDFA's 3 bytes into 18 characters): what is over the
		// charge above is taken now, before the next text.
		if extra := int64(len(toks)) - int64(len(text)) - 4; extra > 0 {
			if err := t.ch.Take(t.r.Context(), extra*tokenBytes, "tokenizing the request"); err != nil {
				return t.fail(err)
			}
		}
		if !special {
			toks = slices.DeleteFunc(toks, func(tok textToken) bool { return tok.Special })
		}
		all[i] = toks
		for _, tok := range toks {
			size += 96 + 6*int64(len(tok.Text))
		}
	}
	if err := t.ch.Take(t.r.Context(), size, "the response"); err != nil {
		return t.fail(err)
	}
	b := make([]byte, 0, size)
	b = append(b, '[')
	for i, toks := range all {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		for k, tok := range toks {
			if k > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"id":`...)
			b = strconv.AppendInt(b, tok.ID, 10)
			b = append(b, `,"text":`...)
			b = appendJSONText(b, tok.Text)
			b = append(b, `,"special":`...)
			b = strconv.AppendBool(b, tok.Special)
			if tok.Special {
				b = append(b, `,"start":null,"stop":null}`...)
				continue
			}
			b = append(b, `,"start":`...)
			b = strconv.AppendInt(b, int64(tok.Start), 10)
			b = append(b, `,"stop":`...)
			b = strconv.AppendInt(b, int64(tok.Stop), 10)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	t.info.Rows = len(texts)
	return t.ok(append(b, ']'), nil)
}

// tokenizerError is a text the tokenizer refused: TEI's Tokenizer error.
type tokenizerError struct{ err error }

func (e *tokenizerError) Error() string { return "tokenizing: " + e.err.Error() }
func (e *tokenizerError) Unwrap() error { return e.err }

// textBytesLimit is the longest text a model takes here: its
// encoder.max_text_bytes, or 32 bytes a token of its largest seq bucket.
func textBytesLimit(m *models.Model) int {
	if n := m.Config.TextLimit(); n > 0 {
		return n
	}
	return 32 * max(m.Config.MaxSeq(), 1)
}

// teiInfo answers GET /info: TEI's description of the model, as far as it
// applies.
func (s *API) teiInfo(w http.ResponseWriter, r *http.Request) {
	t := &textRequest{s: s, w: w, r: r, api: &teiAPI}
	tm, err := t.find("", "/info", kindEmbedding, kindClassifier, kindReranker)
	if err != nil && (t.m == nil || tm.kind == kindNone) {
		writeTEIError(w, core.StatusOf(err), err)
		return
	}
	m := t.m.Model()
	cfg := m.Config
	var modelType map[string]any
	switch tm.kind {
	case kindEmbedding:
		pooling := ""
		if cfg.Encoder != nil {
			pooling = cfg.Encoder.Pooling
		}
		modelType = map[string]any{"embedding": map[string]any{"pooling": pooling}}
	default:
		labels := tm.labels(m)
		id2label, label2id := map[string]string{}, map[string]int{}
		for i, l := range labels {
			id2label[strconv.Itoa(i)] = l
			label2id[l] = i
		}
		kind := "classifier"
		if tm.kind == kindReranker {
			kind = "reranker"
		}
		modelType = map[string]any{kind: map[string]any{"id2label": id2label, "label2id": label2id}}
	}
	policy := t.m.Policy()
	info := map[string]any{
		"model_id":                m.Name,
		"model_sha":               nil,
		"model_dtype":             "float32",
		"model_type":              modelType,
		"max_concurrent_requests": policy.MaxQueueSize,
		"max_input_length":        cfg.MaxSeq(),
		"max_batch_tokens":        policy.MaxBatchTokens,
		"max_batch_requests":      nil,
		"max_client_batch_size":   s.clientBatch(),
		"auto_truncate":           cfg.Encoder != nil && cfg.Encoder.Truncate,
		"tokenization_workers":    nil,
		"version":                 s.c.Opts.Version,
		"sha":                     nil,
		"docker_label":            nil,
	}
	core.WriteJSON(w, http.StatusOK, info)
}

// truncate applies a request's truncate and truncation_direction to its
// texts. The model cuts text past its largest seq bucket on the right
// when its encoder.truncate is set, and refuses it otherwise; truncate
// absent leaves that as it is. truncate: true on a model that does not
// truncate, or truncation_direction Left, cuts each text here to the
// tokens that fit (single texts only); truncate: false on a model that
// truncates refuses text that would be cut.
func (t *textRequest) truncate(tm textSig, tr teiTruncation, texts []string, pairs bool) ([]string, error) {
	m := t.m.Model()
	cfg := m.Config
	left := false
	switch strings.ToLower(tr.TruncationDirection) {
	case "", "right":
	case "left":
		left = true
	default:
		return nil, core.BadRequest(fmt.Sprintf("truncation_direction %q; want Right or Left", core.ClipName(tr.TruncationDirection)))
	}
	modelCuts := cfg.Encoder != nil && cfg.Encoder.Truncate
	maxSeq := cfg.MaxSeq()
	switch {
	case tr.Truncate != nil && !*tr.Truncate && modelCuts:
		if pairs {
			return texts, nil // the model's pair tokenization decides
		}
		for i, text := range texts {
			if _, err := m.Tokenizer.AppendEncode(nil, text, maxSeq, false); err != nil {
				return nil, &core.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("inputs: element %d: %v (truncate is false)", i, err)}
			}
		}
		return texts, nil
	case tr.Truncate == nil && !left, tr.Truncate != nil && !*tr.Truncate, modelCuts && !left:
		return texts, nil
	case pairs:
		return nil, core.BadRequest(fmt.Sprintf("model %s cannot truncate pairs this way: set encoder.truncate: true in its model.yaml (it cuts on the right)", m.Name))
	}
	out := make([]string, len(texts))
	for i, text := range texts {
		cut, err := cutToTokens(m, text, maxSeq, left)
		if err != nil {
			return nil, &tokenizerError{err}
		}
		out[i] = cut
	}
	return out, nil
}

// cutToTokens keeps the part of text, from its start (or its end, left)
// whose tokens fit maxSeq with the special tokens.
func cutToTokens(m *models.Model, text string, maxSeq int, left bool) (string, error) {
	// No more than 32 bytes a token can fit: the tokenizer reads no more.
	if limit := 32 * maxSeq; len(text) > limit {
		if left {
			i := len(text) - limit
			for i < len(text) && !utf8.RuneStart(text[i]) {
				i++
			}
			text = text[i:]
		} else {
			i := limit
			for i > 0 && !utf8.RuneStart(text[i]) {
				i--
			}
			text = text[:i]
		}
	}
	// A cut follows token offsets, moved to a character boundary (a
	// byte-level BPE token may end inside a character, and a stray byte
	// would come back as U+FFFD, several tokens more); the cut text is
	// tokenized again and cut shorter until it fits.
	for range 8 {
		toks, err := tokenize(m, text)
		if err != nil {
			return "", err
		}
		var words []textToken
		specials := 0
		for _, tok := range toks {
			if tok.Special {
				specials++
			} else {
				words = append(words, tok)
			}
		}
		room := max(maxSeq-specials, 0)
		if len(words) <= room {
			return text, nil
		}
		if room == 0 {
			return "", nil
		}
		if left {
			i := words[len(words)-room].Start
			for i < len(text) && !utf8.RuneStart(text[i]) {
				i++
			}
			text = text[i:]
		} else {
			i := words[room-1].Stop
			for i > 0 && i < len(text) && !utf8.RuneStart(text[i]) {
				i--
			}
			text = text[:i]
		}
	}
	return "", fmt.Errorf("the text could not be cut to %d tokens at a character boundary", maxSeq)
}

// writeTEIError writes err in TEI's shape, {"error", "error_type"}, with
// TEI's status for its type.
func writeTEIError(w http.ResponseWriter, status int, err error) {
	if status == core.StatusClientClosed {
		return
	}
	var te *tokenizerError
	typ := "Validation"
	switch {
	case errors.As(err, &te):
		typ, status = "Tokenizer", http.StatusUnprocessableEntity
	case errors.Is(err, errEmpty):
		typ, status = "Empty", http.StatusBadRequest
	case status == http.StatusFailedDependency:
		typ = "Backend"
	case errors.Is(err, models.ErrInput):
		status = http.StatusRequestEntityTooLarge // TEI answers invalid inputs 413
	case status == http.StatusBadRequest:
		status = http.StatusUnprocessableEntity
	case status == http.StatusServiceUnavailable && overloaded(err), status == http.StatusGatewayTimeout:
		typ, status = "Overloaded", http.StatusTooManyRequests
	case status == http.StatusServiceUnavailable:
		typ = "Unhealthy"
	case status >= 500:
		typ, status = "Backend", http.StatusFailedDependency
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	b := append([]byte(`{"error":`), appendJSONText(nil, err.Error())...)
	b = append(b, `,"error_type":"`...)
	b = append(b, typ...)
	w.Write(append(b, "\"}\n"...))
}
