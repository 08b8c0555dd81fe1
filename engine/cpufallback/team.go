package cpufallback

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// A team splits one piece of work (a product's output panels, a layer's
// attention heads) among threads, for a step with fewer sequences than
// engine.cpu_threads: its groups (see parallel.go) leave CPUs idle, and a
// 1-sequence step would otherwise run on one. The caller runs chunks too,
// and helpers join when they are free, so a busy machine degrades to the
// caller doing it all; nothing allocates per call.

// rangeTask is work over chunks 0 up to n: run does chunk i.
type rangeTask interface{ run(i int) }

// job is one parallel call in flight: chunks are taken with next, counted
// with done. Helpers are told of it by gen, so that one told late (after
// the call returned and the job went back to the free list) does nothing.
type job struct {
	task   rangeTask
	chunks int64
	next   atomic.Int64
	done   atomic.Int64
	refs   atomic.Int64  // helpers inside the job
	gen    atomic.Uint64 // bumped when the call ends
	finish chan struct{} // the chunk that completes the job signals here
	lin    linearTask    // the job's task when it is a product
}

type jobTicket struct {
	j   *job
	gen uint64
}

var team struct {
	once    sync.Once
	free    chan *job      // jobs not in use
	tickets chan jobTicket // helpers wait here
	mu      sync.Mutex
	helpers int
}

const maxJobs = 64

// minParallelWork is the fewest multiply-adds worth splitting: below it,
// waking a helper costs about what it would save. Tests lower it.
var minParallelWork = 1 << 19

func teamInit() {
	team.free = make(chan *job, maxJobs)
	for range maxJobs {
		team.free <- &job{finish: make(chan struct{}, 1)}
	}
	team.tickets = make(chan jobTicket, maxJobs)
}

// ensureHelpers starts helpers up to n (they live for the process, like
// the group workers).
func ensureHelpers(n int) {
	team.mu.Lock()
	defer team.mu.Unlock()
	for ; team.helpers < n; team.helpers++ {
		go func() {
			for t := range team.tickets {
				t.j.help(t.gen)
			}
		}()
	}
}

func (j *job) help(gen uint64) {
	j.refs.Add(1)
	if j.gen.Load() == gen {
		j.work()
	}
	j.refs.Add(-1)
}

// work runs chunks until none are left; the one that completes the last
// chunk signals finish.
func (j *job) work() {
	for {
		i := j.next.Add(1) - 1
		if i >= j.chunks {
			return
		}
		j.task.run(int(i))
		if j.done.Add(1) == j.chunks {
			j.finish <- struct{}{}
		}
	}
}

// parallelRun runs t's chunks 0 up to chunks on up to threads threads (the
// caller's among them) and returns when all are done.
func parallelRun(t rangeTask, chunks, threads int) {
	threads = min(threads, chunks, runtime.NumCPU())
	if threads <= 1 {
		for i := range chunks {
			t.run(i)
		}
		return
	}
	j := acquireJob()
	if j == nil {
		for i := range chunks {
			t.run(i)
		}
		return
	}
	runJob(j, t, chunks, threads)
	releaseJob(j)
}

func acquireJob() *job {
	team.once.Do(teamInit)
	select {
	case j := <-team.free:
		return j
	default:
		return nil // every job slot in use: run serially
	}
}

func runJob(j *job, t rangeTask, chunks, threads int) {
	ensureHelpers(int(parallelism.Load()) - 1)
	j.task, j.chunks = t, int64(chunks)
	j.next.Store(0)
	j.done.Store(0)
	gen := j.gen.Load()
	for range threads - 1 {
		select {
		case team.tickets <- jobTicket{j, gen}:
		default: // helpers busy: fewer threads
		}
	}
	j.work()
	<-j.finish
}

func releaseJob(j *job) {
	// Late helpers see a new generation and leave; wait for any inside.
	j.gen.Add(1)
	for j.refs.Load() != 0 {
		runtime.Gosched()
	}
	j.task = nil
	j.lin = linearTask{}
	team.free <- j
}

// linearTask is linearPanels split by panels.
type linearTask struct {
	m           int
	x, y, bias  []float32
	w           *weight
	act         activation
	panels, per int
}

func (t *linearTask) run(i int) {
	p0 := i * t.per
	linearPanels(t.m, t.x, t.w, t.y, t.bias, t.act, p0, min(p0+t.per, t.panels))
}

// linearPar is linearPanels over every panel of w on up to threads
// threads, each taking panels a chunk at a time.
func linearPar(threads, m int, x []float32, w *weight, y, bias []float32, act activation) {
	panels := w.panels()
	if threads <= 1 || panels <= 1 || m*w.in*w.out < minParallelWork {
		linearPanels(m, x, w, y, bias, act, 0, panels)
		return
	}
	j := acquireJob()
	if j == nil {
		linearPanels(m, x, w, y, bias, act, 0, panels)
		return
	}
	// About two chunks a thread, so that a late helper still finds work.
	per := max(1, panels/(2*threads))
	j.lin = linearTask{m: m, x: x, y: y, bias: bias, w: w, act: act, panels: panels, per: per}
	runJob(j, &j.lin, (panels+per-1)/per, threads)
	releaseJob(j)
}
