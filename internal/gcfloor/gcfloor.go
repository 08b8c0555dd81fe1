// Package gcfloor keeps Go's garbage collector from running more often
// than once per a fixed amount of allocation while the live heap is
// small.
//
// With GOGC=100 the collector runs each time the heap doubles. A server
// whose live heap is a few MiB (the CPU engine's small models, or every
// model on the worker engines, whose weights are in another process)
// allocating a few KiB per request then collects about a hundred times a
// second under load: each cycle scans every goroutine's stack and shrinks
// the idle ones, which the next request grows again. Measured on
// single-row digits over gRPC (issue 30), that was a third of the
// server's CPU. A floor lets the heap grow by at least Floor bytes
// between collections; above Floor the collector runs as GOGC=100 does,
// and the soft memory limit (debug.SetMemoryLimit) still bounds it near
// the process's limit.
package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// base is the GOGC percent the floor never goes below: Go's default.
const base = 100

// heapMinimum is the runtime's smallest heap goal at GOGC=100, scaled
// by GOGC (runtime/mgcpacer.go, defaultHeapMinimum).
const heapMinimum = 4 << 20

// maxPercent bounds the percent set for a nearly empty heap.
const maxPercent = 1 << 20

// Floor raises the GC percent after each collection so that the next
// collection comes after at least floor bytes of new allocation, until
// Stop. Its zero value is not usable; see [Start].
type Floor struct {
	floor   uint64
	mu      sync.Mutex
	percent int
	stopped bool
	sample  []metrics.Sample
}

// sentinel is garbage whose cleanup marks the end of a collection.
type sentinel struct{ _ [16]byte }

// Start sets the GC percent for a floor of floor bytes from the heap
// live now, and again after every collection.
func Start(floor uint64) *Floor {
	f := &Floor{floor: floor, percent: base,
		sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}}
	f.tune()
	f.arm()
	return f
}

// arm schedules tune after the next collection.
func (f *Floor) arm() {
	runtime.AddCleanup(new(sentinel), func(f *Floor) {
		f.mu.Lock()
		stopped := f.stopped
		f.mu.Unlock()
		if !stopped {
			f.tune()
			f.arm()
		}
	}, f)
}

// Percent is the GC percent set last.
func (f *Floor) Percent() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.percent
}

// tune sets the percent that puts the next collection floor bytes above
// the live heap, and never below base. It is set again only when it
// moves by more than an eighth, so that a steady heap does not call
// SetGCPercent after every collection.
func (f *Floor) tune() {
	metrics.Read(f.sample)
	// GOGC's goal is the live heap plus GOGC percent of the live heap,
	// the stacks and the globals, and at least GOGC percent of 4 MiB (the
	// runtime's heap minimum). Before the first collection nothing is
	// known: GOGC=100 until then.
	live := f.sample[0].Value.Uint64()
	var scanned uint64
	for _, s := range f.sample {
		scanned += s.Value.Uint64()
	}
	p := base
	if live > 0 {
		p = int(min(f.floor*100/scanned, (live+f.floor)*100/heapMinimum, maxPercent))
	}
	p = max(p, base)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	if d := p - f.percent; d > f.percent/8 || -d > f.percent/8 {
		f.percent = p
		debug.SetGCPercent(p)
	}
}

// Stop stops tuning and sets the GC percent back to base.
func (f *Floor) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.stopped {
		f.stopped = true
		f.percent = base
		debug.SetGCPercent(base)
	}
}
