package generation

import (
	"container/list"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"slices"
)

// BlockPool hands out the KV cache's blocks, each BlockSize tokens of
// keys and values for every layer. Blocks are numbered 0..n-1: a
// sequence's block table lists its blocks in token order.
//
// With prefix caching, a full block whose keys and values are computed is
// also kept by the hash of its tokens and every token before them (the
// chain of its sequence's block hashes): a later sequence whose prompt
// starts with the same tokens shares it (counted by reference) instead of
// computing it again. Blocks no sequence holds stay cached until their
// room is needed, the least recently released first.
type BlockPool struct {
	geo     Geometry // its blocks and their size
	free    []int32  // a stack of blocks holding nothing: the last freed is handed out first
	caching bool

	ref    []int32          // sequences holding each block
	hash   []uint64         // a cached block's chain hash; 0 when it is not cached
	tokens [][]int32        // a cached block's tokens, to check a hash match
	cached map[uint64]int32 // chain hash -> block
	lru    *list.List       // cached blocks no sequence holds, least recent first
	elem   []*list.Element  // each such block's place in lru
	seed   maphash.Seed
}

// NewBlockPool is a pool of blocks blocks of blockSize tokens, without
// prefix caching.
func NewBlockPool(blocks, blockSize int) (*BlockPool, error) {
	return newBlockPool(Geometry{Blocks: blocks, BlockSize: blockSize})
}

// newBlockPool is a pool of g's blocks, without prefix caching.
func newBlockPool(g Geometry) (*BlockPool, error) {
	blocks := g.Blocks
	if blocks < 1 || g.BlockSize < 1 {
		return nil, fmt.Errorf("generation: a KV cache of %d blocks of %d tokens; want at least one block of at least one token", blocks, g.BlockSize)
	}
	p := &BlockPool{geo: g, free: make([]int32, blocks), ref: make([]int32, blocks)}
	for i := range p.free {
		p.free[i] = int32(blocks - 1 - i) // block 0 handed out first
	}
	return p, nil
}

// enableCaching turns prefix caching on, before any block is handed out.
func (p *BlockPool) enableCaching() {
	p.caching = true
	p.hash = make([]uint64, p.geo.Blocks)
	p.tokens = make([][]int32, p.geo.Blocks)
	p.cached = map[uint64]int32{}
	p.lru = list.New()
	p.elem = make([]*list.Element, p.geo.Blocks)
	p.seed = maphash.MakeSeed()
}

// BlockSize is how many tokens a block holds.
func (p *BlockPool) BlockSize() int { return p.geo.BlockSize }

// Free is how many blocks a sequence can take: those holding nothing,
// and the cached ones no sequence holds.
func (p *BlockPool) Free() int {
	n := len(p.free)
	if p.lru != nil {
		n += p.lru.Len()
	}
	return n
}

// Cached is how many blocks are kept for their prefix.
func (p *BlockPool) Cached() int { return len(p.cached) }

// Total is how many blocks the pool has.
func (p *BlockPool) Total() int { return p.geo.Blocks }

// take hands out a block: a free one, else the least recently released
// cached one, forgotten.
func (p *BlockPool) take() int32 {
	var b int32
	if n := len(p.free); n > 0 {
		b = p.free[n-1]
		p.free = p.free[:n-1]
	} else {
		e := p.lru.Front()
		b = e.Value.(int32)
		p.lru.Remove(e)
		p.elem[b] = nil
		p.forget(b)
	}
	p.ref[b] = 1
	return b
}

// forget drops b from the cache.
func (p *BlockPool) forget(b int32) {
	if p.hash == nil || p.hash[b] == 0 {
		return
	}
	delete(p.cached, p.hash[b])
	p.hash[b], p.tokens[b] = 0, nil
}

// grow appends to table the blocks it needs to hold tokens tokens; it
// takes nothing and reports false when the pool has too few.
func (p *BlockPool) grow(table []int32, tokens int) ([]int32, bool) {
	need := p.geo.BlocksFor(tokens) - len(table)
	if need <= 0 {
		return table, true
	}
	if need > p.Free() {
		return table, false
	}
	for range need {
		table = append(table, p.take())
	}
	return table, true
}

// release gives table's blocks back: a block no sequence holds any more
// is free, or, cached, kept until its room is needed.
func (p *BlockPool) release(table []int32) {
	for i := len(table) - 1; i >= 0; i-- {
		b := table[i]
		if p.ref[b]--; p.ref[b] > 0 {
			continue
		}
		if p.hash != nil && p.hash[b] != 0 {
			p.elem[b] = p.lru.PushBack(b)
			continue
		}
		p.free = append(p.free, b)
	}
}

// chain is the hash of a block of tokens after the blocks whose chain
// hash is parent; never 0 (which marks an uncached block).
func (p *BlockPool) chain(parent uint64, tokens []int32) uint64 {
	var h maphash.Hash
	h.SetSeed(p.seed)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], parent)
	h.Write(b[:])
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(b[:4], uint32(t))
		h.Write(b[:4])
	}
	return h.Sum64() | 1
}

// share looks q's tokens up block by block, as far as whole blocks are
// cached, and gives q those blocks (held by reference): the tokens they
// hold need no computing. It leaves at least the last token to compute,
// which the step samples after.
func (p *BlockPool) share(q *Sequence) int {
	if !p.caching {
		return 0
	}
	var parent uint64
	buf := make([]int32, p.geo.BlockSize)
	for (len(q.table)+1)*p.geo.BlockSize < q.Len() { // a whole block, and a token after it
		i := len(q.table)
		for j := range buf {
			buf[j] = q.Token(i*p.geo.BlockSize + j)
		}
		h := p.chain(parent, buf)
		b, ok := p.cached[h]
		if !ok || !slices.Equal(p.tokens[b], buf) {
			break
		}
		if p.ref[b] == 0 {
			p.lru.Remove(p.elem[b])
			p.elem[b] = nil
		}
		p.ref[b]++
		q.table = append(q.table, b)
		q.hashes = append(q.hashes, h)
		parent = h
	}
	return len(q.table) * p.geo.BlockSize
}

// register caches q's blocks that are whole and computed and not cached
// yet; a block whose tokens another block holds already stays uncached.
func (p *BlockPool) register(q *Sequence) {
	if !p.caching {
		return
	}
	for len(q.hashes) < len(q.table) && (len(q.hashes)+1)*p.geo.BlockSize <= q.computed {
		i := len(q.hashes)
		var parent uint64
		if i > 0 {
			parent = q.hashes[i-1]
		}
		toks := make([]int32, p.geo.BlockSize)
		for j := range toks {
			toks[j] = q.Token(i*p.geo.BlockSize + j)
		}
		h := p.chain(parent, toks)
		q.hashes = append(q.hashes, h)
		b := q.table[i]
		if _, dup := p.cached[h]; dup || p.hash[b] != 0 {
			continue
		}
		p.cached[h], p.hash[b], p.tokens[b] = b, h, toks
	}
}
