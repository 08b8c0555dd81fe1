package tokenizers

import (
	"encoding/json"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// postProcessor frames the tokens of a text (and of its pair) with special
// tokens and sets their token types.
type postProcessor interface {
	// added is how many special tokens it adds to a text, or to a pair.
	added(pair bool) int
	// process returns the final tokens; b is nil for a single text.
	// texts are the original texts, by Token.Seq.
	process(a, b []Token, texts [2]string) []Token
}

type postProcessorConfig struct {
	Type string `json:"type"`
	// BertProcessing, RobertaProcessing: [token, id]
	Sep         [2]json.RawMessage `json:"sep"`
	Cls         [2]json.RawMessage `json:"cls"`
	TrimOffsets *bool              `json:"trim_offsets"`
	// TemplateProcessing
	Single        []templateItem          `json:"single"`
	Pair          []templateItem          `json:"pair"`
	SpecialTokens map[string]specialToken `json:"special_tokens"`
	// Sequence
	Processors []json.RawMessage `json:"processors"`
}

type templateItem struct {
	SpecialToken *struct {
		ID     string `json:"id"`
		TypeID int64  `json:"type_id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID     string `json:"id"`
		TypeID int64  `json:"type_id"`
	} `json:"Sequence"`
}

type specialToken struct {
	ID     string   `json:"id"`
	IDs    []int64  `json:"ids"`
	Tokens []string `json:"tokens"`
}

func parsePostProcessor(raw json.RawMessage, depth int) (postProcessor, error) {
	if isNull(raw) {
		return nil, nil
	}
	if depth > maxNesting {
		return nil, fmt.Errorf("Sequence nested more than %d deep", maxNesting)
	}
	var c postProcessorConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	trim := c.TrimOffsets == nil || *c.TrimOffsets
	switch c.Type {
	case "BertProcessing", "RobertaProcessing":
		cls, err := parsePair(c.Cls)
		if err != nil {
			return nil, fmt.Errorf("%s: cls: %w", c.Type, err)
		}
		sep, err := parsePair(c.Sep)
		if err != nil {
			return nil, fmt.Errorf("%s: sep: %w", c.Type, err)
		}
		if c.Type == "BertProcessing" {
			return template{
				single: []tmplItem{{special: []int64{cls}}, {seq: 0}, {special: []int64{sep}}},
				pair:   []tmplItem{{special: []int64{cls}}, {seq: 0}, {special: []int64{sep}}, {seq: 1, typeID: 1}, {special: []int64{sep}, typeID: 1}},
			}, nil
		}
		// RoBERTa's pair is <s> A </s></s> B </s>, every type 0 (its
		// models have one token type).
		return template{
			single: []tmplItem{{special: []int64{cls}}, {seq: 0}, {special: []int64{sep}}},
			pair:   []tmplItem{{special: []int64{cls}}, {seq: 0}, {special: []int64{sep}}, {special: []int64{sep}}, {seq: 1}, {special: []int64{sep}}},
			trim:   trim,
		}, nil
	case "TemplateProcessing":
		t := template{}
		for k, items := range [][]templateItem{c.Single, c.Pair} {
			var out []tmplItem
			for i, it := range items {
				switch {
				case it.SpecialToken != nil:
					st, ok := c.SpecialTokens[it.SpecialToken.ID]
					if !ok || len(st.IDs) == 0 {
						return nil, fmt.Errorf("TemplateProcessing: the special token %q is not in special_tokens", it.SpecialToken.ID)
					}
					out = append(out, tmplItem{special: st.IDs, typeID: it.SpecialToken.TypeID})
				case it.Sequence != nil && (it.Sequence.ID == "A" || it.Sequence.ID == "B"):
					out = append(out, tmplItem{seq: int(it.Sequence.ID[0] - 'A'), typeID: it.Sequence.TypeID})
				default:
					return nil, fmt.Errorf("TemplateProcessing: item %d; want a SpecialToken or a Sequence A or B", i)
				}
			}
			if k == 0 {
				t.single = out
			} else {
				t.pair = out
			}
		}
		return t, nil
	case "ByteLevel":
		return template{keep: true, trim: trim}, nil
	case "Sequence":
		var seq sequencePost
		for i, r := range c.Processors {
			p, err := parsePostProcessor(r, depth+1)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			if p != nil {
				seq = append(seq, p)
			}
		}
		return seq, nil
	}
	return nil, fmt.Errorf("type %q is not supported; want TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel or Sequence", c.Type)
}

// parsePair reads a ["token", id] pair's id.
func parsePair(p [2]json.RawMessage) (int64, error) {
	var id int64
	if err := json.Unmarshal(p[1], &id); err != nil {
		return 0, fmt.Errorf("%w; want [token, id]", err)
	}
	return id, nil
}

// tmplItem is a template's special tokens, or a sequence (0 A, 1 B).
type tmplItem struct {
	special []int64
	seq     int
	typeID  int64
}

// template is TemplateProcessing, and Bert and RoBERTa processing written
// as templates. keep passes the tokens as they are (ByteLevel); trim
// trims whitespace off the tokens' offsets.
type template struct {
	single, pair []tmplItem
	keep, trim   bool
}

func (t template) added(pair bool) int {
	items := t.single
	if pair {
		items = t.pair
	}
	n := 0
	for _, it := range items {
		n += len(it.special)
	}
	return n
}

func (t template) process(a, b []Token, texts [2]string) []Token {
	if t.trim {
		trimOffsets(a, texts)
		trimOffsets(b, texts)
	}
	if t.keep {
		return append(a, b...)
	}
	items := t.single
	if b != nil {
		items = t.pair
	}
	out := make([]Token, 0, len(a)+len(b)+t.added(b != nil))
	for _, it := range items {
		if it.special != nil {
			for _, id := range it.special {
				out = append(out, Token{ID: id, TypeID: it.typeID, Special: true, Seq: -1})
			}
			continue
		}
		seq := a
		if it.seq == 1 {
			seq = b
		}
		for _, tok := range seq {
			tok.TypeID = it.typeID
			out = append(out, tok)
		}
	}
	// An inserted token sits where the token before it ends.
	at := 0
	for i := range out {
		if out[i].Seq < 0 {
			out[i].Start, out[i].Stop = at, at
		} else {
			at = out[i].Stop
		}
	}
	return out
}

// trimOffsets moves each token's offsets in past the whitespace at its
// ends (ByteLevel's "Ġ"), unless the token is nothing but whitespace.
func trimOffsets(toks []Token, texts [2]string) {
	for i := range toks {
		t := &toks[i]
		if t.Seq < 0 || t.Special {
			continue
		}
		s := texts[t.Seq]
		start, stop := t.Start, t.Stop
		for start < stop {
			r, n := utf8.DecodeRuneInString(s[start:stop])
			if !unicode.IsSpace(r) {
				break
			}
			start += n
		}
		for stop > start {
			r, n := utf8.DecodeLastRuneInString(s[start:stop])
			if !unicode.IsSpace(r) {
				break
			}
			stop -= n
		}
		if start < stop {
			t.Start, t.Stop = start, stop
		}
	}
}

type sequencePost []postProcessor

func (s sequencePost) added(pair bool) int {
	n := 0
	for _, p := range s {
		n += p.added(pair)
	}
	return n
}

// process runs the processors in order; the first that frames the
// tokens makes one sequence of them for the next.
func (s sequencePost) process(a, b []Token, texts [2]string) []Token {
	framed := false
	for _, p := range s {
		if t, ok := p.(template); ok && t.keep {
			if t.trim {
				trimOffsets(a, texts)
				trimOffsets(b, texts)
			}
			continue
		}
		if framed {
			b = nil
		}
		a, framed = p.process(a, b, texts), true
	}
	if !framed {
		a = append(a, b...)
	}
	return a
}
