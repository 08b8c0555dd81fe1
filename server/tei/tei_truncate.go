package tei

import (
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/text"
)

// truncate applies a request's truncate and truncation_direction to its
// texts. The model cuts text past its largest seq bucket on the right
// when its encoder.truncate is set, and refuses it otherwise; truncate
// absent leaves that as it is. truncate: true on a model that does not
// truncate, or truncation_direction Left, cuts each text here to the
// tokens that fit (single texts only); truncate: false on a model that
// truncates refuses text that would be cut.
func truncate(t *text.Request, tm text.Sig, tr teiTruncation, texts []string, pairs bool) ([]string, error) {
	m := t.Model().Model()
	cfg := m.Config
	left := false
	switch strings.ToLower(tr.TruncationDirection) {
	case "", "right":
	case "left":
		left = true
	default:
		return nil, apierr.BadRequest(fmt.Sprintf("truncation_direction %q; want Right or Left", apierr.ClipName(tr.TruncationDirection)))
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
				return nil, &apierr.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("inputs: element %d: %v (truncate is false)", i, err)}
			}
		}
		return texts, nil
	case tr.Truncate == nil && !left, tr.Truncate != nil && !*tr.Truncate, modelCuts && !left:
		return texts, nil
	case pairs:
		return nil, apierr.BadRequest(fmt.Sprintf("model %s cannot truncate pairs this way: set encoder.truncate: true in its model.yaml (it cuts on the right)", m.Name))
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
