package generation

// Geometry is the paged KV cache's shape, which the scheduler that hands
// its blocks out and the engines that read and write it must agree on:
// Blocks blocks of BlockSize tokens, and a sequence of at most
// MaxModelLen tokens. It is computed here once so that no engine keeps
// its own arithmetic for a block table or a slot.
//
// A cache slot is a token's place in the whole cache: block b's token t
// is slot b*BlockSize + t. An engine's cache holds one more block than
// Blocks, the trash block: a step's padding (a row or token that is not
// real, in a bucket's fixed shape) writes its keys and values there, so
// that it needs no branch and overwrites no sequence's.
type Geometry struct {
	Blocks, BlockSize int
	MaxModelLen       int
}

// Geometry is the KV cache's geometry the options describe.
func (o Options) Geometry() Geometry {
	return Geometry{Blocks: o.Blocks, BlockSize: o.BlockSize, MaxModelLen: o.MaxModelLen}
}

// BlocksFor is how many blocks tokens tokens fill: the last one may be
// partly filled.
func (g Geometry) BlocksFor(tokens int) int { return (tokens + g.BlockSize - 1) / g.BlockSize }

// TableWidth is the most entries a block table has: the blocks of a
// sequence of MaxModelLen tokens. An engine sizes a step's tables so.
func (g Geometry) TableWidth() int { return g.BlocksFor(g.MaxModelLen) }

// Slot is the cache slot of token pos of the sequence whose block table
// is table.
func (g Geometry) Slot(table []int32, pos int) int32 {
	return table[pos/g.BlockSize]*int32(g.BlockSize) + int32(pos%g.BlockSize)
}

// Locate is the block and the token within it of cache slot s.
func (g Geometry) Locate(s int) (block, offset int) { return s / g.BlockSize, s % g.BlockSize }

// Slots is how many token slots the cache's blocks hold, the trash block
// not counted.
func (g Geometry) Slots() int { return g.Blocks * g.BlockSize }

// Trash is the trash block: the one past the cache's Blocks.
func (g Geometry) Trash() int32 { return int32(g.Blocks) }

// TrashSlot is the trash block's first slot, where a padding token
// writes.
func (g Geometry) TrashSlot() int32 { return g.Trash() * int32(g.BlockSize) }

// TableEntry is entry j of table padded to TableWidth: the trash block
// past the table's end.
func (g Geometry) TableEntry(table []int32, j int) int32 {
	if j < len(table) {
		return table[j]
	}
	return g.Trash()
}
