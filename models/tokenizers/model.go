package tokenizers

import (
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// piece is a token of a word: its id and its bytes [start, end) in the
// word.
type piece struct {
	id         int64
	start, end int
}

// model tokenizes one pre-tokenized word.
type model interface {
	tokenize(out []piece, word []byte) []piece
}

type modelConfig struct {
	Type string `json:"type"`
	// WordPiece, BPE: token -> id; Unigram: [[token, score], ...]
	Vocab                   json.RawMessage `json:"vocab"`
	UnkToken                *string         `json:"unk_token"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	MaxInputCharsPerWord    *int            `json:"max_input_chars_per_word"`
	// Unigram
	UnkID        *int `json:"unk_id"`
	ByteFallback bool `json:"byte_fallback"`
	// BPE
	Merges          []json.RawMessage `json:"merges"`
	EndOfWordSuffix *string           `json:"end_of_word_suffix"`
	FuseUnk         bool              `json:"fuse_unk"`
	IgnoreMerges    bool              `json:"ignore_merges"`
}

// vocab is a model's tokens by id and ids by token.
type vocab struct {
	tokens []string
	ids    map[string]int64
	// longest is the longest token in bytes: no lookup is longer.
	longest int
}

func (v *vocab) add(tok string, id int64) {
	if _, dup := v.ids[tok]; !dup {
		v.ids[tok] = id
	}
	for int64(len(v.tokens)) <= id {
		v.tokens = append(v.tokens, "")
	}
	v.tokens[id] = tok
	v.longest = max(v.longest, len(tok))
}

// maxVocab bounds a vocabulary's ids (multilingual vocabularies are about
// 250,000), so that an id in a file cannot make a huge table.
const maxVocab = 1 << 22

func parseModel(raw json.RawMessage) (model, *vocab, error) {
	var c modelConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, nil, err
	}
	if c.Type == "" { // files before "type": infer it
		switch {
		case c.Merges != nil:
			c.Type = "BPE"
		case strings.HasPrefix(strings.TrimSpace(string(c.Vocab)), "["):
			c.Type = "Unigram"
		default:
			c.Type = "WordPiece"
		}
	}
	v := &vocab{ids: map[string]int64{}}
	switch c.Type {
	case "WordPiece", "BPE":
		var m map[string]int64
		if err := json.Unmarshal(c.Vocab, &m); err != nil {
			return nil, nil, fmt.Errorf("vocab: %w; want an object of token: id", err)
		}
		for tok, id := range m {
			if id < 0 || id >= maxVocab {
				return nil, nil, fmt.Errorf("vocab: %q has id %d; want 0..%d", tok, id, maxVocab-1)
			}
			v.add(tok, id)
		}
		// Ties between duplicate ids: the map's order must not matter.
		for tok, id := range m {
			if v.tokens[id] != tok && tok < v.tokens[id] {
				v.tokens[id] = tok
			}
		}
	case "Unigram":
		var list [][2]json.RawMessage
		if err := json.Unmarshal(c.Vocab, &list); err != nil {
			return nil, nil, fmt.Errorf("vocab: %w; want a list of [token, score]", err)
		}
		if len(list) >= maxVocab {
			return nil, nil, fmt.Errorf("vocab: %d tokens; want at most %d", len(list), maxVocab-1)
		}
		u := &unigram{v: v, scores: make([]float64, len(list)), unk: -1, byteFallback: c.ByteFallback}
		for i, pair := range list {
			var tok string
			if err := json.Unmarshal(pair[0], &tok); err != nil {
				return nil, nil, fmt.Errorf("vocab[%d]: %w; want [token, score]", i, err)
			}
			if err := json.Unmarshal(pair[1], &u.scores[i]); err != nil {
				return nil, nil, fmt.Errorf("vocab[%d]: %w; want [token, score]", i, err)
			}
			v.add(tok, int64(i))
		}
		if c.UnkID != nil {
			if *c.UnkID < 0 || *c.UnkID >= len(list) {
				return nil, nil, fmt.Errorf("unk_id %d; want 0..%d", *c.UnkID, len(list)-1)
			}
			u.unk = int64(*c.UnkID)
		}
		u.build()
		return u, v, nil
	default:
		return nil, nil, fmt.Errorf("type %q is not supported; want WordPiece, Unigram or BPE", c.Type)
	}
	unk := int64(-1)
	if c.UnkToken != nil {
		id, ok := v.ids[*c.UnkToken]
		if !ok {
			return nil, nil, fmt.Errorf("unk_token %q is not in the vocabulary", *c.UnkToken)
		}
		unk = id
	}
	if c.Type == "WordPiece" {
		w := &wordPiece{v: v, unk: unk, prefix: "##", maxChars: 100}
		if c.ContinuingSubwordPrefix != nil {
			w.prefix = *c.ContinuingSubwordPrefix
		}
		if c.MaxInputCharsPerWord != nil {
			w.maxChars = *c.MaxInputCharsPerWord
		}
		if unk < 0 {
			return nil, nil, errors.New("WordPiece needs unk_token")
		}
		return w, v, nil
	}
	b := &bpe{v: v, unk: unk, fuseUnk: c.FuseUnk, byteFallback: c.ByteFallback, ignoreMerges: c.IgnoreMerges,
		merges: make(map[[2]int64]merge, len(c.Merges))}
	if c.ContinuingSubwordPrefix != nil {
		b.prefix = *c.ContinuingSubwordPrefix
	}
	if c.EndOfWordSuffix != nil {
		b.suffix = *c.EndOfWordSuffix
	}
	for rank, raw := range c.Merges {
		var pair []string
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			pair = strings.SplitN(s, " ", 2)
		} else if err := json.Unmarshal(raw, &pair); err != nil {
			return nil, nil, fmt.Errorf("merges[%d]: %w; want \"a b\" or [\"a\", \"b\"]", rank, err)
		}
		if len(pair) != 2 {
			return nil, nil, fmt.Errorf("merges[%d]: %s; want two tokens", rank, raw)
		}
		a, okA := v.ids[pair[0]]
		bb, okB := v.ids[pair[1]]
		right := pair[1]
		if b.prefix != "" {
			right = strings.TrimPrefix(right, b.prefix)
		}
		n, okN := v.ids[pair[0]+right]
		if !okA || !okB || !okN {
			return nil, nil, fmt.Errorf("merges[%d]: %q, %q or their merge is not in the vocabulary", rank, pair[0], pair[1])
		}
		if _, dup := b.merges[[2]int64{a, bb}]; !dup {
			b.merges[[2]int64{a, bb}] = merge{rank: rank, id: n}
		}
	}
	b.initBytes()
	return b, v, nil
}

// wordPiece is greedy longest-match-first WordPiece.
type wordPiece struct {
	v        *vocab
	unk      int64
	prefix   string
	maxChars int
}

// tokenize splits word into the longest tokens that match, front to back;
// a word longer than maxChars runes, or with a part nothing matches, is
// one unk. A match is at most the vocabulary's longest token, so each
// step looks up at most that many candidates, whatever the word's length.
func (w *wordPiece) tokenize(out []piece, word []byte) []piece {
	unk := func() []piece { return append(out, piece{w.unk, 0, len(word)}) }
	if utf8.RuneCount(word) > w.maxChars {
		return unk()
	}
	start0 := len(out)
	buf := make([]byte, 0, len(w.prefix)+w.v.longest)
	for start := 0; start < len(word); {
		end := min(len(word), start+w.v.longest)
		for end > start && end < len(word) && !utf8.RuneStart(word[end]) {
			end--
		}
		found := false
		for end > start {
			buf = buf[:0]
			if start > 0 {
				buf = append(buf, w.prefix...)
			}
			buf = append(buf, word[start:end]...)
			if id, ok := w.v.ids[string(buf)]; ok {
				out = append(out, piece{id, start, end})
				found = true
				break
			}
			_, size := utf8.DecodeLastRune(word[start:end])
			end -= size
		}
		if !found {
			return append(out[:start0], piece{w.unk, 0, len(word)})
		}
		start = end
	}
	return out
}

// trie is a byte trie of a vocabulary, for Unigram's prefix searches.
type trie struct {
	next map[uint64]int32 // node<<8 | byte -> child
	id   []int64          // by node: the token ending there, or -1
}

func (t *trie) insert(s string, id int64) {
	node := int32(0)
	for i := 0; i < len(s); i++ {
		key := uint64(node)<<8 | uint64(s[i])
		child, ok := t.next[key]
		if !ok {
			child = int32(len(t.id))
			t.id = append(t.id, -1)
			t.next[key] = child
		}
		node = child
	}
	if t.id[node] < 0 {
		t.id[node] = id
	}
}

// unigram is SentencePiece's unigram model: the segmentation with the
// highest total score (Viterbi), unknown characters scored below every
// token and fused.
type unigram struct {
	v            *vocab
	scores       []float64
	unk          int64
	unkScore     float64
	byteFallback bool
	trie         trie
	bytes        [256]int64 // <0xXX> ids for byte_fallback, -1 if absent
}

func (u *unigram) build() {
	u.trie = trie{next: map[uint64]int32{}, id: []int64{-1}}
	minScore := math.Inf(1)
	for id, tok := range u.v.tokens {
		if tok != "" {
			u.trie.insert(tok, int64(id))
		}
		minScore = min(minScore, u.scores[id])
	}
	u.unkScore = minScore - 10 // SentencePiece's kUnkPenalty
	for b := range u.bytes {
		u.bytes[b] = -1
		if id, ok := u.v.ids[fmt.Sprintf("<0x%02X>", b)]; ok {
			u.bytes[b] = id
		}
	}
}

// tokenize is Viterbi over the word's bytes: from each character, every
// token the trie finds there (at most the longest token's length of
// steps) extends the best path; a character no one-character token
// covers is unk.
func (u *unigram) tokenize(out []piece, word []byte) []piece {
	type node struct {
		score float64
		from  int32 // where the best token ending here starts; -1 unreached
		id    int64
	}
	best := make([]node, len(word)+1)
	for i := range best {
		best[i].from = -1
	}
	best[0].from = 0
	for at := 0; at < len(word); {
		_, charLen := utf8.DecodeRune(word[at:])
		here := best[at].score
		single := false
		n := int32(0)
		for i := at; i < len(word); i++ {
			child, ok := u.trie.next[uint64(n)<<8|uint64(word[i])]
			if !ok {
				break
			}
			n = child
			id := u.trie.id[n]
			if id < 0 {
				continue
			}
			end := i + 1
			if cand := here + u.scores[id]; best[end].from < 0 || cand > best[end].score {
				best[end] = node{cand, int32(at), id}
			}
			if end-at == charLen {
				single = true
			}
		}
		if !single {
			end := at + charLen
			if cand := here + u.unkScore; best[end].from < 0 || cand > best[end].score {
				best[end] = node{cand, int32(at), u.unk}
			}
		}
		at += charLen
	}
	// Back from the end; then reversed in place.
	start := len(out)
	for end := len(word); end > 0; {
		nd := best[end]
		from := int(nd.from)
		if nd.id == u.unk && len(out) > start && out[len(out)-1].id == u.unk {
			out[len(out)-1].start = from // fuse with the unk after it
		} else {
			out = append(out, piece{nd.id, from, end})
		}
		end = from
	}
	for i, j := start, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	if !u.byteFallback {
		return out
	}
	return fallBack(out, start, word, u.unk, &u.bytes)
}

// fallBack replaces each unk from out[start:] with the <0xXX> tokens of
// its bytes, when the vocabulary has them all.
func fallBack(out []piece, start int, word []byte, unk int64, bytes *[256]int64) []piece {
	has := false
	for _, p := range out[start:] {
		has = has || p.id == unk
	}
	if !has {
		return out
	}
	pieces := append([]piece(nil), out[start:]...)
	out = out[:start]
	for _, p := range pieces {
		ok := p.id == unk
		for i := p.start; ok && i < p.end; i++ {
			ok = bytes[word[i]] >= 0
		}
		if !ok {
			out = append(out, p)
			continue
		}
		for i := p.start; i < p.end; i++ {
			_, n := utf8.DecodeRune(word[i:])
			for k := range n { // each byte of a character spans the character
				out = append(out, piece{bytes[word[i+k]], i, i + n})
			}
			i += n - 1
		}
	}
	return out
}

// merge is a BPE merge: its rank (lower merges first) and the merged
// token.
type merge struct {
	rank int
	id   int64
}

// bpe is byte-pair encoding: a word starts as its characters and the
// lowest-ranked merge of two neighbours applies until none does.
type bpe struct {
	v                                   *vocab
	merges                              map[[2]int64]merge
	unk                                 int64
	prefix, suffix                      string
	fuseUnk, byteFallback, ignoreMerges bool
	bytes                               [256]int64
	bytesOnce                           bool
}

// symbol is a BPE symbol of a word: a linked list over the word.
type symbol struct {
	id         int64
	start, end int
	prev, next int // -1 at the ends
	dead       bool
}

// mergeHeap orders candidate merges by rank, then leftmost.
type mergeCand struct {
	rank, pos int
	id        int64
}
type mergeHeap []mergeCand

func (h mergeHeap) Len() int { return len(h) }
func (h mergeHeap) Less(i, j int) bool {
	return h[i].rank < h[j].rank || h[i].rank == h[j].rank && h[i].pos < h[j].pos
}
func (h mergeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *mergeHeap) Push(x any)   { *h = append(*h, x.(mergeCand)) }
func (h *mergeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// tokenize merges with a priority queue of candidate merges: each merge
// removes a symbol and adds at most two candidates, so a word of n
// characters costs O(n log n), never n².
func (b *bpe) tokenize(out []piece, word []byte) []piece {
	if len(word) == 0 {
		return out
	}
	if b.ignoreMerges {
		if id, ok := b.v.ids[string(word)]; ok {
			return append(out, piece{id, 0, len(word)})
		}
	}
	syms := make([]symbol, 0, len(word))
	buf := make([]byte, 0, 16)
	for i := 0; i < len(word); {
		_, n := utf8.DecodeRune(word[i:])
		buf = buf[:0]
		if i > 0 {
			buf = append(buf, b.prefix...)
		}
		buf = append(buf, word[i:i+n]...)
		if i+n == len(word) {
			buf = append(buf, b.suffix...)
		}
		id, ok := b.v.ids[string(buf)]
		switch {
		case ok:
			syms = append(syms, symbol{id: id, start: i, end: i + n})
		case b.byteFallback && b.byteIDs(word[i:i+n]):
			for k := range n {
				syms = append(syms, symbol{id: b.bytes[word[i+k]], start: i, end: i + n})
			}
		case b.unk < 0: // no unk token: the character is dropped
		case b.fuseUnk && len(syms) > 0 && syms[len(syms)-1].id == b.unk:
			syms[len(syms)-1].end = i + n
		default:
			syms = append(syms, symbol{id: b.unk, start: i, end: i + n})
		}
		i += n
	}
	for i := range syms {
		syms[i].prev, syms[i].next = i-1, i+1
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	var h mergeHeap
	for i := 0; i+1 < len(syms); i++ {
		if m, ok := b.merges[[2]int64{syms[i].id, syms[i+1].id}]; ok {
			h = append(h, mergeCand{m.rank, i, m.id})
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		c := heap.Pop(&h).(mergeCand)
		s := &syms[c.pos]
		if s.dead || s.next < 0 {
			continue
		}
		nx := &syms[s.next]
		if m, ok := b.merges[[2]int64{s.id, nx.id}]; !ok || m.id != c.id {
			continue // stale: a neighbour merged since
		}
		s.id, s.end, s.next = c.id, nx.end, nx.next
		nx.dead = true
		if s.next >= 0 {
			syms[s.next].prev = c.pos
			if m, ok := b.merges[[2]int64{s.id, syms[s.next].id}]; ok {
				heap.Push(&h, mergeCand{m.rank, c.pos, m.id})
			}
		}
		if s.prev >= 0 {
			if m, ok := b.merges[[2]int64{syms[s.prev].id, s.id}]; ok {
				heap.Push(&h, mergeCand{m.rank, s.prev, m.id})
			}
		}
	}
	for i := 0; i >= 0 && i < len(syms); i = syms[i].next {
		out = append(out, piece{syms[i].id, syms[i].start, syms[i].end})
	}
	return out
}

// byteIDs reports whether every byte of s has its <0xXX> token.
func (b *bpe) byteIDs(s []byte) bool {
	if !b.bytesOnce {
		return false
	}
	for _, c := range s {
		if b.bytes[c] < 0 {
			return false
		}
	}
	return true
}

// initBytes finds the <0xXX> tokens of byte_fallback.
func (b *bpe) initBytes() {
	for c := range b.bytes {
		b.bytes[c] = -1
		if id, ok := b.v.ids[fmt.Sprintf("<0x%02X>", c)]; ok {
			b.bytes[c] = id
		}
	}
	b.bytesOnce = true
}
