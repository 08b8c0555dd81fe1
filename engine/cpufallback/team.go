package cpufallback

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
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
	// panicked is a chunk's panic, raised again on the caller's goroutine
	// once every chunk is done: a helper's panic would otherwise end the
	// process from a goroutine no one can recover on.
	panicMu  sync.Mutex
	panicked any
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
			for {
				t, ok := spinFor(team.tickets)
				if !ok {
					t = <-team.tickets
				}
				t.j.help(t.gen)
			}
		}()
	}
}

// spinWait is how long a helper that finished its work, or a caller
// waiting for its helpers, polls before it parks: a step's products and
// heads come back to back, and waking a parked goroutine on another CPU
// costs tens of microseconds each time (a third of the second thread's
// gain at one sequence here). It polls with runtime.Gosched, so that other
// goroutines on its CPU (HTTP, tokenizing) still run; it is short enough
// that an idle server parks at once after a step.
const spinWait = 50 * time.Microsecond

// spinFor polls c for up to spinWait.
func spinFor(c chan jobTicket) (jobTicket, bool) {
	var start time.Time
	for i := 0; ; i++ {
		select {
		case t := <-c:
			return t, true
		default:
		}
		if i%16 == 0 {
			if i == 0 {
				start = time.Now()
			} else if time.Since(start) > spinWait {
				return jobTicket{}, false
			}
		}
		runtime.Gosched()
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
		j.runChunk(int(i))
		if j.done.Add(1) == j.chunks {
			j.finish <- struct{}{}
		}
	}
}

// runChunk runs chunk i, keeping a panic for the caller.
func (j *job) runChunk(i int) {
	defer func() {
		if p := recover(); p != nil {
			j.panicMu.Lock()
			if j.panicked == nil {
				j.panicked = p
			}
			j.panicMu.Unlock()
		}
	}()
	j.task.run(i)
}

// parallelRun runs t's chunks 0 up to chunks on up to threads threads (the
// caller's among them) and returns when all are done.
func parallelRun(t rangeTask, chunks, threads int) {
	threads = min(threads, chunks, runtime.NumCPU())
	if threads <= 1 {
		serialRun(t, chunks)
		return
	}
	j := acquireJob()
	if j == nil {
		serialRun(t, chunks)
		return
	}
	runJob(j, t, chunks, threads)
	j.panicMu.Lock()
	p := j.panicked
	j.panicked = nil
	j.panicMu.Unlock()
	releaseJob(j)
	if p != nil {
		panic(p)
	}
}

// serialRun runs t's chunks on the caller, with parallelRun's contract
// however many CPUs there are: every chunk runs, and a panic reaches the
// caller after the last. The chunks run plainly (this is the hot path of
// short sequences); only when one panics does the deferred call run the
// rest, each caught, before the first panic goes on up with its own stack.
func serialRun(t rangeTask, chunks int) {
	i := 0
	defer func() {
		if i < chunks { // chunk i panicked
			for i++; i < chunks; i++ {
				runCaught(t, i)
			}
		}
	}()
	for ; i < chunks; i++ {
		t.run(i)
	}
}

// runCaught runs chunk i, recovering its panic (a later chunk's, after
// the first has been kept).
func runCaught(t rangeTask, i int) {
	defer func() { _ = recover() }()
	t.run(i)
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
	// The helpers' last chunks: poll a while before parking.
	var start time.Time
	for i := 0; j.done.Load() != j.chunks; i++ {
		if i%16 == 0 {
			if i == 0 {
				start = time.Now()
			} else if time.Since(start) > spinWait {
				break
			}
		}
		runtime.Gosched()
	}
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

// linearTask is linearPanels of up to three products of the same x (a
// layer's query, key and value), split by panels: chunk i is panels
// i*per up to (i+1)*per counted across the products in order.
type linearTask struct {
	m     int
	x     []float32
	n     int // products
	w     [3]*weight
	y     [3][]float32
	bias  [3][]float32
	act   activation
	first [4]int // product i's panels are first[i] up to first[i+1]
	per   int
	// acts is x quantized, once for the task, where a weight is Q8_0.
	acts *q8Acts
}

func (t *linearTask) run(i int) {
	lo, hi := i*t.per, (i+1)*t.per
	for k := range t.n {
		p0, p1 := max(lo, t.first[k]), min(hi, t.first[k+1])
		switch {
		case p0 >= p1:
		case t.w[k].q8 != nil:
			linearQ8(t.m, t.acts, t.w[k], t.y[k], t.bias[k], t.act, p0-t.first[k], p1-t.first[k])
		default:
			linearPanels(t.m, t.x, t.w[k], t.y[k], t.bias[k], t.act, p0-t.first[k], p1-t.first[k])
		}
	}
}

// linearPar is linearPanels over every panel of w on the crew c, or with
// none on up to threads threads, each taking panels a chunk at a time.
func linearPar(c *crew, threads, m int, x []float32, w *weight, y, bias []float32, act activation) {
	linearParN(c, threads, m, x, 1, [3]*weight{w}, [3][]float32{y}, [3][]float32{bias}, act)
}

// linearParN is linearPar of n (up to 3) products of the same x, as one
// split: one hand-off for the three, and chunks that balance across them.
func linearParN(c *crew, threads, m int, x []float32, n int, w [3]*weight, y, bias [3][]float32, act activation) {
	t := linearTask{m: m, x: x, n: n, w: w, y: y, bias: bias, act: act}
	work := 0
	for k := range n {
		t.first[k+1] = t.first[k] + w[k].panels()
		work += m * w[k].in * w[k].out
		if w[k].q8 != nil && t.acts == nil {
			t.acts = quantizeActs(m, w[k].in, x)
		}
	}
	if t.acts != nil {
		defer t.acts.release()
	}
	panels := t.first[n]
	if c != nil {
		threads = c.threads
	}
	if threads <= 1 || panels <= 1 || work < minParallelWork {
		t.per = panels
		t.run(0)
		return
	}
	if c != nil {
		c.linear(&t)
		return
	}
	j := acquireJob()
	if j == nil {
		t.per = panels
		t.run(0)
		return
	}
	// About four chunks a thread, so that a late helper still finds work
	// and the threads end within a small chunk of each other (two a
	// thread measured 3-5% slower at one 128-token sequence).
	t.per = max(1, panels/(4*threads))
	j.lin = t
	runJob(j, &j.lin, (panels+t.per-1)/t.per, threads)
	releaseJob(j)
}
