// The binary step path. A step is not a control message: the supervisor
// writes the program's slot and the bucket into a control block it shares
// with the worker (a memfd both map), publishes the request's number, and
// rings an eventfd; the worker's device thread, asleep on that eventfd,
// runs the step on that same thread and writes a fixed binary report into
// the block (counters as integers, -1 unknown; text only for a step that is
// not clean), publishes the number it answered, and rings back. A waiting
// caller spins on the block for a short while before it sleeps on the
// eventfd, so that a short step on an idle machine costs no wake-up.
//
// The layout is worker/stepserve_worker/doorbell.py's; the two change
// together, with the protocol version.

package rbln

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/stepserve/stepserve/engine"
)

const (
	blockSize  = 64 << 10
	textOffset = 256
	maxText    = blockSize - textOffset

	offReqSeq = 0
	offSlot   = 8
	offBucket = 12
	offLane   = 16
	// offBuilding is the number of the step the worker builds a graph in
	// (a recompile), written by the worker when it starts building.
	offBuilding = 24
	offDoneSeq  = 64
	offStatus   = 72
	offFlags    = 76
	offCounts   = 80  // 11 signal counters, then 5 of the dispatch detail
	offBodyNS   = 208 // offCounts + 16*8
	offTextLen  = 216
)

// The report's status and flags.
const (
	statusDone   = 0
	statusFailed = 1

	flagMeasured = 1
	flagClean    = 2
	flagExtras   = 4 // the text holds the report's other fields, as JSON
)

// spinFor is how long a caller polls the block before it sleeps on the
// eventfd. A small model's step (and its report) takes tens of µs, and a
// sleeping caller's wake-up costs tens of µs again (more on a virtual
// machine); the poll yields the core every few looks, so that the
// worker's threads are not kept from it.
const spinFor = 50 * time.Microsecond

// A caller whose last step's body took from spinFor to maxNap sleeps for
// that body less wakeEarly, then polls the block for up to twice
// wakeEarly: the step's answer is seen as it comes, and the caller's core
// is free for the worker's threads through most of the step.
const (
	wakeEarly = 150 * time.Microsecond
	maxNap    = 50 * time.Millisecond
)

// napLongSteps turns the nap-then-poll on; BenchmarkWorkerDecodeStep
// turns it off to measure it against waiting on the eventfd alone.
var napLongSteps = true

// canSpin: the worker writes its report with plain stores, the done number
// last, and only a machine that keeps stores in order (x86's TSO) lets the
// block be read once the number is seen without the eventfd's barrier.

var canSpin = runtime.GOARCH == "amd64" || runtime.GOARCH == "386"

// doorbell is the supervisor's end of one worker life's step path.
type doorbell struct {
	block []byte
	// files are the worker's ends: the block's memfd, ring and done; they
	// go to the child as fds 4, 5 and 6 and are closed here once it runs.
	files      []*os.File
	ring, done int // eventfds: ours to ring, the worker's to ring back
	abort      int // eventfd rung once the life ends, to wake a waiter
	// abortMu guards abort between kill, which any goroutine may call
	// (the connection's reader when the socket closes), and close: kill
	// must not ring a descriptor close has closed (its number may be
	// another file's by then).
	abortMu sync.Mutex

	mu  sync.Mutex // one step at a time: the block holds one request
	seq uint64
	// lastBody is the time the last step spent in its body. A step whose
	// body outlasts the poll is polled for only near its expected end
	// (see wakeEarly): polling through it could not catch it sooner, and
	// on a machine whose cores share execution units (SMT) it slows the
	// worker's compute.
	lastBody time.Duration
	dead     atomic.Bool
	// waiting is the number of the step rung and not yet answered (0:
	// none), rung when it was rung (unix ns): the liveness rule asks
	// whether the worker builds a graph in it.
	waiting atomic.Uint64
	rung    atomic.Int64
	extra   explainExtras // the last extras decoded, with their text
	text    []byte
}

// explainExtras are the fields of [engine.Explain] a non-clean step's
// report carries as text.
type explainExtras struct {
	Reasons            []string         `json:"reasons"`
	CPUFallbackByOp    map[string]int64 `json:"cpu_fallback_by_op"`
	RecompileByOp      map[string]int64 `json:"recompile_by_op"`
	HostBounceBySite   map[string]int64 `json:"host_bounce_by_site"`
	CPUFallbackReasons map[string]int64 `json:"cpu_fallback_reasons"`
	Notes              []string         `json:"notes"`
	Report             string           `json:"report"`
	// Truncated names what the worker cut to fit the text area
	// (doorbell.py's extras): the counters are whole, the detail is not.
	Truncated []string `json:"truncated"`
}

func newDoorbell() (_ *doorbell, err error) {
	d := &doorbell{ring: -1, done: -1, abort: -1}
	defer func() {
		if err != nil {
			d.close()
			err = fmt.Errorf("rbln: step doorbell: %w", err)
		}
	}()
	fd, err := unix.MemfdCreate("stepserve-doorbell", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	block := os.NewFile(uintptr(fd), "memfd:stepserve-doorbell")
	d.files = append(d.files, block)
	if err := block.Truncate(blockSize); err != nil {
		return nil, err
	}
	if d.block, err = unix.Mmap(fd, 0, blockSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, err
	}
	// The worker blocks reading ring; done is read here only once poll
	// says it is ready, and never blocks.
	if d.ring, err = unix.Eventfd(0, unix.EFD_CLOEXEC); err != nil {
		return nil, err
	}
	if d.done, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return nil, err
	}
	if d.abort, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return nil, err
	}
	// The child's copies: exec dups these to its fds 4, 5, 6.
	for _, p := range []struct {
		fd   int
		name string
	}{{d.ring, "stepserve-ring"}, {d.done, "stepserve-done"}} {
		dup, err := unix.FcntlInt(uintptr(p.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		d.files = append(d.files, os.NewFile(uintptr(dup), p.name))
	}
	return d, nil
}

// childArg is the worker's --doorbell argument for ExtraFiles starting at
// fd first.
func (d *doorbell) childArg(first int) string {
	return fmt.Sprintf("%d,%d,%d", first, first+1, first+2)
}

// started closes the worker's ends here, once the child has its own.
func (d *doorbell) started() {
	for _, f := range d.files {
		f.Close()
	}
	d.files = nil
}

func (d *doorbell) word(off int) *uint64 { return (*uint64)(unsafe.Pointer(&d.block[off])) }

// building reports whether the worker builds a graph in the step it was
// rung for (a recompile), and since when that step was rung.
func (d *doorbell) building() (bool, time.Time) {
	seq := d.waiting.Load()
	if seq == 0 || d.block == nil || atomic.LoadUint64(d.word(offBuilding)) != seq {
		return false, time.Time{}
	}
	return true, time.Unix(0, d.rung.Load())
}

// step runs one step of the program in slot on the worker and returns its
// report. stall bounds the wait; past it the connection is failed (the
// supervisor then kills the worker), as for a step that hangs; but a step
// the worker says it builds a graph in (a recompile: it writes the step's
// number at offBuilding) is bounded by compile instead, as a message that
// builds one is. A caller
// whose ctx ends first gets ctx's error; the step's report is then read
// and dropped by a goroutine that holds the block until it comes.
func (d *doorbell) step(ctx context.Context, c *conn, slot uint32, bucket, lane int, stall, compile time.Duration) (x engine.Explain, bodyNS int64, err error) {
	d.mu.Lock()
	if d.dead.Load() {
		d.mu.Unlock()
		return x, 0, c.errOr(errWorkerDown)
	}
	d.seq++
	seq := d.seq
	binary.LittleEndian.PutUint32(d.block[offSlot:], slot)
	binary.LittleEndian.PutUint32(d.block[offBucket:], uint32(bucket))
	binary.LittleEndian.PutUint32(d.block[offLane:], uint32(lane))
	d.rung.Store(time.Now().UnixNano())
	d.waiting.Store(seq)
	defer d.waiting.CompareAndSwap(seq, 0)
	atomic.StoreUint64(d.word(offReqSeq), seq) // after the fields: the worker reads them once it sees it
	if err := ring(d.ring); err != nil {
		d.mu.Unlock()
		c.close(fmt.Errorf("%w: ringing the step doorbell: %v", errWorkerDown, err))
		return x, 0, c.err
	}
	if err := d.wait(ctx, c, seq, stall, compile); err != nil {
		if errors.Is(err, engine.ErrUnavailable) {
			// Rung, and the worker went down (or stalled) under it.
			err = fmt.Errorf("%w: %w", engine.ErrStepLost, err)
		}
		if ctx.Err() != nil && !d.dead.Load() {
			// Nobody reads this step's answer, but the next step must not
			// take the block before it comes.
			go func() {
				d.wait(context.Background(), c, seq, stall, compile)
				if c.late != nil {
					c.late("step")
				}
				d.mu.Unlock()
			}()
			return x, 0, err
		}
		d.mu.Unlock()
		return x, 0, err
	}
	x, bodyNS, err = d.report()
	d.lastBody = time.Duration(bodyNS)
	d.mu.Unlock()
	return x, bodyNS, err
}

// wait returns once the worker has answered step seq, the connection
// fails, the stall deadline passes, or ctx ends.
func (d *doorbell) wait(ctx context.Context, c *conn, seq uint64, stall, compile time.Duration) error {
	doneSeq := d.word(offDoneSeq)
	start := time.Now()
	fds := []unix.PollFd{{Fd: int32(d.done), Events: unix.POLLIN}, {Fd: int32(d.abort), Events: unix.POLLIN}}
	var buf [8]byte
	spin := spinFor
	if canSpin && napLongSteps && d.lastBody > wakeEarly && d.lastBody < maxNap {
		// A longer step (a language model's decode: milliseconds): sleep
		// until shortly before the last one's body would end, then look
		// as for a short step, so that the answer is not also waiting on
		// this thread's wake-up (tens of µs, twice that on a virtual
		// machine, each step).
		// The worker rings the eventfd after every answer, also one this
		// thread saw by looking: empty it first, or the nap would end at
		// once on the last step's ring.
		unix.Read(d.done, buf[:])
		if atomic.LoadUint64(doneSeq) == seq {
			return nil
		}
		ts := unix.NsecToTimespec(int64(d.lastBody - wakeEarly))
		if _, err := unix.Ppoll(fds, &ts, nil); err == nil && fds[0].Revents&unix.POLLIN != 0 {
			unix.Read(d.done, buf[:])
		}
		spin = 2 * wakeEarly
	}
	if canSpin && (d.lastBody < spinFor || spin > spinFor) {
		deadline := time.Now().Add(spin)
		for i := 0; ; i++ {
			if atomic.LoadUint64(doneSeq) == seq {
				return nil
			}
			if i%64 == 63 {
				if time.Now().After(deadline) {
					break
				}
				unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			}
		}
	}
	for {
		if atomic.LoadUint64(doneSeq) == seq {
			return nil
		}
		if d.dead.Load() {
			return c.errOr(errWorkerDown)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if ran := time.Since(start); ran > stall {
			building := atomic.LoadUint64(d.word(offBuilding)) == seq
			if !building || ran > compile {
				err := fmt.Errorf("%w: a step got no answer in %v (stall timeout)", errWorkerDown, stall)
				if building {
					err = fmt.Errorf("%w: a step that builds a graph (a recompile) ran %v, past the compile deadline (rbln.compile_timeout %v)",
						errWorkerDown, ran.Round(time.Millisecond), compile)
				}
				c.close(err)
				return c.errOr(err)
			}
		}
		// Short sleeps: ctx is looked at between them.
		_, err := unix.Poll(fds, 50)
		if err != nil && !errors.Is(err, unix.EINTR) {
			c.close(fmt.Errorf("%w: waiting on the step doorbell: %v", errWorkerDown, err))
			return c.err
		}
		if fds[0].Revents&unix.POLLIN != 0 {
			unix.Read(d.done, buf[:]) // resets the count; the number says which step
		}
	}
}

// report reads the block's report into an Explain.
func (d *doorbell) report() (engine.Explain, int64, error) {
	b := d.block
	status := int32(binary.LittleEndian.Uint32(b[offStatus:]))
	flags := binary.LittleEndian.Uint32(b[offFlags:])
	n := min(int(binary.LittleEndian.Uint32(b[offTextLen:])), maxText)
	text := b[textOffset : textOffset+n]
	if status == statusFailed {
		return engine.Explain{}, 0, errors.New(string(text))
	}
	if status != statusDone {
		return engine.Explain{}, 0, fmt.Errorf("%w: step report with status %d", ErrProtocol, status)
	}
	x := engine.Explain{Measured: flags&flagMeasured != 0, Clean: flags&flagClean != 0}
	counts := [...]*engine.Count{&x.CPUFallbacks, &x.Recompiles, &x.HostBounces, &x.HostBounceBytes, &x.H2D, &x.D2H,
		&x.WallNS, &x.H2DNS, &x.D2HNS, &x.V2V, &x.V2VSlow}
	for i, c := range counts {
		*c = max(engine.Count(int64(binary.LittleEndian.Uint64(b[offCounts+8*i:]))), engine.Unknown)
	}
	var dp engine.Dispatch
	known := false
	for i, c := range [...]*engine.Count{&dp.Total, &dp.WarmHits, &dp.CPUFallbackNS, &dp.RuntimeNS, &dp.V2VNS} {
		*c = max(engine.Count(int64(binary.LittleEndian.Uint64(b[offCounts+8*(len(counts)+i):]))), engine.Unknown)
		known = known || c.Known()
	}
	if known {
		x.Dispatch = &dp
	}
	if flags&flagExtras != 0 {
		// The same text as the last step's (an engine without explain says
		// the same every step) is not decoded again.
		if !slices.Equal(text, d.text) {
			var e explainExtras
			if err := json.Unmarshal(text, &e); err != nil {
				// The step ran and its counters are whole: a report whose
				// detail cannot be read does not fail it.
				e = explainExtras{Notes: []string{fmt.Sprintf("the step's report detail (%d bytes) could not be read: %v", len(text), err)}}
			}
			if len(e.Truncated) > 0 {
				e.Notes = append(e.Notes, "the worker cut the step's report to fit the doorbell's text area: "+strings.Join(e.Truncated, ", ")+" shortened or left out")
			}
			d.extra, d.text = e, append(d.text[:0], text...)
		}
		e := &d.extra
		// Clipped: a caller that appends a reason gets its own array.
		x.Reasons, x.Notes = slices.Clip(e.Reasons), slices.Clip(e.Notes)
		x.CPUFallbackByOp, x.RecompileByOp, x.HostBounceBySite = e.CPUFallbackByOp, e.RecompileByOp, e.HostBounceBySite
		x.CPUFallbackReasons, x.Report = e.CPUFallbackReasons, e.Report
	}
	return x, int64(binary.LittleEndian.Uint64(b[offBodyNS:])), nil
}

// kill wakes a waiter for good: the life has ended.
func (d *doorbell) kill() {
	if d.dead.Swap(true) {
		return
	}
	d.abortMu.Lock()
	defer d.abortMu.Unlock()
	if d.abort >= 0 {
		ring(d.abort)
	}
}

// close releases the block and the eventfds; the life must be over (kill
// first) and the worker gone.
func (d *doorbell) close() {
	d.kill()
	d.mu.Lock() // a waiter, woken by kill, lets go first
	defer d.mu.Unlock()
	d.started()
	if d.block != nil {
		unix.Munmap(d.block)
		d.block = nil
	}
	for _, fd := range []*int{&d.ring, &d.done} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
	d.abortMu.Lock()
	defer d.abortMu.Unlock()
	if d.abort >= 0 {
		unix.Close(d.abort)
		d.abort = -1
	}
}

// ring adds one to an eventfd's count.
func ring(fd int) error {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, err := unix.Write(fd, one[:])
	return err
}
