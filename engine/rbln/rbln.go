// Package rbln is the NPU engine: it supervises one Python device worker
// per logical RBLN device (engine/rbln/worker), and gives each loaded model
// an [engine.Program] whose steps run in that worker, inside
// torch.rbln.explain(), on staging buffers in shared memory.
//
// The package owns the worker processes and everything about them:
// starting each by exec with its device's environment
// (RBLN_VISIBLE_DEVICES, TORCH_RBLN_DEPLOY=ON and
// TORCH_RBLN_DISABLE_FALLBACK=compile_error,unsupported_op), the typed
// control protocol over a socket inherited as a file descriptor, health
// pings with a stall deadline (a compile deadline while a worker builds a
// graph), restarts with backoff, stopping them in order, copying their
// output into the server log, the shared-memory (memfd) staging buffers,
// the workers' metrics, and the worker's Python source, which travels
// inside the binary. The Go process never touches the device.
//
// A worker that crashes or hangs fails its in-flight calls at once with an
// error wrapping [engine.ErrUnavailable], is restarted with backoff, and
// reloads its models; their programs report unhealthy until then. What to
// do meanwhile (wait, or serve from another engine) is the caller's choice.
//
// The package knows models, bucket shapes and the [engine] contract, and
// nothing of HTTP, batching or the server: its callers see an
// [engine.Engine] and its programs.
//
// The same package makes two engines, by [Options.Device]: "rbln", whose
// workers compute on an RBLN NPU and only there (a worker that sees no
// device refuses to load a model, rather than serve from the host under the
// rbln name), and "torch", whose workers compute on the host's CPU
// (development, CI, models the Go engine cannot run) and whose steps are
// unmeasured unless torch.rbln.explain is importable. The torch engine is
// how this package is tested without an NPU.
package rbln

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/models"
)

// The worker's Python source travels inside the binary, so that a server is
// one file plus a Python with torch.
//
//go:embed worker/stepserve_worker/*.py
var workerSource embed.FS

// errClosed is returned by Load after Close, and ends the calls in flight
// when the engine closes.
var errClosed = errors.New("rbln: engine is closed")

// The device kinds a worker computes on, for [Options.Device].
const (
	// DeviceRBLN: an RBLN NPU, and nothing else; the engine is "rbln".
	DeviceRBLN = "rbln"
	// DeviceCPU: the host's CPU; the engine is "torch".
	DeviceCPU = "cpu"
)

// visibleDevices is the runtime's device selection, which the pod's
// environment may set.
const visibleDevices = "RBLN_VISIBLE_DEVICES"

// Options configure the engine. Zero fields take the defaults noted.
type Options struct {
	// Device is where the workers compute: [DeviceRBLN] (the default) or
	// [DeviceCPU]. It names the engine: "rbln" or "torch".
	Device string
	// Python is the interpreter that has torch (and torch_rbln);
	// default /usr/bin/python3.
	Python string
	// Devices are the logical devices, one worker each, as
	// RBLN_VISIBLE_DEVICES values, each worker started with its own.
	// Default: one worker per device listed in the server's own
	// RBLN_VISIBLE_DEVICES (the pod's) where it is set, else ["0"]. The
	// torch engine takes none (see Workers), and leaves
	// RBLN_VISIBLE_DEVICES as the server has it.
	Devices []string
	// NPUsPerDevice, with Devices empty, groups the pod's visible NPUs into
	// RSD groups of this many (rbln.npus_per_device); 0 or 1: one NPU a
	// device. A device of several NPUs ("0,1") is one logical device: its
	// worker is started with RBLN_VISIBLE_DEVICES set to the group and
	// RBLN_NPUS_PER_DEVICE to its size, and compiles for all of them.
	NPUsPerDevice int
	// Workers is the torch engine's worker count, default 1: one worker,
	// device "cpu"; n > 1 workers are devices "cpu0" .. "cpu<n-1>", which
	// model.yaml's instances may name (devices: all loads a model on
	// every one), for more steps at once on a many-core host and for
	// tests of replicas. The rbln engine takes none: it has a worker per
	// device.
	Workers int
	// Env is extra environment for the workers (RBLN_DEVICE_MAP,
	// RBLN_NPUS_PER_DEVICE, ...). PYTHONPATH entries are appended to the
	// worker's own.
	Env map[string]string
	// Lanes is the number of staging sets of each program (double
	// buffering): while the worker steps one, the next batch is packed
	// into another. Default 2 on rbln, 1 on torch (whose worker computes
	// on the same host cores the packing would use).
	Lanes int
	// CompileCacheDir is passed to torch.compile as its cache_dir option
	// (rbln); the torch engine's inductor keeps its caches under it.
	CompileCacheDir string
	// TorchCompile is the torch engine's compiler (rbln.torch_compile):
	// "auto" (the default: inductor where the worker's torch has
	// torch.compile and inductor works on the host, else eager), "inductor"
	// or "off". The rbln engine always compiles with backend rbln.
	TorchCompile string
	// StrictWarmup (rbln.strict_warmup): a bucket whose step graph breaks
	// or fails to compile is refused, naming the bucket and the break's
	// line or the compiler's error, and on the rbln engine so is one the
	// step audit finds against the step structure; false serves such a
	// bucket (eagerly, or with its breaks), its signals counted.
	StrictWarmup bool
	// LogLevel is TORCH_RBLN_LOG_LEVEL (DEBUG, INFO, WARNING or ERROR, see
	// [LogLevel]); default "WARNING".
	LogLevel string

	StartTimeout      time.Duration // hello after exec; default 120s (torch imports slowly)
	PingInterval      time.Duration // default 1s
	StallTimeout      time.Duration // a ping unanswered this long kills the worker; default 10s
	RestartBackoff    time.Duration // first restart delay; default 100ms
	MaxRestartBackoff time.Duration // default 10s
	MemoryInterval    time.Duration // device memory poll; default 30s

	// CompileTimeout bounds one graph build (a load, a compile, a bucket's
	// first step), during which pings go unanswered; default 30m.
	CompileTimeout time.Duration
	// StopTimeout is how long a worker asked to shut down has before
	// SIGTERM, and after it before SIGKILL; default 5s.
	StopTimeout time.Duration

	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Engine is the rbln engine.
type Engine struct {
	opts      Options
	workerDir string
	metrics   *metrics

	mu      sync.Mutex
	workers []*worker
	// started is workers once all have started, for readers that must not
	// wait on mu while a start holds it (a metrics scrape).
	started atomic.Pointer[[]*worker]
	next    int // round-robin placement of models that name no device
	closed  bool
}

// New prepares the engine; workers start on the first Load.
func New(opts Options) (*Engine, error) {
	if opts.Python == "" {
		opts.Python = "/usr/bin/python3"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	devices, err := workerDevices(&opts)
	if err != nil {
		return nil, err
	}
	opts.Devices = devices
	name := engineName(opts.Device)
	opts.Logger = opts.Logger.With("engine", name)
	if opts.LogLevel == "" {
		opts.LogLevel = "WARNING"
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&opts.StartTimeout, 120*time.Second)
	def(&opts.PingInterval, time.Second)
	def(&opts.StallTimeout, 10*time.Second)
	if opts.Lanes <= 0 {
		opts.Lanes = 1
		if opts.Device == DeviceRBLN {
			opts.Lanes = 2
		}
	}
	def(&opts.CompileTimeout, 30*time.Minute)
	def(&opts.StopTimeout, 5*time.Second)
	def(&opts.RestartBackoff, 100*time.Millisecond)
	def(&opts.MaxRestartBackoff, 10*time.Second)
	def(&opts.MemoryInterval, 30*time.Second)
	reg := opts.Registerer
	if reg != nil {
		// Both engines export the worker metrics: each labels its own.
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"engine": name}, reg)
	}
	m, err := newMetrics(reg, opts.Devices)
	if err != nil {
		return nil, err
	}
	e := &Engine{opts: opts, metrics: m}
	if reg != nil {
		if err := reg.Register(newProgramCollector(e)); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// Name implements [engine.Engine]: "rbln" for workers on an RBLN device,
// "torch" for workers on the host CPU.
func (e *Engine) Name() string { return engineName(e.opts.Device) }

func engineName(device string) string {
	if device == DeviceCPU {
		return "torch"
	}
	return "rbln"
}

// start extracts the worker source and starts one worker per device, once.
func (e *Engine) start() error {
	if e.workers != nil {
		return nil
	}
	dir, err := os.MkdirTemp("", "stepserve-worker-")
	if err != nil {
		return fmt.Errorf("rbln: %w", err)
	}
	err = fs.WalkDir(workerSource, "worker", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := workerSource.ReadFile(path)
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, filepath.FromSlash(path[len("worker/"):]))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		return fmt.Errorf("rbln: extracting the worker: %w", err)
	}
	e.workerDir = dir
	for _, d := range e.opts.Devices {
		e.workers = append(e.workers, newWorker(e, d))
	}
	for _, w := range e.workers {
		<-w.started
	}
	ws := e.workers
	e.started.Store(&ws)
	return nil
}

// Load implements [engine.Engine]: the model goes to the devices its
// instances name (every device for all; the next device in turn when it
// names none), per_device programs on each, each with its staging buffers
// in shared memory; each worker builds it and moves its weights to its
// device. More than one replica make an [engine.Replicated] program.
func (e *Engine) Load(ctx context.Context, m *models.Model, buckets []bucketing.Shape) (engine.Program, error) {
	workers, err := e.workersFor(m)
	if err != nil {
		return nil, err
	}
	return loadReplicas(ctx, workers, m, buckets)
}

// workersFor starts the workers, once, and places m on them.
func (e *Engine) workersFor(m *models.Model) ([]*worker, error) {
	if q := m.Config.Quantization; q != "" && q != "none" {
		return nil, fmt.Errorf("rbln: model %s: quantization %s runs on the CPU engine only; the %s engine computes in device_dtype %s: remove quantization or set engine: cpu",
			m.Name, q, e.Name(), m.Config.DeviceDtype)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errClosed
	}
	if err := e.start(); err != nil {
		return nil, err
	}
	return e.place(m)
}

// KillWorker kills the worker of a device with SIGKILL, as a crash would;
// the supervisor restarts it. It exists for fault tests and operators'
// drills.
func (e *Engine) KillWorker(device string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, w := range e.workers {
		if w.device == device {
			w.kill()
		}
	}
}

// Close stops every worker and removes the extracted worker source.
func (e *Engine) Close() error {
	e.mu.Lock()
	e.closed = true
	workers := e.workers
	e.mu.Unlock()
	for _, w := range workers {
		w.close()
	}
	if e.workerDir != "" {
		os.RemoveAll(e.workerDir)
	}
	return nil
}
