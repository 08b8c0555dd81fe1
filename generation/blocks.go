package generation

import "fmt"

// BlockPool hands out the KV cache's blocks, each BlockSize tokens of
// keys and values for every layer. Blocks are numbered 0..n-1: a
// sequence's block table lists its blocks in token order.
type BlockPool struct {
	blockSize int
	free      []int32 // a stack: the last freed is handed out first
	total     int
}

// NewBlockPool is a pool of blocks blocks of blockSize tokens.
func NewBlockPool(blocks, blockSize int) (*BlockPool, error) {
	if blocks < 1 || blockSize < 1 {
		return nil, fmt.Errorf("generation: a KV cache of %d blocks of %d tokens; want at least one block of at least one token", blocks, blockSize)
	}
	p := &BlockPool{blockSize: blockSize, free: make([]int32, blocks), total: blocks}
	for i := range p.free {
		p.free[i] = int32(blocks - 1 - i) // block 0 handed out first
	}
	return p, nil
}

// BlockSize is how many tokens a block holds.
func (p *BlockPool) BlockSize() int { return p.blockSize }

// Free is how many blocks are free.
func (p *BlockPool) Free() int { return len(p.free) }

// Total is how many blocks the pool has.
func (p *BlockPool) Total() int { return p.total }

// blocksFor is how many blocks tokens tokens fill.
func (p *BlockPool) blocksFor(tokens int) int { return (tokens + p.blockSize - 1) / p.blockSize }

// grow appends to table the blocks it needs to hold tokens tokens; it
// takes nothing and reports false when the pool has too few free.
func (p *BlockPool) grow(table []int32, tokens int) ([]int32, bool) {
	need := p.blocksFor(tokens) - len(table)
	if need <= 0 {
		return table, true
	}
	if need > len(p.free) {
		return table, false
	}
	n := len(p.free) - need
	for i := len(p.free) - 1; i >= n; i-- {
		table = append(table, p.free[i])
	}
	p.free = p.free[:n]
	return table, true
}

// release gives table's blocks back.
func (p *BlockPool) release(table []int32) {
	for i := len(table) - 1; i >= 0; i-- {
		p.free = append(p.free, table[i])
	}
}
