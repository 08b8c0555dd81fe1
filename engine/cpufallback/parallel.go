package cpufallback

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// A step of several sequences runs on several CPUs by splitting the batch:
// every sequence's layers depend on its own rows alone, so a group of
// sequences runs the whole encoder on its rows while another group runs
// beside it, with one hand-off per step. The BLAS itself runs one thread
// per call (see SetThreads): its idle threads spin, ours wait.

// parallelism is how many groups a step may split into; SetThreads sets
// it, every CPU until then.
var parallelism atomic.Int32

func init() { parallelism.Store(int32(runtime.NumCPU())) }

// minGroupRows is the fewest rows worth a group of its own: below it the
// hand-off costs more than the rows' products.
const minGroupRows = 32

// groupTask asks a worker to run group g of plan p's step; it answers on
// p.groupDone.
type groupTask struct {
	p *encoderPlan
	g int
}

// workers run group tasks for every plan; they start with the first step
// that splits, and grow to parallelism-1 (the stepping goroutine runs a
// group too).
var workers struct {
	mu      sync.Mutex
	started int
	tasks   chan groupTask
}

func ensureWorkers(n int) chan groupTask {
	workers.mu.Lock()
	defer workers.mu.Unlock()
	if workers.tasks == nil {
		workers.tasks = make(chan groupTask)
	}
	for ; workers.started < n; workers.started++ {
		go func(tasks <-chan groupTask) {
			for t := range tasks {
				t.p.runGroup(t.g)
				t.p.groupDone <- struct{}{}
			}
		}(workers.tasks)
	}
	return workers.tasks
}
