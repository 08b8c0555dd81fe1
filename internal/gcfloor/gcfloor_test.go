package gcfloor

import (
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

var sink []byte

// churn allocates n bytes of garbage in 4 KiB pieces, as requests do.
func churn(n int) {
	for i := 0; i < n/4096; i++ {
		sink = make([]byte, 4096)
	}
}

// collections counts the collections while n bytes of garbage are
// allocated over a small live heap.
func collections(n int) uint32 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.NumGC
	churn(n)
	runtime.ReadMemStats(&ms)
	return ms.NumGC - before
}

// With a 64 MiB floor, 512 MiB of garbage over a heap of a few MiB is
// collected about eight times, not the hundred-odd times GOGC=100 takes;
// stopping gives GOGC=100 back.
func TestFloorSpacesCollections(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(base))
	runtime.GC()
	without := collections(512 << 20)

	f := Start(64 << 20)
	runtime.GC() // tuned from the live heap after a collection
	assert.Greater(t, f.Percent(), 400, "a heap of a few MiB needs a percent far above 100 for a 64 MiB floor")
	with := collections(512 << 20)
	f.Stop()
	t.Logf("collections over 512 MiB of garbage: %d at GOGC=100, %d with a 64 MiB floor", without, with)
	assert.GreaterOrEqual(t, without, uint32(40), "GOGC=100 over a small heap")
	assert.LessOrEqual(t, with, uint32(12), "at least 64 MiB between collections")
	assert.GreaterOrEqual(t, with, uint32(4), "and not far more than 64 MiB: the stacks and globals are counted")

	assert.Equal(t, base, f.Percent())
	assert.Equal(t, base, debug.SetGCPercent(base), "Stop sets GOGC=100 back")
	runtime.GC()
	assert.Equal(t, base, debug.SetGCPercent(base), "a collection after Stop does not tune")
}

// A live heap above the floor is collected as GOGC=100 does.
func TestFloorBelowLiveHeapIsDefault(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(base))
	live := make([]byte, 96<<20)
	for i := range live {
		live[i] = 1
	}
	runtime.GC()
	f := Start(64 << 20)
	defer f.Stop()
	runtime.GC()
	assert.Equal(t, base, f.Percent())
	runtime.KeepAlive(live)
}
