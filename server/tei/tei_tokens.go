package tei

import "github.com/stepserve/stepserve/models"

// textToken is one token of /tokenize's answer: its id, its text, its byte
// offsets in the input (Start == Stop for an inserted special token) and
// whether it is special.
type textToken = models.Token

// tokenize splits text as the model's tokenizer does, special tokens
// included. A token of the text answers with the bytes of the input it
// covers, as TEI does; a special token with its vocabulary spelling.
func tokenize(m *models.Model, text string) ([]textToken, error) {
	toks, err := m.Tokenizer.Tokenize(text)
	if err != nil {
		return nil, err
	}
	for i, t := range toks {
		if !t.Special && 0 <= t.Start && t.Start <= t.Stop && t.Stop <= len(text) {
			toks[i].Text = text[t.Start:t.Stop]
		}
	}
	return toks, nil
}
