package generation

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A block table's width rounds a partly filled last block up.
func TestGeometryTableWidth(t *testing.T) {
	for _, c := range []struct{ maxLen, bs, want int }{
		{16, 4, 4}, {17, 4, 5}, {15, 4, 4}, {1, 16, 1}, {4096, 16, 256}, {7, 1, 7},
	} {
		g := Geometry{Blocks: 8, BlockSize: c.bs, MaxModelLen: c.maxLen}
		assert.Equal(t, c.want, g.TableWidth(), "max_model_len %d in blocks of %d", c.maxLen, c.bs)
	}
	g := Options{Blocks: 8, BlockSize: 4, MaxModelLen: 10}.Geometry()
	assert.Equal(t, Geometry{Blocks: 8, BlockSize: 4, MaxModelLen: 10}, g)
	assert.Equal(t, []int{0, 1, 1, 1, 1, 2}, []int{g.BlocksFor(0), g.BlocksFor(1), g.BlocksFor(2), g.BlocksFor(3), g.BlocksFor(4), g.BlocksFor(5)})
	assert.Equal(t, 32, g.Slots())
}

// A sequence's slots follow its block table, block by block, across
// blocks that are not adjacent in the cache; Locate undoes Slot.
func TestGeometrySlotsAcrossBlocks(t *testing.T) {
	g := Geometry{Blocks: 8, BlockSize: 4, MaxModelLen: 16}
	table := []int32{5, 2, 7}
	var slots []int32
	for pos := range 10 {
		slots = append(slots, g.Slot(table, pos))
	}
	assert.Equal(t, []int32{20, 21, 22, 23, 8, 9, 10, 11, 28, 29}, slots)
	for pos, s := range slots {
		b, off := g.Locate(int(s))
		assert.Equal(t, int(table[pos/4]), b, "position %d's block", pos)
		assert.Equal(t, pos%4, off, "position %d's offset", pos)
	}
}

// Padding goes to the trash block, the one past the cache's: a table is
// padded with it to the table width, and a padding token's slot is its
// first.
func TestGeometryPadding(t *testing.T) {
	g := Geometry{Blocks: 8, BlockSize: 4, MaxModelLen: 14}
	assert.Equal(t, int32(8), g.Trash())
	assert.Equal(t, int32(32), g.TrashSlot())
	table := []int32{3, 0}
	var row []int32
	for j := range g.TableWidth() {
		row = append(row, g.TableEntry(table, j))
	}
	assert.Equal(t, []int32{3, 0, 8, 8}, row)
	assert.Equal(t, []int32{8, 8, 8, 8}, []int32{g.TableEntry(nil, 0), g.TableEntry(nil, 1), g.TableEntry(nil, 2), g.TableEntry(nil, 3)})
}
