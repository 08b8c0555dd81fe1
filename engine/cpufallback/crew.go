package cpufallback

import (
	"runtime"
	"sync"

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

// crews are the crews not held, most recently held last (its threads may
// still be spinning: the next step takes it), and busy the CPUs that
// running groups of sequences and the crews' threads take, so that crews
// side by side (replicas, models stepping at once) do not ask for more
// threads than there are CPUs: spinning threads beyond them only slow the
// threads doing work.
var crews struct {
	mu   sync.Mutex
	free []*crew
	busy int
}

// crewCPUs bounds a crew's threads and what busy counts against; tests
// raise it to run more threads than the machine has CPUs.
var crewCPUs = runtime.NumCPU()

// maxCrews bounds the crews alive at once: steps (or groups of a step's
// sequences) that hold one at the same time. A step that finds none free
// splits its calls on the team instead.
const maxCrews = 16

func init() {
	for range maxCrews {
		crews.free = append(crews.free, &crew{})
	}
}

// groupRunning counts a group of sequences that runs on its own thread
// while it does (n 1 at its start, -1 at its end).
func groupRunning(n int) {
	crews.mu.Lock()
	crews.busy += n
	crews.mu.Unlock()
}

// beginCrew holds a crew for a group of sequences that may split its work
// among want threads (its own among them), and returns it with the
// threads the group is to use: the crew's; 1 when the other groups and
// crews running take every CPU; want, with no crew, when the kernels in
// use have none or every crew is held (the team splits the calls then).
func beginCrew(want int) (*crew, int) {
	return beginCrewFor(want, minCrewWork)
}

// minCrewWork is the fewest multiply-adds of a group's step that a crew is
// worth holding for: a crew's thread spins through the step and lingers
// after it, which a step of a few tokens does not repay, and the CPU it
// spins on is the one that HTTP, tokenizing and encoding beside the steps
// need under load (at 64 connections of 13-token texts, one step each,
// crews cost a quarter of the server's throughput). Smaller steps split
// their larger products on the team, as before crews.
var minCrewWork = 1 << 25 // tests lower it

// beginCrewFor is beginCrew for a group whose step does work
// multiply-adds: below minCrewWork, no crew.
func beginCrewFor(want, work int) (*crew, int) {
	want = min(want, crewCPUs)
	if want <= 1 {
		return nil, 1
	}
	if products == nil || products.isa == 0 || work < minCrewWork {
		return nil, want
	}
	crews.mu.Lock()
	extra := min(want-1, crewCPUs-max(crews.busy, 1))
	if extra < 1 || len(crews.free) == 0 {
		crews.mu.Unlock()
		if extra < 1 {
			return nil, 1
		}
		return nil, want
	}
	c := crews.free[len(crews.free)-1]
	crews.free = crews.free[:len(crews.free)-1]
	crews.busy += extra
	crews.mu.Unlock()
	if c.nat == nil {
		if c.nat = newNativeCrew(); c.nat == nil {
			c.threads = 1 + extra
			c.release()
			return nil, want
		}
	}
	c.threads = 1 + extra
	c.nat.begin(c.threads)
	return c, c.threads
}

// end lets the crew's threads go: they spin a little while for the next
// step, then sleep.
func (c *crew) end() {
	if c == nil {
		return
	}
	c.nat.end()
	c.release()
}

func (c *crew) release() {
	crews.mu.Lock()
	crews.busy -= c.threads - 1
	crews.free = append(crews.free, c)
	crews.mu.Unlock()
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
