package cpufallback

import (
	"runtime"

	"github.com/stepserve/stepserve/models"
)

// A crew is the threads a step of few sequences holds from its first
// layer to its last, to split each product's panels, each layer's heads
// and each layer norm's rows among engine.cpu_threads CPUs (a step with
// fewer sequences than that leaves CPUs idle otherwise). Where the native
// kernels run, a crew is POSIX threads in C (crew_native.c) that spin
// between the step's phases and sleep between steps: the kernels are cgo
// calls of tens to hundreds of microseconds, and goroutines that make them
// lose their Ps to the scheduler's sysmon while in C, so that a helper
// goroutine came back late, or parked and took a wake-up (tens of
// microseconds on a virtual machine, more than a chunk), for a third of
// the products of one 128-token sequence. Elsewhere (the Go and BLAS
// kernels) there is no crew: the step's calls split one job at a time on
// the team's goroutines (team.go).
type crew struct {
	threads int
	nat     *nativeCrew
}

var crews = make(chan *crew, maxCrews)

// crewCPUs bounds a crew's threads; tests raise it to run more threads
// than the machine has CPUs.
var crewCPUs = runtime.NumCPU()

// maxCrews bounds the crews alive at once: steps (or groups of a step's
// sequences) that hold one at the same time. A step that finds none free
// splits its calls on the team instead.
const maxCrews = 16

func init() {
	for range maxCrews {
		crews <- &crew{}
	}
}

// beginCrew holds a crew for a step that splits its work among threads
// threads (the caller's among them); nil when threads is 1, the kernels in
// use have no native crew, or every crew is held.
func beginCrew(threads int) *crew {
	threads = min(threads, crewCPUs)
	if threads <= 1 || products == nil || products.isa == 0 {
		return nil
	}
	var c *crew
	select {
	case c = <-crews:
	default:
		return nil
	}
	if c.nat == nil {
		if c.nat = newNativeCrew(); c.nat == nil {
			crews <- c
			return nil
		}
	}
	c.threads = threads
	c.nat.begin(threads)
	return c
}

// end lets the crew's threads go: they spin a little while for the next
// step, then sleep.
func (c *crew) end() {
	if c == nil {
		return
	}
	c.nat.end()
	crews <- c
}

// linear runs t's products on the crew, chunks of panels at a time.
func (c *crew) linear(t *linearTask) {
	// About four chunks a thread, of panels as equal as they divide: a
	// thread the OS preempted costs the others at most a chunk's wait
	// (one, two or eight a thread measured alike at one 128-token
	// sequence).
	c.nat.linear(t, min(t.first[t.n], 4*c.threads))
}

// residualNorm is residualNorm on the crew's threads, or on the caller's
// alone without a crew.
func (c *crew) residualNorm(x, y, bias []float32, n models.Norm, eps float64) {
	if c == nil || len(x) < minParallelNorm*len(bias) {
		residualNorm(x, y, bias, n, eps)
		return
	}
	c.nat.norm(x, y, bias, n, eps, c.threads)
}

// minParallelNorm is the fewest rows a layer norm splits among a crew.
const minParallelNorm = 16