// The supervisor of one device worker: it starts the process by exec with
// the device's environment and the control socket as fd 3, pings it with a
// stall deadline, and when it dies or hangs fails the calls in flight,
// restarts it with backoff and reloads its models.

package rbln

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
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
	lastErr  string            // why the worker last died or failed to start
	tail     *tail             // the process's last output lines, across restarts
	started  chan struct{}     // closed once the first start attempt ended
	once     sync.Once

	stop chan struct{}
	done chan struct{}
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
		w.logger.Error("rbln worker down; restarting", "err", err, "backoff", backoff)
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

// runOnce runs one life of the worker process and returns why it ended.
// ready is called once the worker is up and its models are reloaded.
func (w *worker) runOnce(ready func()) error {
	c, cmd, err := w.spawn()
	if err != nil {
		w.setDown(err)
		ready()
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	life := make(chan struct{})
	defer close(life)
	w.mu.Lock()
	w.conn, w.pid, w.life = c, cmd.Process.Pid, life
	programs := make([]*program, 0, len(w.programs))
	for p := range w.programs {
		programs = append(programs, p)
	}
	w.mu.Unlock()
	w.e.metrics.up(w.device, true)
	w.logger.Info("rbln worker up", "pid", cmd.Process.Pid)

	// Reload what the previous life had loaded, then serve again. This runs
	// beside the loop below, which must keep watching the process: calls
	// that fail wait for this life to end to say why.
	go func() {
		for _, p := range programs {
			if err := p.reload(context.Background()); err != nil {
				w.logger.Error("reloading model after restart failed", "model", p.model.Name, "err", err)
			}
		}
		w.pollMemory()
	}()
	ready()

	pings := time.NewTicker(w.e.opts.PingInterval)
	defer pings.Stop()
	memory := time.NewTicker(w.e.opts.MemoryInterval)
	defer memory.Stop()
	var cause error
	hasExited := false
	exitCause := func(err error) error {
		hasExited = true
		return fmt.Errorf("rbln worker for device %s exited (%v)%s", w.device, err, w.tail.suffix())
	}
loop:
	for {
		select {
		case err := <-exited:
			cause = exitCause(err)
			break loop
		case <-c.dead:
			// The socket broke: if the process is exiting, its status and
			// last words say more than the socket does.
			select {
			case err := <-exited:
				cause = exitCause(err)
			case <-time.After(time.Second):
				cause = c.err
			}
			break loop
		case <-pings.C:
			ctx, cancel := context.WithTimeout(context.Background(), w.e.opts.StallTimeout)
			_, err := c.call(ctx, &pingRequest{})
			cancel()
			if err != nil {
				cause = fmt.Errorf("rbln worker for device %s stopped answering pings within %v: %v", w.device, w.e.opts.StallTimeout, err)
				break loop
			}
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
	c.close(cause)
	cmd.Process.Kill()
	if !hasExited {
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
		}
	}
	return cause
}

// spawn starts the process and completes the handshake.
func (w *worker) spawn() (*conn, *exec.Cmd, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("rbln: control socket: %w", err)
	}
	parent := os.NewFile(uintptr(fds[0]), "stepserve-control")
	child := os.NewFile(uintptr(fds[1]), "stepserve-worker-control")
	nc, err := net.FileConn(parent)
	parent.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("rbln: control socket: %w", err)
	}

	// exec, never fork-and-continue: a process that used the device must
	// not be forked. The child's end of the socket is its fd 3.
	cmd := exec.Command(w.e.opts.Python, "-m", "stepserve_worker", "--fd", "3", "--device", w.e.opts.Device)
	cmd.Dir = w.e.workerDir
	cmd.Env = w.env()
	cmd.ExtraFiles = []*os.File{child}
	cmd.Stdout = &lineLogger{logger: w.logger, tail: w.tail, level: slog.LevelInfo}
	cmd.Stderr = &lineLogger{logger: w.logger, tail: w.tail, level: slog.LevelWarn}
	cmd.WaitDelay = 2 * time.Second
	err = cmd.Start()
	// The child has its copy now; ours must go, or a child that dies would
	// never be seen to close the socket.
	child.Close()
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("rbln: starting worker %s: %w", w.e.opts.Python, err)
	}

	hi, err := w.greeting(nc)
	if err == nil {
		err = w.checkHello(hi)
	}
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		nc.Close()
		return nil, nil, fmt.Errorf("rbln worker for device %s failed to start: %v%s", w.device, err, w.tail.suffix())
	}
	return newConn(nc), cmd, nil
}

// greeting reads the worker's hello, which must come within the start
// timeout and speak this protocol version.
func (w *worker) greeting(nc net.Conn) (*hello, error) {
	nc.SetReadDeadline(time.Now().Add(w.e.opts.StartTimeout))
	defer nc.SetReadDeadline(time.Time{})
	m, err := readFrame(nc)
	if err != nil {
		return nil, err
	}
	var hi hello
	if err := m.decode("hello", &hi); err != nil {
		return nil, err
	}
	if m.Type != "hello" || hi.Protocol != protocolVersion {
		return nil, fmt.Errorf("%w: worker greeted with %q protocol %d; want hello protocol %d", ErrProtocol, m.Type, hi.Protocol, protocolVersion)
	}
	return &hi, nil
}

// env is the worker's environment: the server's, the device selection and
// torch-rbln settings the design requires, then the configured extras.
func (w *worker) env() []string {
	env := os.Environ()
	if w.e.opts.Device == DeviceRBLN {
		env = append(env, visibleDevices+"="+w.device)
	}
	env = append(env,
		"TORCH_RBLN_DEPLOY=ON",
		"TORCH_RBLN_DISABLE_FALLBACK=compile_error,unsupported_op",
		"TORCH_RBLN_LOG_LEVEL="+w.e.opts.LogLevel,
		"PYTHONUNBUFFERED=1",
	)
	pythonPath := w.e.workerDir
	for k, v := range w.e.opts.Env {
		if k == "PYTHONPATH" {
			pythonPath += string(os.PathListSeparator) + v
			continue
		}
		env = append(env, k+"="+v)
	}
	return append(env, "PYTHONPATH="+pythonPath)
}

func (w *worker) setDown(err error) {
	w.mu.Lock()
	w.conn = nil
	if err != nil {
		w.lastErr = err.Error()
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
	w.mu.Lock()
	c, why := w.conn, w.lastErr
	w.mu.Unlock()
	if c == nil {
		if why != "" {
			return fmt.Errorf("%w: %s", errWorkerDown, why)
		}
		return errWorkerDown
	}
	m, err := c.call(ctx, req)
	if errors.Is(err, engine.ErrUnavailable) {
		// Give the supervisor a moment to learn why (exit status, stderr),
		// so that the caller's error says it.
		w.mu.Lock()
		life := w.life
		w.mu.Unlock()
		select {
		case <-life:
		case <-time.After(2 * time.Second):
		}
		w.mu.Lock()
		why := w.lastErr
		w.mu.Unlock()
		if why != "" {
			err = fmt.Errorf("%w (%s)", err, why)
		}
	}
	if err != nil {
		return err
	}
	if !m.OK {
		return fmt.Errorf("rbln worker for device %s: %s %s", w.device, req.kind(), m.Error)
	}
	if reply == nil {
		return nil
	}
	return m.decode(req.kind()+" result", reply)
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
}

// kill ends the current process (SIGKILL); the supervisor restarts it.
func (w *worker) kill() {
	w.mu.Lock()
	pid := w.pid
	w.mu.Unlock()
	if pid > 0 {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

func (w *worker) close() {
	close(w.stop)
	<-w.done
}
