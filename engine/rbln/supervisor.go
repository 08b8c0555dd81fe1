// The supervisor of one device worker: it starts the process by exec, in
// a process group of its own, with the device's environment and the
// control socket as fd 3; judges its liveness (pings with a stall deadline,
// or the process and the compile deadline while it builds a graph); when
// it dies or hangs fails the calls in flight, restarts it with backoff and
// reloads its models; and stops it with a shutdown message, then SIGTERM,
// then SIGKILL.

package rbln

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stepserve/stepserve/engine"
)

// errWorkerDown is wrapped (with engine.ErrUnavailable) by calls to a worker
// that died, hung or is restarting.
var errWorkerDown = fmt.Errorf("%w: rbln worker is down", engine.ErrUnavailable)

// worker supervises one device worker process: it starts it by exec with
// the device's environment, talks to it over an inherited socket, pings it,
// and restarts it with backoff when it dies or hangs, reloading its models.
type worker struct {
	device string
	e      *Engine
	logger *slog.Logger

	mu       sync.Mutex
	conn     *conn // nil while down
	pid      int
	life     chan struct{}     // closed when the current process's life ends
	programs map[*program]bool // loaded here; reloaded after a restart
	lastErr  error             // why the worker last died or failed to start
	// killed says the last life ended by a SIGKILL or SIGTERM the server
	// did not send (an operator, the OOM killer): not a step's doing, so
	// the step that was running may run again elsewhere.
	killed  bool
	tail    *tail         // the process's last output lines, across restarts
	started chan struct{} // closed once the first start attempt ended
	once    sync.Once

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

func newWorker(e *Engine, device string) *worker {
	w := &worker{
		device:   device,
		e:        e,
		logger:   e.opts.Logger.With("device", device),
		programs: map[*program]bool{},
		tail:     &tail{max: tailLines},
		started:  make(chan struct{}),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	go w.supervise()
	return w
}

// exitGrace is how long a worker that closed its connection is given to
// exit, so that its exit status and last words, not the socket's error,
// say why it went: a worker stopping on SIGTERM closes its socket first
// and then unloads torch, which took over a second on a loaded machine.
const exitGrace = 3 * time.Second

// supervise starts the worker, waits for it to die, and restarts it with
// backoff, until stop.
func (w *worker) supervise() {
	defer close(w.done)
	backoff := w.e.opts.RestartBackoff
	started := func() { w.once.Do(func() { close(w.started) }) }
	defer started()
	for {
		start := time.Now()
		err := w.runOnce(started)
		started()
		select {
		case <-w.stop:
			return
		default:
		}
		w.logger.Error(w.what(" down; restarting"), "err", err, "backoff", backoff)
		w.e.metrics.restarted(w.device)
		if time.Since(start) > 30*time.Second {
			backoff = w.e.opts.RestartBackoff // it ran for a while: not a crash loop
		}
		select {
		case <-w.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, w.e.opts.MaxRestartBackoff)
	}
}

// maxReloadFailures is how many lives in a row may fail to reload a model
// at once. After that a model whose load the worker refuses stays
// unloaded (not ready) until it is loaded anew; one whose reload takes
// the worker down is tried again after a backoff that doubles each time,
// up to maxReloadBackoff, so that it cannot keep the device (and its
// neighbours) down, and comes back by itself once it can.
const maxReloadFailures = 3

// maxReloadBackoff bounds the wait between reloads of a model whose
// reloads keep taking its worker down.
const maxReloadBackoff = 5 * time.Minute

// reload puts p back on the worker's new life, after the backoff its past
// failures call for; it reports whether this life is still on (false:
// the worker went down again, and the next life retries).
func (w *worker) reload(ctx context.Context, p *program) bool {
	n := p.reloadFailures.Load()
	if n >= maxReloadFailures {
		// 16 restart backoffs, doubling with each failure past the third,
		// up to maxReloadBackoff.
		wait := max(w.e.opts.RestartBackoff, 10*time.Millisecond) * 16
		for i := maxReloadFailures; i < int(n) && wait < maxReloadBackoff; i++ {
			wait *= 2
		}
		wait = min(wait, maxReloadBackoff)
		w.logger.Warn("reloading model after restart: waiting out its backoff", "model", p.model.Name, "failures", n, "wait", wait)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
	err := p.reload(ctx)
	if err == nil {
		if n > 0 {
			w.logger.Info("model reloaded after restart", "model", p.model.Name, "after_failures", n)
		}
		w.e.metrics.reloaded(w.device, "ok")
		p.reloadFailures.Store(0)
		return true
	}
	n = p.reloadFailures.Add(1)
	w.e.metrics.reloaded(w.device, "failed")
	w.logger.Error("reloading model after restart failed", "model", p.model.Name, "err", err, "attempt", n)
	if n >= maxReloadFailures && !errors.Is(err, engine.ErrUnavailable) && ctx.Err() == nil {
		// The worker is up and refuses the model: it cannot load at all.
		w.logger.Error("giving up reloading model: the worker refuses it; load it again to retry", "model", p.model.Name, "attempts", n)
		w.mu.Lock()
		delete(w.programs, p)
		w.mu.Unlock()
	}
	return ctx.Err() == nil && !errors.Is(err, engine.ErrUnavailable)
}

// runOnce runs one life of the worker process and returns why it ended.
// ready is called once the worker is up and its models are reloaded.
func (w *worker) runOnce(ready func()) error {
	c, cmd, terminate, err := w.spawn()
	if err != nil {
		w.setDown(err)
		ready()
		return err
	}
	defer terminate()
	pid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	life := make(chan struct{})
	defer close(life)
	w.mu.Lock()
	w.conn, w.pid, w.life, w.killed = c, pid, life, false
	programs := make([]*program, 0, len(w.programs))
	for p := range w.programs {
		programs = append(programs, p)
	}
	w.mu.Unlock()
	w.e.metrics.up(w.device, true)
	w.logger.Info(w.what(" up"), "pid", pid)

	// Reload what the previous life had loaded, then serve again. This runs
	// beside the loop below, which must keep watching the process: calls
	// that fail wait for this life to end to say why. Its calls end with
	// this life.
	go func() {
		// Cancelled when this life ends, and only then: the reloads of
		// models in backoff outlive this goroutine.
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			<-life
			cancel()
		}()
		// Models in backoff (their reloads took the worker down before)
		// wait on their own, after the others are back.
		var later []*program
		for _, p := range programs {
			if p.reloadFailures.Load() >= maxReloadFailures {
				later = append(later, p)
				continue
			}
			if !w.reload(ctx, p) {
				return // this life is over
			}
		}
		w.pollMemory()
		for _, p := range later {
			go w.reload(ctx, p)
		}
	}()
	ready()

	ticks := time.NewTicker(w.e.opts.PingInterval)
	defer ticks.Stop()
	memory := time.NewTicker(w.e.opts.MemoryInterval)
	defer memory.Stop()
	var cause error
	hasExited := false
	exitCause := func(err error) error {
		hasExited = true
		w.mu.Lock()
		w.killed = killedFromOutside(err)
		w.mu.Unlock()
		return fmt.Errorf("rbln worker for device %s exited (%v)%s", w.device, err, w.tail.suffix())
	}
loop:
	for {
		select {
		case err := <-exited:
			cause = exitCause(err)
			break loop
		case <-c.dead:
			// The socket broke, or a step stalled. If the process is
			// exiting, its status and last words say more than the
			// connection's error does.
			w.lost(c)
			grace := time.Second // a stalled step: the process is likely hung
			if errors.Is(c.err, errSocketClosed) {
				grace = exitGrace
			}
			select {
			case err := <-exited:
				cause = exitCause(err)
			case <-time.After(grace):
				cause = c.err
			}
			break loop
		case <-ticks.C:
			if err := c.health().verdict(time.Now(), w.e.opts.StallTimeout, w.e.opts.CompileTimeout); err != nil {
				cause = fmt.Errorf("rbln worker for device %s killed: %v", w.device, err)
				break loop
			}
			c.ping()
		case <-memory.C:
			go w.pollMemory() // not here: a call to a dying worker waits for this loop
		case <-w.stop:
			cause = errClosed
			break loop
		}
	}
	// Whatever ended this life: the process goes, every call in flight
	// fails at once, and the programs stop taking steps.
	w.setDown(cause)
	switch {
	case hasExited:
	case errors.Is(cause, errClosed):
		// Asked to exit, the worker finishes its current request; one that
		// takes too long is ended by SIGTERM, and StopTimeout after that by
		// SIGKILL (exec's WaitDelay).
		c.notify(&shutdownRequest{})
		select {
		case err := <-exited:
			hasExited = true
			w.logger.Info(w.what(" stopped"), "pid", pid, "exit", exitStatus(err))
		case <-time.After(w.e.opts.StopTimeout):
			w.logger.Warn(w.what(" did not stop when asked; terminating it"), "pid", pid, "after", w.e.opts.StopTimeout)
			terminate()
		}
	default:
		// Hung, or broke the protocol: nothing it would do on request
		// can be trusted.
		killGroup(pid)
	}
	c.close(cause)
	if !hasExited {
		select {
		case <-exited:
		case <-time.After(2*w.e.opts.StopTimeout + time.Second):
		}
	}
	return cause
}

// killedFromOutside reports whether a process's exit (cmd.Wait's error)
// was by SIGKILL or SIGTERM. The server sends those only after it has
// decided the worker is done for (and then the exit is not read here), so
// they came from elsewhere: an operator, the OOM killer.
func killedFromOutside(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && (ws.Signal() == syscall.SIGKILL || ws.Signal() == syscall.SIGTERM)
}

// replayable is err, a step's failure, as the caller should see it: a
// step lost when its worker went down (engine.ErrStepLost) is run again
// elsewhere only when the worker was killed from outside; then the step
// was not its cause. It waits (briefly) for the supervisor to learn how
// the worker died.
func (w *worker) replayable(err error) error {
	if !errors.Is(err, engine.ErrStepLost) {
		return err
	}
	w.awaitLife()
	w.mu.Lock()
	killed := w.killed
	w.mu.Unlock()
	if !killed {
		return err
	}
	return fmt.Errorf("%w (%s)", errWorkerDown, err.Error())
}

// awaitLife waits, up to 2 seconds, for the worker's current life to end:
// while the supervisor ends a life, its cause (the exit status, the last
// output) is worth a moment's wait.
func (w *worker) awaitLife() {
	w.mu.Lock()
	life := w.life
	w.mu.Unlock()
	if life == nil {
		return
	}
	select {
	case <-life:
	case <-time.After(2 * time.Second):
	}
}

// exitStatus words a process's exit for the log.
func exitStatus(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}

// what is a log message about this worker: "rbln worker" or "torch
// worker" (the engine's name), then s.
func (w *worker) what(s string) string { return w.e.Name() + " worker" + s }

// lost takes the worker down at once when c, its current connection, has
// failed: its programs take no more steps from now, not from when the
// supervisor is through with the process.
func (w *worker) lost(c *conn) {
	w.mu.Lock()
	current := w.conn == c
	w.mu.Unlock()
	if current {
		w.setDown(c.errOr(errWorkerDown))
	}
}

func (w *worker) setDown(err error) {
	w.mu.Lock()
	w.conn = nil
	if err != nil {
		w.lastErr = err
	}
	programs := make([]*program, 0, len(w.programs))
	for p := range w.programs {
		programs = append(programs, p)
	}
	w.mu.Unlock()
	for _, p := range programs {
		p.healthy.Store(false)
	}
	w.e.metrics.up(w.device, false)
}

// call sends a request to the worker, waits for its result, and decodes
// the result's fields into reply unless reply is nil. A worker that is down
// or goes down meanwhile fails the call with an error wrapping
// [engine.ErrUnavailable] that says why.
func (w *worker) call(ctx context.Context, req request, reply any) error {
	c, err := w.current()
	if err != nil {
		return err
	}
	m, err := c.call(ctx, req)
	err = w.replayable(err)
	if errors.Is(err, engine.ErrUnavailable) {
		// Give the supervisor a moment to learn why (exit status, stderr),
		// so that the caller's error says it.
		w.awaitLife()
		w.mu.Lock()
		why := w.lastErr
		w.mu.Unlock()
		if why != nil && why.Error() != err.Error() {
			err = fmt.Errorf("%w (%s)", err, why)
		}
	}
	if err != nil {
		return err
	}
	if !m.OK {
		if msg, ok := strings.CutPrefix(m.Error, "UserModelError: "); ok {
			// The model's own code or files: the worker's message names
			// them; the worker's device and the request kind would only
			// bury it.
			return &engine.ModelError{Msg: msg}
		}
		return fmt.Errorf("rbln worker for device %s: %s %s", w.device, req.kind(), m.Error)
	}
	if reply == nil {
		return nil
	}
	return m.decode(req.kind()+" result", reply)
}

// current is the worker's connection, or, while it is down, an error that
// wraps [engine.ErrUnavailable] and why it went down.
func (w *worker) current() (*conn, error) {
	w.mu.Lock()
	c := w.conn
	w.mu.Unlock()
	if c != nil {
		return c, nil // the step path: one look
	}
	w.awaitLife() // down: why is worth a moment's wait
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.conn != nil:
		return w.conn, nil
	case w.lastErr == nil:
		return nil, errWorkerDown
	case errors.Is(w.lastErr, engine.ErrUnavailable):
		return nil, w.lastErr
	default:
		return nil, fmt.Errorf("%w: %w", errWorkerDown, w.lastErr)
	}
}

// step runs a step over the current life's doorbell.
func (w *worker) step(ctx context.Context, slot uint32, bucket, lane int) (engine.Explain, int64, error) {
	c, err := w.current()
	if err != nil {
		return engine.Explain{}, 0, err
	}
	x, body, err := c.bell.step(ctx, c, slot, bucket, lane, w.e.opts.StallTimeout, w.e.opts.CompileTimeout)
	if errors.Is(err, engine.ErrUnavailable) {
		w.lost(c)
		err = w.replayable(err)
	}
	if err != nil && !errors.Is(err, engine.ErrUnavailable) && ctx.Err() == nil {
		err = fmt.Errorf("rbln worker for device %s: step %w", w.device, err)
	}
	return x, body, err
}

// pollMemory exports the device memory per chiplet, where the worker can
// read it.
func (w *worker) pollMemory() {
	ctx, cancel := context.WithTimeout(context.Background(), w.e.opts.StallTimeout)
	defer cancel()
	var r memoryReply
	if w.call(ctx, &memoryRequest{}, &r) != nil {
		return
	}
	for _, c := range r.Chiplets {
		w.e.metrics.memory(w.device, c.NPU, c.Chiplet, c.Kind, c.Bytes)
	}
	if r.AgeSeconds != nil && *r.AgeSeconds >= 0 && len(r.Chiplets) > 0 { // a worker with device memory
		w.e.metrics.memoryAge.WithLabelValues(w.device).Set(*r.AgeSeconds)
	}
}

// kill ends the current process (SIGKILL); the supervisor restarts it.
func (w *worker) kill() {
	w.mu.Lock()
	pid := w.pid
	w.mu.Unlock()
	if pid > 0 {
		// The whole group: compiler processes the worker started go with
		// it. Safe while the leader is not reaped (its pid, and so the
		// group's id, cannot be reused before then).
		killGroup(pid)
	}
}

// close stops the worker and its supervision; a second call only waits.
func (w *worker) close() {
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
}
