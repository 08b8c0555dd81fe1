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

// SetThreads sets how many CPUs one step may use, n of them or with n 0
// every CPU, and returns the number in effect. The encoder splits a
// step's sequences into that many groups that run side by side (each
// sequence depends on its own rows alone); the BLAS runs each product on
// one thread, because an idle OpenBLAS thread spins on its CPU and takes
// it from the HTTP, tokenizing and encoding work that runs beside the
// steps (a third of a loaded 2-CPU server went to that spinning).
func SetThreads(n int) int {
	if n == 0 {
		n = runtime.NumCPU()
	}
	parallelism.Store(int32(n))
	return n
}

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

// stepThreads is how many threads one step may use now (engine.cpu_threads,
// at most the CPUs): a plan holds an attention score block for each, so
// that a server told to use 4 of 64 CPUs does not hold 64 blocks of
// seq x seq floats per bucket.
func stepThreads() int { return max(1, min(int(parallelism.Load()), runtime.NumCPU())) }
