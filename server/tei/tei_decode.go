package tei

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/models/tokenizers"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/text"
)

// teiDecodeRequest is POST /decode's body.
type teiDecodeRequest struct {
	IDs               tokenIDs `json:"ids"`
	SkipSpecialTokens *bool    `json:"skip_special_tokens"`
	Model             string   `json:"model"`
}

// tokenIDs is /decode's ids: a list of token ids, or a list of such
// lists. As in TEI, [] is one empty list (its text is "").
type tokenIDs struct {
	lists [][]int64
	set   bool
}

func (p *tokenIDs) UnmarshalJSON(b []byte) error {
	b = bytes.TrimLeft(b, " \t\r\n")
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	p.set = true
	bad := &text.TextsError{Msg: "want a list of token ids, or a list of such lists"}
	// encoding/json reads a null as 0, a real id; the value holds no
	// strings (they would not decode), so any null is an element.
	if len(b) == 0 || b[0] != '[' || bytes.Contains(b, []byte("null")) {
		return bad
	}
	if rest := bytes.TrimLeft(b[1:], " \t\r\n"); len(rest) > 0 && rest[0] == '[' {
		if err := json.Unmarshal(b, &p.lists); err != nil {
			return bad
		}
		return nil
	}
	var one []int64
	if err := json.Unmarshal(b, &one); err != nil {
		return bad
	}
	p.lists = [][]int64{one}
	return nil
}

// idDecoder turns a tokenizer's ids back into text.
type idDecoder interface {
	// VocabSize is one more than the largest id.
	VocabSize() int
	// Decode is the text of ids, special tokens left out with skipSpecial.
	Decode(ids []int64, skipSpecial bool) string
	// TokenText is the token with id as the vocabulary spells it.
	TokenText(id int64) string
}

// decoderOf is tok's decoder: a tokenizer.json's, with the file's own
// decoder (WordPiece, ByteLevel, Metaspace, ...), or a vocab.txt's, with
// BertTokenizer's WordPiece decoder; nil for a tokenizer with neither.
func decoderOf(tok models.TextTokenizer) idDecoder {
	if p, ok := tok.(interface{ Tokenizers() *tokenizers.Tokenizer }); ok {
		if t := p.Tokenizers(); t != nil {
			return t
		}
	}
	return nil
}

// teiDecode answers /decode: the text of each list of ids, by the model's
// tokenizer, as TEI answers it: a list of texts, one for a single list.
// Ids outside the vocabulary are refused (Hugging Face's tokenizers leave
// them out silently, which hides a client's mistake).
func (s *API) teiDecode(t *text.Request, body []byte) int {
	var req teiDecodeRequest
	if err := t.DecodeIDs(body, &req, "ids"); err != nil {
		return t.Fail(err)
	}
	if _, err := t.Choose(req.Model, "/decode", text.KindEmbedding, text.KindClassifier, text.KindReranker); err != nil {
		return t.Fail(err)
	}
	if !req.IDs.set {
		return t.Fail(apierr.BadRequest("ids is required: a list of token ids, or a list of such lists"))
	}
	lists := req.IDs.lists
	if limit := text.ClientBatch(t.Core()); len(lists) > limit {
		return t.Fail(&apierr.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("ids holds %d lists, more than the %d a request may send; split it", len(lists), limit)})
	}
	m := t.Model().Model()
	dec := decoderOf(m.Tokenizer)
	if dec == nil {
		return t.Fail(notAvailable(fmt.Sprintf("decode is not available for model %s: its tokenizer has no decoder", m.Name)))
	}
	skip := req.SkipSpecialTokens == nil || *req.SkipSpecialTokens
	// A text is at most its tokens' spellings and a space between them,
	// half again where a lone byte of a character becomes U+FFFD (three
	// bytes for a two-byte byte-level spelling): that is charged before
	// the texts are built, and their JSON (six bytes a byte at most) once
	// they are.
	vocab := int64(dec.VocabSize())
	spelled := int64(0)
	for i, ids := range lists {
		for _, id := range ids {
			if id < 0 || id >= vocab {
				return t.Fail(apierr.BadRequest(fmt.Sprintf("ids: list %d holds %d, which is not a token id of model %s; its ids are 0..%d", i, id, m.Name, vocab-1)))
			}
			spelled += int64(len(dec.TokenText(id))) + 1
		}
	}
	if err := t.Take(2*spelled, "decoding the ids"); err != nil {
		return t.Fail(err)
	}
	texts := make([]string, len(lists))
	size := int64(2)
	for i, ids := range lists {
		texts[i] = dec.Decode(ids, skip)
		size += 6*int64(len(texts[i])) + 3
	}
	if err := t.Take(size, "the response"); err != nil {
		return t.Fail(err)
	}
	b := make([]byte, 0, size)
	b = append(b, '[')
	for i, txt := range texts {
		if i > 0 {
			b = append(b, ',')
		}
		b = text.AppendJSONText(b, txt)
	}
	t.Info.Rows = len(lists)
	return t.OK(append(b, ']'), nil)
}
