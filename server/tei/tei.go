package tei

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

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/text"
)

// teiHandler answers one TEI request whose body is read, through t.fail
// or t.ok, and returns the status it wrote.
type teiHandler func(t *text.Request, body []byte) int

// tei serves h as a TEI endpoint (serveText: limits, metrics, log).
func (s *API) tei(h teiHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { text.Serve(s.c, w, r, &teiAPI, h) }
}

// notAvailable is TEI's answer for an endpoint the model cannot serve
// (TEI's own: embed_all on a SPLADE model): 424, error_type Backend.
func notAvailable(msg string) error {
	return &apierr.Error{Status: http.StatusFailedDependency, Msg: msg}
}

// teiTruncation is the truncation fields every TEI request takes.
type teiTruncation struct {
	Truncate            *bool  `json:"truncate"`
	TruncationDirection string `json:"truncation_direction"`
}

// teiInputs is what /embed and /tokenize read alike: the texts, the
// model, and TEI's prompt_name (refused).
type teiInputs struct {
	Inputs     text.StringOrList `json:"inputs"`
	PromptName *string           `json:"prompt_name"`
	Model      string            `json:"model"`
}

// texts finds in's model for endpoint among kinds, refuses a prompt_name
// and checks the number of texts, in that order.
func (in *teiInputs) texts(t *text.Request, endpoint string, kinds ...text.Kind) (text.Sig, []string, error) {
	tm, err := t.Choose(in.Model, endpoint, kinds...)
	if err != nil {
		return text.Sig{}, nil, err
	}
	if err := refusePromptName(in.PromptName); err != nil {
		return text.Sig{}, nil, err
	}
	if err := t.CheckTexts(len(in.Inputs.List), "inputs"); err != nil {
		return text.Sig{}, nil, err
	}
	return tm, in.Inputs.List, nil
}

type teiEmbedRequest struct {
	teiInputs
	Normalize  *bool `json:"normalize"`
	Dimensions *int  `json:"dimensions"`
	teiTruncation
}

// teiEmbedAllRequest is /embed_all's body: /embed's without text.Normalize
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
		return apierr.BadRequest("prompt_name is not supported: stepserve's models carry no prompts; put the prompt in the text")
	}
	return nil
}

func (s *API) teiEmbed(t *text.Request, body []byte) int {
	var req teiEmbedRequest
	if err := t.DecodeJSON(body, &req, "inputs"); err != nil {
		return t.Fail(err)
	}
	tm, texts, err := req.texts(t, "/embed", text.KindEmbedding)
	if err != nil {
		return t.Fail(err)
	}
	m := t.Model().Model()
	normalized := m.Config.Encoder != nil && m.Config.Encoder.Normalize
	wantNorm := req.Normalize == nil || *req.Normalize
	if normalized && !wantNorm {
		return t.Fail(apierr.BadRequest(fmt.Sprintf("normalize: false cannot be honoured: model %s normalizes its embeddings (encoder.normalize: true)", m.Name)))
	}
	dims := tm.Width
	if req.Dimensions != nil {
		if d := *req.Dimensions; d < 1 || d > tm.Width {
			return t.Fail(apierr.BadRequest(fmt.Sprintf("dimensions %d is out of range; model %s gives embeddings of %d, so want 1..%[3]d", d, m.Name, tm.Width)))
		}
		dims = *req.Dimensions
	}
	if texts, err = truncate(t, tm, req.teiTruncation, texts, false); err != nil {
		return t.Fail(err)
	}
	res, bound, err := t.InferTexts(tm, texts, nil, int64(len(texts))*4+16)
	if err != nil {
		return t.Fail(err)
	}
	out := res.Outputs[tm.Output]
	b := make([]byte, 0, bound)
	b = append(b, '[')
	for i := range texts {
		v := text.RowFloats(out, i, tm.Width)[:dims]
		if wantNorm && (!normalized || dims < tm.Width) {
			text.Normalize(v)
		}
		if i > 0 {
			b = append(b, ',')
		}
		if b, err = text.AppendFloats(b, v); err != nil {
			return t.Fail(fmt.Errorf("model %s: %w", m.Name, err))
		}
	}
	return t.OK(append(b, ']'), res)
}

// teiEmbedAll answers /embed_all, TEI's token embeddings (each token's
// last hidden state, unpooled). No engine here gives them: an encoder's
// one output is its pooled row (models.Config allows no other), pooled
// inside the engine's step. So the request is checked as /embed checks
// it, then refused as TEI refuses embed_all on a model that cannot.
func (s *API) teiEmbedAll(t *text.Request, body []byte) int {
	var req teiEmbedAllRequest
	if err := t.DecodeJSON(body, &req, "inputs"); err != nil {
		return t.Fail(err)
	}
	if _, _, err := req.texts(t, "/embed_all", text.KindEmbedding); err != nil {
		return t.Fail(err)
	}
	m := t.Model().Model()
	pooled := "its engine pools the tokens' states inside the step"
	if enc := m.Config.Encoder; enc != nil {
		pooled += fmt.Sprintf(" (encoder.pooling: %s)", enc.Pooling)
	}
	return t.Fail(notAvailable(fmt.Sprintf("embed_all is not available for model %s: %s and gives no per-token output; POST /embed answers the pooled embeddings", m.Name, pooled)))
}

func (s *API) teiRerank(t *text.Request, body []byte) int {
	var req teiRerankRequest
	if err := t.DecodeJSON(body, &req, "texts"); err != nil {
		return t.Fail(err)
	}
	tm, err := t.Choose(req.Model, "/rerank", text.KindReranker)
	if err != nil {
		return t.Fail(err)
	}
	if req.Query == nil {
		return t.Fail(apierr.BadRequest("query is required: the text the texts are ranked against"))
	}
	if len(req.Texts) == 0 {
		return t.Fail(text.EmptyRequest("`texts` cannot be empty"))
	}
	if err := t.CheckTexts(len(req.Texts), "texts"); err != nil {
		return t.Fail(err)
	}
	queries := make([]string, len(req.Texts))
	for i := range queries {
		queries[i] = *req.Query
	}
	if _, err := truncate(t, tm, req.teiTruncation, nil, true); err != nil {
		return t.Fail(err)
	}
	// Each rank: its index, score and (return_text) its text, which
	// JSON may escape six bytes to one.
	extra := int64(len(req.Texts)) * 64
	if req.ReturnText {
		for _, s := range req.Texts {
			extra += 6 * int64(len(s))
		}
	}
	res, bound, err := t.InferTexts(tm, queries, req.Texts, extra)
	if err != nil {
		return t.Fail(err)
	}
	m := t.Model().Model()
	type rank struct {
		index int
		score float32
	}
	ranks := make([]rank, len(req.Texts))
	out := res.Outputs[tm.Output]
	for i := range ranks {
		score := text.RowFloats(out, i, 1)[0]
		if !req.RawScores {
			score = text.Sigmoid(score)
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
			b = text.AppendJSONText(b, req.Texts[rk.index])
		}
		b = append(b, `,"score":`...)
		if b, err = text.AppendFloat(b, rk.score); err != nil {
			return t.Fail(fmt.Errorf("model %s: %w", m.Name, err))
		}
		b = append(b, '}')
	}
	return t.OK(append(b, ']'), res)
}

func (s *API) teiPredict(t *text.Request, body []byte) int {
	var req teiPredictRequest
	if err := t.DecodeJSON(body, &req, "inputs"); err != nil {
		return t.Fail(err)
	}
	tm, err := t.Choose(req.Model, "/predict", text.KindClassifier, text.KindReranker)
	if err != nil {
		return t.Fail(err)
	}
	in := req.Inputs
	if !in.set {
		return t.Fail(apierr.BadRequest("inputs is required: a string, a pair [text, text_pair], or a list of those"))
	}
	if err := t.CheckTexts(len(in.texts), "inputs"); err != nil {
		return t.Fail(err)
	}
	if in.pairs != nil && in.singles > 0 {
		return t.Fail(apierr.BadRequest("inputs mixes single texts and pairs; send them in separate requests"))
	}
	texts := in.texts
	if texts, err = truncate(t, tm, req.teiTruncation, texts, in.pairs != nil); err != nil {
		return t.Fail(err)
	}
	m := t.Model().Model()
	labels := tm.Labels(m)
	labelBytes := int64(0)
	for _, l := range labels {
		labelBytes += 6*int64(len(l)) + 48
	}
	res, bound, err := t.InferTexts(tm, texts, in.pairs, int64(len(texts))*labelBytes)
	if err != nil {
		return t.Fail(err)
	}
	m = t.Model().Model()
	out := res.Outputs[tm.Output]
	type prediction struct {
		label int
		score float32
	}
	preds := make([]prediction, tm.Width)
	b := make([]byte, 0, bound)
	if in.batch {
		b = append(b, '[')
	}
	for i := range texts {
		v := text.RowFloats(out, i, tm.Width)
		switch {
		case req.RawScores:
		case tm.Width == 1:
			v[0] = text.Sigmoid(v[0])
		default:
			text.Softmax(v)
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
			if b, err = text.AppendFloat(b, p.score); err != nil {
				return t.Fail(fmt.Errorf("model %s: %w", m.Name, err))
			}
			b = append(b, `,"label":`...)
			b = text.AppendJSONText(b, labels[p.label])
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if in.batch {
		b = append(b, ']')
	}
	return t.OK(b, res)
}

func (s *API) teiTokenize(t *text.Request, body []byte) int {
	var req teiTokenizeRequest
	if err := t.DecodeJSON(body, &req, "inputs"); err != nil {
		return t.Fail(err)
	}
	_, texts, err := req.texts(t, "/tokenize", text.KindEmbedding, text.KindClassifier, text.KindReranker)
	if err != nil {
		return t.Fail(err)
	}
	m := t.Model().Model()
	special := req.AddSpecialTokens == nil || *req.AddSpecialTokens
	// Each text is bounded as a model input is, and its tokens (at
	// most one per byte, and the special ones) charged before they are
	// built.
	limit := textBytesLimit(m)
	tokens := int64(0)
	for i, text := range texts {
		if len(text) > limit {
			return t.Fail(&apierr.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("inputs: element %d is %d bytes, more than the %d a text may have here", i, len(text), limit)})
		}
		tokens += int64(len(text)) + 4
	}
	const tokenBytes = 64 // a textToken and its text's header
	if err := t.Take(tokens*tokenBytes, "tokenizing the request"); err != nil {
		return t.Fail(err)
	}
	all := make([][]textToken, len(texts))
	size := int64(2)
	for i, text := range texts {
		toks, err := tokenize(m, text)
		if err != nil {
			return t.Fail(&tokenizerError{err})
		}
		// Normalizing may make more tokens than bytes (NFKC turns
		// U+FDFA's 3 bytes into 18 characters): what is over the
		// charge above is taken now, before the next text.
		if extra := int64(len(toks)) - int64(len(text)) - 4; extra > 0 {
			if err := t.Take(extra*tokenBytes, "tokenizing the request"); err != nil {
				return t.Fail(err)
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
	if err := t.Take(size, "the response"); err != nil {
		return t.Fail(err)
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
			b = text.AppendJSONText(b, tok.Text)
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
	t.Info.Rows = len(texts)
	return t.OK(append(b, ']'), nil)
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
	case errors.Is(err, text.ErrEmpty):
		typ, status = "Empty", http.StatusBadRequest
	case status == http.StatusFailedDependency:
		typ = "Backend"
	case errors.Is(err, models.ErrInput):
		status = http.StatusRequestEntityTooLarge // TEI answers invalid inputs 413
	case status == http.StatusBadRequest:
		status = http.StatusUnprocessableEntity
	case status == http.StatusServiceUnavailable && text.Overloaded(err), status == http.StatusGatewayTimeout:
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
	b := append([]byte(`{"error":`), text.AppendJSONText(nil, err.Error())...)
	b = append(b, `,"error_type":"`...)
	b = append(b, typ...)
	w.Write(append(b, "\"}\n"...))
}
