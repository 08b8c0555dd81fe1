package rbln

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// killGroup SIGKILLs the worker and whatever it started: a worker is the
// leader of its own process group.
func killGroup(pid int) { syscall.Kill(-pid, syscall.SIGKILL) }

// spawn starts the process and completes the handshake. terminate ends
// the process (SIGTERM to its group, then SIGKILL after StopTimeout); call
// it once the process has exited, too, to release it.
func (w *worker) spawn() (c *conn, cmd *exec.Cmd, terminate func(), err error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("rbln: control socket: %w", err)
	}
	parent := os.NewFile(uintptr(fds[0]), "stepserve-control")
	child := os.NewFile(uintptr(fds[1]), "stepserve-worker-control")
	nc, err := net.FileConn(parent)
	parent.Close()
	if err != nil {
		child.Close()
		return nil, nil, nil, fmt.Errorf("rbln: control socket: %w", err)
	}

	// exec, never fork-and-continue: a process that used the device must
	// not be forked. The child's end of the socket is its fd 3. Its own
	// process group keeps a terminal's Ctrl-C (meant for the server, which
	// stops it in order) from reaching it.
	bell, err := newDoorbell()
	if err != nil {
		child.Close()
		nc.Close()
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	terminate = func() { cancel(); bell.close() }
	cmd = exec.CommandContext(ctx, w.e.opts.Python, "-m", "stepserve_worker", "--fd", "3", "--device", w.e.opts.Device,
		"--doorbell", bell.childArg(4))
	cmd.Dir = w.e.workerDir
	cmd.Env = w.env()
	cmd.ExtraFiles = append([]*os.File{child}, bell.files...)
	// stdout and stderr share one rate limit: a module that floods either
	// cannot flood the log.
	limit := newLineLimit(func(n int) { w.e.metrics.dropped(w.device, n) })
	cmd.Stdout = &lineLogger{name: w.what(""), logger: w.logger, tail: w.tail, level: slog.LevelInfo, limit: limit}
	cmd.Stderr = &lineLogger{name: w.what(""), logger: w.logger, tail: w.tail, level: slog.LevelWarn, limit: limit}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM); err != nil {
			return os.ErrProcessDone
		}
		return nil
	}
	cmd.WaitDelay = w.e.opts.StopTimeout
	err = cmd.Start()
	// The child has its copy now; ours must go, or a child that dies would
	// never be seen to close the socket.
	child.Close()
	bell.started()
	if err != nil {
		terminate()
		nc.Close()
		return nil, nil, nil, fmt.Errorf("rbln: starting worker %s: %w", w.e.opts.Python, err)
	}

	hi, err := w.greeting(nc)
	if err == nil {
		err = w.checkHello(hi)
	}
	if err != nil {
		killGroup(cmd.Process.Pid)
		cmd.Wait()
		terminate()
		nc.Close()
		return nil, nil, nil, fmt.Errorf("rbln worker for device %s failed to start: %v%s", w.device, err, w.tail.suffix())
	}
	late := func(kind string) {
		w.e.metrics.lateReply(w.device, kind)
		w.logger.Debug(w.what(" answered a request its caller had given up on"), "kind", kind)
	}
	if !hi.Doorbell {
		killGroup(cmd.Process.Pid)
		cmd.Wait()
		terminate()
		nc.Close()
		return nil, nil, nil, fmt.Errorf("rbln worker for device %s took no step doorbell%s", w.device, w.tail.suffix())
	}
	c = newConn(nc, late)
	c.bell = bell
	return c, cmd, terminate, nil
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
		// The worker's device is its own: the grouping the server's
		// environment may carry (the pod's RBLN_NPUS_PER_DEVICE or
		// RBLN_DEVICE_MAP, the older RBLN_DEVICES) would regroup it.
		// rbln.env, appended below, still sets any of them on purpose.
		env = slices.DeleteFunc(env, func(kv string) bool {
			k, _, _ := strings.Cut(kv, "=")
			return k == npusPerDeviceEnv || k == deviceMapEnv || k == legacyVisibleDevices
		})
		env = append(env, visibleDevices+"="+w.device)
		if g := groupSize(w.device); g > 1 {
			// An RSD group: its NPUs are one logical device, rbln:0, set
			// before its first device use; it compiles for all of them
			// (num_devices). A single NPU gets no grouping variable at
			// all (on Rebel100 the documentation says to leave them
			// unset: the card is its own RSD group).
			env = append(env, npusPerDeviceEnv+"="+strconv.Itoa(g), groupSizeEnv+"="+strconv.Itoa(g))
		}
	}
	env = append(env,
		"TORCH_RBLN_DEPLOY=ON",
		"TORCH_RBLN_DISABLE_FALLBACK=compile_error,unsupported_op",
		"TORCH_RBLN_LOG_LEVEL="+w.e.opts.LogLevel,
		"PYTHONUNBUFFERED=1",
	)
	if d := w.e.opts.CompileCacheDir; d != "" && w.e.opts.Device == DeviceCPU {
		// Inductor's caches (compiled graphs, kernels) under
		// rbln.compile_cache_dir, so that a restart compiles nothing it
		// compiled before; rbln.env, appended below, may still set it.
		env = append(env, "TORCHINDUCTOR_CACHE_DIR="+filepath.Join(d, "inductor"))
	}
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
