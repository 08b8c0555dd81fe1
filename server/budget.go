package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path"
	runtimemetrics "runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stepserve/stepserve/models"
)

// budgetWait is how long a request waits for in-flight memory that others
// hold before it is answered 503: long enough to ride out a burst, short
// enough that a client retries rather than times out.
const budgetWait = time.Second

// A budget is the memory all requests in flight may hold together. A
// request takes its bytes before it allocates them (its body as it grows,
// then, from its declared shapes, its tensors, outputs and response) and
// gives them back once its response is written, so that concurrency cannot
// multiply one request's bound into more memory than the process has.
//
// Taking and giving are an atomic add each; only a request that finds the
// budget spent waits, on a channel closed whenever bytes are given back.
// It is safe for concurrent use.
type budget struct {
	limit   int64
	used    atomic.Int64
	waiting atomic.Int32
	mu      sync.Mutex
	freed   chan struct{} // closed, and replaced, when bytes are given back to a waiter
}

func newBudget(limit int64) *budget {
	return &budget{limit: limit, freed: make(chan struct{})}
}

// tryTake takes n bytes if they are free.
func (b *budget) tryTake(n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// wait takes n bytes, waiting up to wait for others to give them back:
// errBudgetBusy if they do not in time.
func (b *budget) wait(ctx context.Context, n int64, wait time.Duration) error {
	b.waiting.Add(1)
	defer b.waiting.Add(-1)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		b.mu.Lock()
		freed := b.freed
		b.mu.Unlock()
		// Tried after freed is read: bytes given back since then are
		// either seen here or close the channel read.
		if b.tryTake(n) {
			return nil
		}
		select {
		case <-freed:
		case <-timer.C:
			return errBudgetBusy
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// give gives back n bytes taken before.
func (b *budget) give(n int64) {
	b.used.Add(-n)
	if b.waiting.Load() > 0 {
		b.mu.Lock()
		close(b.freed)
		b.freed = make(chan struct{})
		b.mu.Unlock()
	}
}

var errBudgetBusy = errors.New("server: the in-flight budget stayed spent")

// A charge is what one request holds of the budget; release gives it all
// back. It is used by one request's goroutine.
type charge struct {
	b    *budget
	wait time.Duration // how long a take waits for others to give back
	held int64
}

// take adds n bytes to the charge, waiting briefly when others hold the
// budget. Its errors are the answers: 413 when the request alone would
// need more than the whole budget, 503 (with Retry-After) when others hold
// it. what names the request's part that needs the bytes.
func (c *charge) take(ctx context.Context, n int64, what string) error {
	if n <= 0 {
		return nil
	}
	if c.held+n > c.b.limit {
		return &apiError{http.StatusRequestEntityTooLarge, fmt.Sprintf(
			"%s would take about %s of memory, more than the server's whole in-flight budget of %s (server.max_inflight_bytes); send a smaller request",
			what, formatBytes(c.held+n), formatBytes(c.b.limit))}
	}
	if !c.b.tryTake(n) {
		if err := c.b.wait(ctx, n, c.wait); err != nil {
			if err != errBudgetBusy {
				return err
			}
			return &apiError{http.StatusServiceUnavailable, fmt.Sprintf(
				"the server is busy: requests in flight hold %s of its %s in-flight budget (server.max_inflight_bytes), and %s needs %s more; retry",
				formatBytes(c.b.used.Load()), formatBytes(c.b.limit), what, formatBytes(n))}
		}
	}
	c.held += n
	return nil
}

// release gives back the whole charge.
func (c *charge) release() {
	if c.held != 0 {
		c.b.give(c.held)
		c.held = 0
	}
}

// A footprint is what a request will hold in memory until its response is
// written, bounded from its declared shapes before any of it is built.
type footprint struct {
	rows    int
	inputs  int64 // the decoded tensors
	step    int64 // what the model builds for the step from them
	outputs int64 // the output buffers
	json    int64 // the response's JSON
	binary  int64 // the binary outputs written after the JSON (the output buffers themselves)
}

// memory is what the request will take beyond its body.
func (f footprint) memory() int64 { return f.inputs + f.step + f.outputs + f.json }

// response is the size of the response.
func (f footprint) response() int64 { return f.json + f.binary }

// footprintOf bounds what a parsed request will cost: its tensors as
// decoded, the model's step inputs and every output at the longest
// sequence the request may take, and its response at the longest JSON
// each value may take.
func footprintOf(m *models.Model, req *inferRequest) footprint {
	cfg := m.Config
	f := footprint{rows: req.rows}
	seq := 0 // the longest sequence the inputs declare
	for i := range req.wire {
		in := &req.wire[i]
		spec := cfg.Inputs[specIndex(cfg.Inputs, in.Name)]
		for d, want := range spec.Shape[1:] {
			if want < 0 {
				seq = max(seq, int(in.Shape[1+d]))
			}
		}
		elems, binSize, hasBin := in.declared()
		if spec.Datatype != models.BYTES {
			f.inputs += elems * int64(spec.Datatype.Size())
			continue
		}
		const stringHeader = 16
		text := int64(len(in.Data))
		if hasBin {
			text = int64(binSize)
		}
		f.inputs += stringHeader*elems + text
	}
	if seq == 0 {
		seq = cfg.MaxSeq() // text: its tokens may be as long as the longest bucket
	}
	rows := int64(req.rows)
	f.step = m.StepBytes(req.rows, seq)
	for _, o := range cfg.Outputs {
		f.outputs += rows * int64(o.RowBytes(seq))
	}
	// The JSON around the values: names, shapes and punctuation; an id may
	// be escaped six bytes to one.
	f.json = 64 + int64(len(m.Name)+len(m.Version)+6*len(req.id))
	for _, c := range req.outputs {
		o := cfg.Outputs[c.index]
		f.json += 112 + int64(len(o.Name)+21*len(o.Shape))
		if c.binary {
			f.binary += rows * int64(o.RowBytes(seq))
		} else {
			f.json += rows * int64(o.RowElements(seq)) * int64(jsonValueBytes(o.Datatype))
		}
	}
	return f
}

// admit checks a parsed request's footprint against the response limit
// and takes its memory from the in-flight budget, on top of its body's.
func (s *Server) admit(r *http.Request, ch *charge, f footprint) error {
	if f.response() > s.opts.MaxResponseBytes {
		perRow, of, advice := f.response()/int64(max(f.rows, 1)), "", "send fewer rows"
		if f.json > f.binary {
			of, advice = " of JSON", "send fewer rows or ask for binary outputs"
		}
		return &apiError{http.StatusRequestEntityTooLarge, fmt.Sprintf(
			"the response would be about %s (%d rows x %s%s), above server.max_response_bytes (%s); %s",
			formatBytes(f.response()), f.rows, formatBytes(perRow), of, formatBytes(s.opts.MaxResponseBytes), advice)}
	}
	return ch.take(r.Context(), f.memory(), "the request")
}

// formatBytes writes a size for a message: 512 B, 64 KiB, 1.5 GiB.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	v, u := float64(n), 0
	for v >= unit && u < 4 {
		v /= unit
		u++
	}
	s := strconv.FormatFloat(v, 'f', 1, 64)
	s = strings.TrimSuffix(s, ".0")
	return s + " " + [...]string{"B", "KiB", "MiB", "GiB", "TiB"}[u]
}

// MemoryLimit is the memory this process may use, and where the figure
// comes from, for the in-flight budget's default: the smallest of the
// cgroup's limit (v2 memory.max or v1 memory.limit_in_bytes, of the
// process's cgroup and its parents), the address space RLIMIT_AS leaves to
// the Go runtime (the limit less what is mapped outside it now: libc, the
// runtime's own reservations, thread stacks) and the machine's RAM. It
// reads /proc and /sys; 0 when none of them says.
func MemoryLimit() (int64, string) {
	var as uint64
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_AS, &rl) == nil && rl.Cur < 1<<62 { // RLIM_INFINITY is all ones
		as = rl.Cur
	}
	sample := []runtimemetrics.Sample{{Name: "/memory/classes/total:bytes"}}
	runtimemetrics.Read(sample)
	var goMapped int64
	if sample[0].Value.Kind() == runtimemetrics.KindUint64 {
		goMapped = int64(sample[0].Value.Uint64())
	}
	return memoryLimit(os.DirFS("/"), as, goMapped)
}

// memoryLimit is MemoryLimit reading the files under root, with the
// RLIMIT_AS given (0: none) and the bytes the Go runtime has mapped.
func memoryLimit(root fs.FS, rlimitAS uint64, goMapped int64) (int64, string) {
	var limit int64
	var source string
	consider := func(n int64, from string) {
		if n > 0 && (limit == 0 || n < limit) {
			limit, source = n, from
		}
	}
	if kb, ok := procField(root, "proc/meminfo", "MemTotal"); ok {
		consider(kb<<10, "physical memory (MemTotal)")
	}
	if kb, ok := procField(root, "proc/self/status", "VmSize"); ok && rlimitAS > 0 {
		// Half what is left: each thread the runtime starts later maps its
		// stack, and in a cgo-linked build a 64 MiB malloc arena.
		other := max(kb<<10-goMapped, 0)
		consider((int64(rlimitAS)-other)/2, fmt.Sprintf("half the address space RLIMIT_AS (%s) leaves beside the %s mapped outside the Go runtime",
			formatBytes(int64(rlimitAS)), formatBytes(other)))
	}
	n, from := cgroupLimit(root)
	consider(n, from)
	return limit, source
}

// cgroupLimit is the smallest memory limit set on the process's cgroup or
// its parents, v2 or v1; 0 when none is set.
func cgroupLimit(root fs.FS) (int64, string) {
	b, err := fs.ReadFile(root, "proc/self/cgroup")
	if err != nil {
		return 0, ""
	}
	var limit int64
	var source string
	walk := func(base, file, cg string) {
		for dir := path.Clean("/" + cg); ; dir = path.Dir(dir) {
			p := path.Join(base, dir, file)
			if v, err := fs.ReadFile(root, p); err == nil {
				n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
				if err == nil && n > 0 && n < 1<<62 && (limit == 0 || n < limit) { // "max" and v1's huge "unlimited" are none
					limit, source = n, "cgroup /"+p
				}
			}
			if dir == "/" {
				return
			}
		}
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			walk("sys/fs/cgroup", "memory.max", parts[2])
		case strings.Contains(","+parts[1]+",", ",memory,"):
			walk("sys/fs/cgroup/memory", "memory.limit_in_bytes", parts[2])
		}
	}
	return limit, source
}

// procField reads a "Key: 123 kB" line of a /proc file, in kB.
func procField(root fs.FS, file, key string) (int64, bool) {
	f, err := root.Open(file)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), key+":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		return n, err == nil
	}
	return 0, false
}
