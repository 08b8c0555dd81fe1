package tokenizers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"unicode"
	"unicode/utf8"
)

// maxNesting bounds Sequence inside Sequence in a file.
const maxNesting = 8

// Token is a token of an encoding.
type Token struct {
	ID int64
	// Start and Stop are byte offsets into the text the token was read
	// from (Seq says which); equal for a special token the post-processor
	// inserted.
	Start, Stop int
	// TypeID is the token type (segment) id.
	TypeID int64
	// Special marks special tokens: inserted by the post-processor, or an
	// added token with "special": true found in the text.
	Special bool
	// Seq is 0 for a token of the text, 1 of its pair, -1 for an inserted
	// special token.
	Seq int
}

// Tokenizer is a tokenizer.json tokenizer. It is safe for concurrent use.
type Tokenizer struct {
	normalizer   normalizer
	preTokenizer preTokenizer
	model        model
	vocab        *vocab
	post         postProcessor
	decoder      decoder // nil: tokens joined by spaces

	added         []addedToken
	rawAdded      *addedMatcher // added tokens matched in the raw text
	normAdded     *addedMatcher // and in the normalized text
	strategy      string        // LongestFirst, OnlyFirst, OnlySecond
	truncateLeft  bool
	padID         int64
	padFromFile   bool
	specialTokens map[int64]bool
}

// maxAddedTokenBytes bounds one added token: each of its bytes is a node
// of the matcher's trie.
const maxAddedTokenBytes = 1024

// addedToken is an entry of added_tokens.
type addedToken struct {
	ID         int64  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized *bool  `json:"normalized"`
	Special    bool   `json:"special"`
}

type fileConfig struct {
	AddedTokens   []addedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Model         json.RawMessage `json:"model"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Truncation    *struct {
		Strategy  string `json:"strategy"`
		Direction string `json:"direction"`
	} `json:"truncation"`
	Padding *struct {
		PadID    *int64 `json:"pad_id"`
		PadToken string `json:"pad_token"`
	} `json:"padding"`
}

// Parse reads a tokenizer.json. Errors name the part of the file at
// fault and say what is supported.
func Parse(data []byte) (*Tokenizer, error) {
	var c fileConfig
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if isNull(c.Model) {
		return nil, errors.New("tokenizer.json: model is missing")
	}
	t := &Tokenizer{strategy: "LongestFirst", specialTokens: map[int64]bool{}}
	var err error
	if t.model, t.vocab, err = parseModel(c.Model); err != nil {
		return nil, fmt.Errorf("tokenizer.json: model: %w", err)
	}
	if t.normalizer, err = parseNormalizer(c.Normalizer, 0); err != nil {
		return nil, fmt.Errorf("tokenizer.json: normalizer: %w", err)
	}
	if err := growthError(t.normalizer); t.normalizer != nil && err != nil {
		return nil, fmt.Errorf("tokenizer.json: normalizer: %w", err)
	}
	if t.preTokenizer, err = parsePreTokenizer(c.PreTokenizer, 0); err != nil {
		return nil, fmt.Errorf("tokenizer.json: pre_tokenizer: %w", err)
	}
	if t.post, err = parsePostProcessor(c.PostProcessor, 0); err != nil {
		return nil, fmt.Errorf("tokenizer.json: post_processor: %w", err)
	}
	if t.decoder, err = parseDecoder(c.Decoder, 0); err != nil {
		return nil, fmt.Errorf("tokenizer.json: decoder: %w", err)
	}
	if tr := c.Truncation; tr != nil {
		switch tr.Strategy {
		case "LongestFirst", "OnlyFirst", "OnlySecond":
			t.strategy = tr.Strategy
		case "":
		default:
			return nil, fmt.Errorf("tokenizer.json: truncation: strategy %q; want LongestFirst, OnlyFirst or OnlySecond", tr.Strategy)
		}
		t.truncateLeft = tr.Direction == "Left"
	}
	if err := t.addTokens(c.AddedTokens); err != nil {
		return nil, err
	}
	t.padID = t.findPad()
	if p := c.Padding; p != nil {
		if p.PadID != nil {
			t.padID, t.padFromFile = *p.PadID, true
		} else if id, ok := t.vocab.ids[p.PadToken]; ok {
			t.padID, t.padFromFile = id, true
		}
	}
	return t, nil
}

// findPad is the id of the usual padding tokens, or 0.
func (t *Tokenizer) findPad() int64 {
	for _, name := range []string{"[PAD]", "<pad>", "<|padding|>", "<|endoftext|>"} {
		if id, ok := t.vocab.ids[name]; ok {
			return id
		}
	}
	return 0
}

func (t *Tokenizer) addTokens(list []addedToken) error {
	var raw, normed []addedToken
	for i, a := range list {
		if a.ID < 0 || a.ID >= maxVocab {
			return fmt.Errorf("tokenizer.json: added_tokens[%d]: id %d; want 0..%d", i, a.ID, maxVocab-1)
		}
		if a.Content == "" {
			return fmt.Errorf("tokenizer.json: added_tokens[%d]: empty content", i)
		}
		if len(a.Content) > maxAddedTokenBytes {
			return fmt.Errorf("tokenizer.json: added_tokens[%d]: content of %d bytes; want at most %d (added tokens are markers like <s> or [MASK])", i, len(a.Content), maxAddedTokenBytes)
		}
		t.vocab.add(a.Content, a.ID)
		t.vocab.ids[a.Content] = a.ID
		if a.Special {
			t.specialTokens[a.ID] = true
		}
		normalized := !a.Special
		if a.Normalized != nil {
			normalized = *a.Normalized
		}
		if normalized && t.normalizer != nil {
			n := t.normalizer.normalize(newText(a.Content, 0))
			if len(n.s) == 0 {
				continue
			}
			a.Content = string(n.s)
			normed = append(normed, a)
		} else {
			raw = append(raw, a)
		}
		t.added = append(t.added, a)
	}
	t.rawAdded, t.normAdded = newAddedMatcher(raw), newAddedMatcher(normed)
	return nil
}

// PadID is the id rows are padded with: the file's padding.pad_id, else
// its [PAD] or <pad> token, else 0.
func (t *Tokenizer) PadID() int64 { return t.padID }

// VocabSize is one more than the largest token id.
func (t *Tokenizer) VocabSize() int { return len(t.vocab.tokens) }

// TokenText is the token with id as the vocabulary spells it ("##ing",
// "▁the", "Ġworld"), or "" for an id it lacks.
func (t *Tokenizer) TokenText(id int64) string {
	if id < 0 || id >= int64(len(t.vocab.tokens)) {
		return ""
	}
	return t.vocab.tokens[id]
}

// ID is the id of a token, as the vocabulary spells it.
func (t *Tokenizer) ID(token string) (int64, bool) {
	id, ok := t.vocab.ids[token]
	return id, ok
}

// Added is how many special tokens the post-processor adds to a text
// (pair false) or to a pair.
func (t *Tokenizer) Added(pair bool) int {
	if t.post == nil {
		return 0
	}
	return t.post.added(pair)
}

// TooLongError is Encode's refusal of text that does not fit maxLen
// without truncation.
type TooLongError struct{ Tokens, Limit int }

func (e *TooLongError) Error() string {
	return fmt.Sprintf("%d tokens with the special tokens, the limit is %d", e.Tokens, e.Limit)
}

// Options are Encode's.
type Options struct {
	// MaxLen is the most tokens, special tokens included; 0 for no limit.
	MaxLen int
	// Truncate cuts tokens past MaxLen as the file's truncation says
	// (strategy longest_first by default, direction right by default);
	// without it, text past MaxLen is a *TooLongError.
	Truncate bool
	// Plain leaves out the post-processor's special tokens.
	Plain bool
}

// truncatedBytesPerToken bounds the text read when truncating: only the
// first max(minTruncatedBytes, truncatedBytesPerToken*MaxLen) bytes of a
// text are tokenized (the last ones when truncating from the left), cut
// at whitespace where there is some, so that a huge text costs no more
// than its first tokens. Natural text takes under 10 bytes a token.
const (
	truncatedBytesPerToken = 64
	minTruncatedBytes      = 16 << 10
)

// Encode tokenizes text, or with hasPair the pair (text, pair), and frames
// it with the post-processor's special tokens.
func (t *Tokenizer) Encode(text, pair string, hasPair bool, opt Options) ([]Token, error) {
	texts := [2]string{text, pair}
	var seqs [2][]Token
	n := 1
	if hasPair {
		n = 2
	}
	for i := range n {
		s := texts[i]
		base := 0
		if opt.Truncate && opt.MaxLen > 0 {
			s, base = bounded(s, max(minTruncatedBytes, truncatedBytesPerToken*opt.MaxLen), t.truncateLeft)
		}
		seqs[i] = t.encodeText(s, base, i)
	}
	added := t.Added(hasPair)
	if opt.Plain {
		added = 0
	}
	total := len(seqs[0]) + len(seqs[1]) + added
	if opt.MaxLen > 0 && total > opt.MaxLen {
		if !opt.Truncate {
			return nil, &TooLongError{total, opt.MaxLen}
		}
		if err := t.truncate(&seqs, hasPair, opt.MaxLen-added); err != nil {
			return nil, err
		}
	}
	if t.post == nil || opt.Plain {
		return append(seqs[0], seqs[1]...), nil
	}
	var b []Token
	if hasPair {
		b = seqs[1]
		if b == nil {
			b = []Token{}
		}
	}
	return t.post.process(seqs[0], b, texts), nil
}

// bounded is at most limit bytes of s, from its start (or its end with
// fromEnd), cut at whitespace when there is some in the second half, and
// where the part starts in s.
func bounded(s string, limit int, fromEnd bool) (string, int) {
	if len(s) <= limit {
		return s, 0
	}
	if fromEnd {
		cut := len(s) - limit
		for cut < len(s) && !utf8.RuneStart(s[cut]) {
			cut++
		}
		for i := cut; i < cut+limit/2 && i < len(s); {
			r, n := utf8.DecodeRuneInString(s[i:])
			if unicode.IsSpace(r) {
				return s[i:], i
			}
			i += n
		}
		return s[cut:], cut
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	for i := cut; i > limit/2; {
		r, n := utf8.DecodeLastRuneInString(s[:i])
		if unicode.IsSpace(r) {
			return s[:i], 0
		}
		i -= n
	}
	return s[:cut], 0
}

// truncate cuts seqs to budget tokens in all, as the strategy says.
func (t *Tokenizer) truncate(seqs *[2][]Token, hasPair bool, budget int) error {
	if budget < 0 {
		return &TooLongError{t.Added(hasPair), t.Added(hasPair) + budget}
	}
	n1, n2 := len(seqs[0]), len(seqs[1])
	switch {
	case !hasPair:
		n1 = budget
	case t.strategy == "OnlyFirst":
		n1 = budget - n2
	case t.strategy == "OnlySecond":
		n2 = budget - n1
	default: // LongestFirst, as tokenizers' Rust
		swap := n1 > n2
		if swap {
			n1, n2 = n2, n1
		}
		if n1 > budget {
			n2 = n1
		} else {
			n2 = max(n1, budget-n1)
		}
		if n1+n2 > budget {
			n1 = budget / 2
			n2 = n1 + budget%2
		}
		if swap {
			n1, n2 = n2, n1
		}
	}
	if n1 < 0 || n2 < 0 {
		return &TooLongError{len(seqs[0]) + len(seqs[1]) + t.Added(hasPair), budget + t.Added(hasPair)}
	}
	cut := func(s []Token, n int) []Token {
		if n >= len(s) {
			return s
		}
		if t.truncateLeft {
			return s[len(s)-n:]
		}
		return s[:n]
	}
	seqs[0], seqs[1] = cut(seqs[0], n1), cut(seqs[1], n2)
	return nil
}

// encodeText is the tokens of one text: added tokens found in it, the
// rest normalized, pre-tokenized and tokenized by the model. Offsets are
// base plus offsets into s.
func (t *Tokenizer) encodeText(s string, base, seq int) []Token {
	var out []Token
	var pieces []piece
	var words []text
	for _, part := range t.rawAdded.split(s) {
		if part.token != nil {
			out = append(out, Token{ID: part.token.ID, Start: base + part.start, Stop: base + part.end, Special: part.token.Special, Seq: seq})
			continue
		}
		nt := newText(s[part.start:part.end], base+part.start)
		if t.normalizer != nil {
			nt = t.normalizer.normalize(nt)
		}
		for _, sub := range t.normAdded.splitText(nt) {
			if sub.token != nil {
				from, to := nt.origin(sub.start, sub.end)
				out = append(out, Token{ID: sub.token.ID, Start: from, Stop: to, Special: sub.token.Special, Seq: seq})
				continue
			}
			words = append(words[:0], nt.slice(sub.start, sub.end))
			if t.preTokenizer != nil {
				words = t.preTokenizer.preTokenize(words)
			}
			for _, w := range words {
				pieces = t.model.tokenize(pieces[:0], w.s)
				for _, p := range pieces {
					from, to := w.origin(p.start, p.end)
					// What the model makes of text is the text's, never special:
					// an <unk> stands for characters the input holds.
					out = append(out, Token{ID: p.id, Start: from, Stop: to, Seq: seq})
				}
			}
		}
	}
	return out
}

// addedMatcher finds added tokens, leftmost-longest, with a byte trie:
// at each position it walks at most the longest token's length.
type addedMatcher struct {
	next map[uint64]int32
	tok  []*addedToken // by node
}

func newAddedMatcher(list []addedToken) *addedMatcher {
	m := &addedMatcher{next: map[uint64]int32{}, tok: []*addedToken{nil}}
	for i := range list {
		a := &list[i]
		node := int32(0)
		for k := 0; k < len(a.Content); k++ {
			key := uint64(node)<<8 | uint64(a.Content[k])
			child, ok := m.next[key]
			if !ok {
				child = int32(len(m.tok))
				m.tok = append(m.tok, nil)
				m.next[key] = child
			}
			node = child
		}
		if m.tok[node] == nil {
			m.tok[node] = a
		}
	}
	return m
}

// part is a stretch of text: an added token, or text between them.
type part struct {
	start, end int
	token      *addedToken
}

// split cuts s at the added tokens.
func (m *addedMatcher) split(s string) []part {
	return m.find(len(s), func(i int) byte { return s[i] }, func(i int) (rune, int) { return utf8.DecodeRuneInString(s[i:]) },
		func(i int) (rune, int) { return utf8.DecodeLastRuneInString(s[:i]) })
}

func (m *addedMatcher) splitText(t text) []part {
	return m.find(len(t.s), func(i int) byte { return t.s[i] }, func(i int) (rune, int) { return utf8.DecodeRune(t.s[i:]) },
		func(i int) (rune, int) { return utf8.DecodeLastRune(t.s[:i]) })
}

func (m *addedMatcher) find(n int, at func(int) byte, runeAt, runeBefore func(int) (rune, int)) []part {
	var out []part
	last := 0 // the end of the last part
	for i := 0; i < n; {
		node, end := int32(0), -1
		var tok *addedToken
		for k := i; k < n; k++ {
			child, ok := m.next[uint64(node)<<8|uint64(at(k))]
			if !ok {
				break
			}
			node = child
			if a := m.tok[node]; a != nil && (!a.SingleWord || m.wordBounds(i, k+1, n, runeAt, runeBefore)) {
				end, tok = k+1, a
			}
		}
		if tok == nil {
			_, size := runeAt(i)
			i += size
			continue
		}
		start := i
		if tok.LStrip {
			for start > last {
				r, size := runeBefore(start)
				if !unicode.IsSpace(r) {
					break
				}
				start -= size
			}
		}
		if tok.RStrip {
			for end < n {
				r, size := runeAt(end)
				if !unicode.IsSpace(r) {
					break
				}
				end += size
			}
		}
		if last < start {
			out = append(out, part{last, start, nil})
		}
		out = append(out, part{start, end, tok})
		last, i = end, end
	}
	if last < n || len(out) == 0 && n > 0 {
		out = append(out, part{last, n, nil})
	}
	return out
}

// wordBounds reports whether [i, j) is not inside a word: no word
// character touches it.
func (m *addedMatcher) wordBounds(i, j, n int, runeAt, runeBefore func(int) (rune, int)) bool {
	if i > 0 {
		if r, _ := runeBefore(i); isWordChar(r) {
			return false
		}
	}
	if j < n {
		if r, _ := runeAt(j); isWordChar(r) {
			return false
		}
	}
	return true
}

// Special reports whether id is a special added token.
func (t *Tokenizer) Special(id int64) bool { return t.specialTokens[id] }

// SpecialIDs lists the special added tokens' ids, in order.
func (t *Tokenizer) SpecialIDs() []int64 {
	var ids []int64
	for id := range t.specialTokens {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}
