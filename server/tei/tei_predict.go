package tei

import (
	"bytes"
	"encoding/json"

	"github.com/stepserve/stepserve/server/text"
)

// predictInput is /predict's inputs: a string, a pair [text, text_pair],
// or a batch of those, each a string, [text] or [text, text_pair].
type predictInput struct {
	texts, pairs []string // pairs nil when no input is a pair
	singles      int      // the inputs without a pair
	batch        bool     // a list of inputs: the answer is a list of lists
	set          bool
}

func (p *predictInput) UnmarshalJSON(b []byte) error {
	b = bytes.TrimLeft(b, " \t\r\n")
	bad := &text.TextsError{Msg: "want a string, a pair [text, text_pair], or a list of those"}
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	p.set = true
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return bad
		}
		p.texts, p.singles = []string{s}, 1
		return nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(b, &list); err != nil || len(list) == 0 {
		return bad
	}
	if first := bytes.TrimLeft(list[0], " \t\r\n"); len(first) > 0 && first[0] == '"' {
		// One input: [text] or [text, text_pair].
		var seq []string
		if err := json.Unmarshal(b, &seq); err != nil || len(seq) > 2 {
			return bad
		}
		p.add(seq)
		return nil
	}
	p.batch = true
	p.texts = make([]string, 0, len(list))
	for _, raw := range list {
		var seq []string
		if err := json.Unmarshal(raw, &seq); err != nil || len(seq) < 1 || len(seq) > 2 {
			return bad
		}
		p.add(seq)
	}
	return nil
}

// add adds one input, a text and maybe its pair.
func (p *predictInput) add(seq []string) {
	p.texts = append(p.texts, seq[0])
	if len(seq) == 1 {
		p.singles++
		return
	}
	if p.pairs == nil {
		p.pairs = make([]string, len(p.texts)-1, cap(p.texts))
	}
	p.pairs = append(p.pairs, seq[1])
}
