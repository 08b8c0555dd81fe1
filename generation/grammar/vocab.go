package grammar

import (
	"bytes"
	"slices"
)

// Vocab is a model's vocabulary as raw bytes: token i stands for
// Tokens[i]. The caller decodes byte-level BPE forms ("Ġ") and
// SentencePiece pieces ("▁", <0xNN>) to the bytes they stand for; special
// tokens other than the end-of-sequence ones are nil and never allowed.
// A Vocab is immutable and may be shared by any number of grammars.
type Vocab struct {
	tokens [][]byte
	eos    []int32
	isEOS  []bool
	trie   trie // every token but the empty ones and EOS
}

// NewVocab makes a vocabulary of len(tokens) tokens. eos lists the tokens
// that end a sequence: allowed only once the output is complete. Pad
// tokens to the logits' width with nil where the model has more rows than
// its tokenizer has tokens.
func NewVocab(tokens [][]byte, eos []int32) *Vocab {
	v := &Vocab{tokens: tokens, isEOS: make([]bool, len(tokens))}
	for _, id := range eos {
		if id >= 0 && int(id) < len(tokens) && !v.isEOS[id] {
			v.isEOS[id] = true
			v.eos = append(v.eos, id)
		}
	}
	var items []trieItem
	for id, b := range tokens {
		if len(b) > 0 && !v.isEOS[id] {
			items = append(items, trieItem{b, int32(id)})
		}
	}
	v.trie = buildTrie(items)
	return v
}

// Size is the number of tokens, the bits of a mask.
func (v *Vocab) Size() int { return len(v.tokens) }

// MaskWords is the length of a mask: (Size+31)/32 words.
func (v *Vocab) MaskWords() int { return (len(v.tokens) + 31) / 32 }

// trie is a byte trie laid out in preorder: node i reads byte b[i] at
// depth depth[i] (the root, depth 0, is implicit); its subtree is the
// nodes i..end[i]-1; the tokens ending there are toks[off[i]:off[i+1]].
// A walk skips a rejected node's subtree by jumping to end[i].
type trie struct {
	b     []byte
	depth []int32
	end   []int32
	off   []int32
	toks  []int32
}

type trieItem struct {
	bytes []byte
	id    int32
}

func buildTrie(items []trieItem) trie {
	slices.SortFunc(items, func(a, b trieItem) int {
		if c := bytes.Compare(a.bytes, b.bytes); c != 0 {
			return c
		}
		return int(a.id - b.id)
	})
	var t trie
	var path []int32 // the nodes of the previous item's bytes
	var prev []byte
	for _, it := range items {
		l := 0
		for l < len(prev) && l < len(it.bytes) && prev[l] == it.bytes[l] {
			l++
		}
		for len(path) > l {
			t.end[path[len(path)-1]] = int32(len(t.b))
			path = path[:len(path)-1]
		}
		for d := l; d < len(it.bytes); d++ {
			path = append(path, int32(len(t.b)))
			t.b = append(t.b, it.bytes[d])
			t.depth = append(t.depth, int32(d+1))
			t.end = append(t.end, 0)
			t.off = append(t.off, int32(len(t.toks)))
		}
		t.toks = append(t.toks, it.id)
		prev = it.bytes
	}
	for _, p := range path {
		t.end[p] = int32(len(t.b))
	}
	t.off = append(t.off, int32(len(t.toks)))
	return t
}

// tokensAt is the tokens that end at node i.
func (t *trie) tokensAt(i int) []int32 { return t.toks[t.off[i]:t.off[i+1]] }
