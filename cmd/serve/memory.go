package main

import (
	"os"
	"runtime/debug"

	"github.com/stepserve/stepserve/config"
	"github.com/stepserve/stepserve/internal/gcfloor"
	"github.com/stepserve/stepserve/internal/memlimit"
)

// gcFloor is the allocation the garbage collector lets pass between
// collections however small the live heap, unless GOGC is set.
const gcFloor = 64 << 20

// limitMemory reads the memory limit the process runs under
// (internal/memlimit) and bounds by it what requests in flight may hold
// (server.max_inflight_bytes; 0: half the limit) and the garbage
// collector, whose floor runs until stopGCFloor is called.
func limitMemory(cfg *config.Config) (mem memlimit.Limit, inflight int64, stopGCFloor func()) {
	mem = memlimit.Read()
	memLimit := mem.Bytes
	inflight = cfg.Server.MaxInflightBytes
	if inflight == 0 {
		inflight = memLimit / 2
	}
	if os.Getenv("GOMEMLIMIT") == "" && memLimit > 0 {
		// Near the limit the GC works harder, rather than let garbage
		// grow the heap past what the process may use.
		debug.SetMemoryLimit(memLimit * 3 / 4)
	}
	stopGCFloor = func() {}
	if os.Getenv("GOGC") == "" {
		// A small live heap is not collected a hundred times a second
		// under load (internal/gcfloor): 64 MiB between collections, less
		// under a small memory limit.
		floor := uint64(gcFloor)
		if memLimit > 0 {
			floor = min(floor, uint64(memLimit/16))
		}
		stopGCFloor = gcfloor.Start(floor).Stop
	}
	return mem, inflight, stopGCFloor
}
