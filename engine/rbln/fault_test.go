package rbln

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/steps"
)

func waitHealthy(t *testing.T, p engine.Program, within time.Duration) time.Duration {
	start := time.Now()
	for !p.Healthy() {
		if time.Since(start) > within {
			t.Fatalf("program not healthy again within %v", within)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// TestWorkerKilledUnderLoad kills the worker with SIGKILL while steps run:
// every step returns (done or unavailable), none hangs, and the worker comes
// back with its model reloaded.
func TestWorkerKilledUnderLoad(t *testing.T) {
	requireTorch(t)
	e, _ := newEngine(t, Options{})
	m := loadDigits(t)
	grid, _ := bucketing.NewGrid(m.Config.Buckets.Batch, nil)
	prog, err := e.Load(context.Background(), m, grid.Shapes())
	require.NoError(t, err)
	r, err := steps.New(steps.Options{Model: m, Program: prog, Grid: grid})
	require.NoError(t, err)
	_, err = r.Warmup(context.Background())
	require.NoError(t, err)

	var ok, unavailable, other int
	var mu sync.Mutex
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				err := r.Run(ctx, []*steps.Request{digitsRequest(3, 1)})
				cancel()
				if errors.Is(err, engine.ErrUnavailable) {
					time.Sleep(5 * time.Millisecond) // as a client would back off
				}
				mu.Lock()
				switch {
				case err == nil:
					ok++
				case errors.Is(err, engine.ErrUnavailable):
					unavailable++
				default:
					other++
					t.Errorf("step error: %v", err)
				}
				mu.Unlock()
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	killed := time.Now()
	e.KillWorker("cpu")
	assert.Eventually(t, func() bool { return !prog.Healthy() }, 5*time.Second, time.Millisecond, "the program is unhealthy while its worker is down")
	waitHealthy(t, prog, 60*time.Second)
	recovery := time.Since(killed)
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("restart after SIGKILL: healthy again %v after the kill; steps ok %d, unavailable %d", recovery+killed.Sub(killed), ok, unavailable)
	assert.Greater(t, ok, 0)
	assert.Zero(t, other)
	assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.workerRestarts.WithLabelValues("cpu")))
	assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.workerUp.WithLabelValues("cpu")))
	require.NoError(t, r.Run(context.Background(), []*steps.Request{digitsRequest(2, 5)}), "serves after the restart")
}

// TestHungWorkerIsKilledAndRestarted stops the worker with SIGSTOP: pings go
// unanswered, the in-flight step fails at the stall deadline, and the worker
// is replaced.
func TestHungWorkerIsKilledAndRestarted(t *testing.T) {
	requireTorch(t)
	e, _ := newEngine(t, Options{StallTimeout: time.Second})
	m := loadDigits(t)
	grid, _ := bucketing.NewGrid([]int{1}, nil)
	prog, err := e.Load(context.Background(), m, grid.Shapes())
	require.NoError(t, err)
	require.NoError(t, prog.Compile(context.Background(), 0))

	w := e.workers[0]
	w.mu.Lock()
	pid := w.pid
	w.mu.Unlock()
	stop(t, pid)
	start := time.Now()
	_, err = prog.Step(context.Background(), 0)
	assert.ErrorIs(t, err, engine.ErrUnavailable)
	assert.ErrorContains(t, err, "stopped answering pings")
	assert.Less(t, time.Since(start), 10*time.Second, "the step failed at the stall deadline, not never")
	waitHealthy(t, prog, 60*time.Second)
	_, err = prog.Step(context.Background(), 0)
	assert.NoError(t, err)
}

func TestWorkerThatExitsAtStart(t *testing.T) {
	script, _ := filepath.Abs("testdata/exit_at_start.sh")
	e, _ := newEngine(t, Options{Python: script, RestartBackoff: time.Hour})
	_, err := e.Load(context.Background(), loadDigits(t), []bucketing.Shape{{Batch: 1}})
	require.Error(t, err)
	assert.ErrorIs(t, err, engine.ErrUnavailable)
	assert.ErrorContains(t, err, "No module named 'torch' (fake)", "the worker's own error reaches the load error")
}

func TestWorkerThatExitsDuringLoad(t *testing.T) {
	script, _ := filepath.Abs("testdata/bad_worker.sh")
	e, _ := newEngine(t, Options{Python: script, Env: map[string]string{"BAD_WORKER_MODE": "exit"}, RestartBackoff: time.Hour})
	_, err := e.Load(context.Background(), loadDigits(t), []bucketing.Shape{{Batch: 1}})
	require.Error(t, err)
	assert.ErrorIs(t, err, engine.ErrUnavailable)
	assert.ErrorContains(t, err, "exit status 1")
	assert.ErrorContains(t, err, "failed to initialise (fake)", "the worker's stderr reaches the load error")
}

func TestMalformedMessageFromWorker(t *testing.T) {
	script, _ := filepath.Abs("testdata/bad_worker.sh")
	e, _ := newEngine(t, Options{Python: script, RestartBackoff: time.Hour})
	_, err := e.Load(context.Background(), loadDigits(t), []bucketing.Shape{{Batch: 1}})
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrProtocol)
	assert.ErrorContains(t, err, `frame "this is not json"`)
	assert.ErrorIs(t, err, engine.ErrUnavailable, "a worker that breaks the protocol is treated as down")
}

// compileSleep makes the worker's compiles sleep (releasing the Python
// interpreter) or hold the interpreter ("<seconds>:gil"), as a long native
// compile would.
func compileSleep(v string) map[string]string {
	return map[string]string{"STEPSERVE_WORKER_TEST_COMPILE_SLEEP": v}
}

// intoTheBuild waits until w has said it builds a graph, and a little
// more, so that the build (and the test's sleep in it) has begun.
func intoTheBuild(t *testing.T, w *worker) {
	t.Helper()
	require.Eventually(t, func() bool {
		w.mu.Lock()
		c := w.conn
		w.mu.Unlock()
		return c != nil && c.health().building != ""
	}, 30*time.Second, 5*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
}

// TestCompileHoldingTheInterpreterIsNotAStall: a compile that holds the
// Python interpreter four stall timeouts long leaves pings and a memory
// poll unanswered; the worker is not killed, the compile completes, and
// the poll's late answer is counted and dropped.
func TestCompileHoldingTheInterpreterIsNotAStall(t *testing.T) {
	requireTorch(t)
	// Stall timeouts are generous against a loaded machine's scheduling
	// gaps; the compile holds the interpreter three of them.
	e, _ := newEngine(t, Options{StallTimeout: 2 * time.Second, Env: compileSleep("6:gil")})
	grid, _ := bucketing.NewGrid([]int{1}, nil)
	prog, err := e.Load(context.Background(), loadDigits(t), grid.Shapes())
	require.NoError(t, err)
	w := e.workers[0]

	compiled := make(chan error, 1)
	start := time.Now()
	go func() { compiled <- prog.Compile(context.Background(), 0) }()
	intoTheBuild(t, w)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err = w.call(ctx, &memoryRequest{}, nil)
	cancel()
	assert.ErrorIs(t, err, context.DeadlineExceeded, "the poll waited behind the interpreter")
	require.NoError(t, <-compiled)
	t.Logf("compile holding the interpreter: %v with a %v stall timeout", time.Since(start).Round(time.Millisecond), e.opts.StallTimeout)

	late := e.metrics.lateReplies.WithLabelValues("cpu", "memory")
	assert.Eventually(t, func() bool { return testutil.ToFloat64(late) >= 1 }, 5*time.Second, 10*time.Millisecond, "the late answer is counted")
	time.Sleep(2 * e.opts.StallTimeout) // time for a wrong kill to show
	assert.Zero(t, testutil.ToFloat64(e.metrics.workerRestarts.WithLabelValues("cpu")), "not killed")
	_, err = prog.Step(context.Background(), 0)
	assert.NoError(t, err)
}

// TestMemoryPollsDoNotWaitForACompile: while a compile sleeps, a memory
// poll is answered at once, from the worker's last reading.
func TestMemoryPollsDoNotWaitForACompile(t *testing.T) {
	requireTorch(t)
	e, _ := newEngine(t, Options{Env: compileSleep("2")})
	grid, _ := bucketing.NewGrid([]int{1}, nil)
	prog, err := e.Load(context.Background(), loadDigits(t), grid.Shapes())
	require.NoError(t, err)
	compiled := make(chan error, 1)
	go func() { compiled <- prog.Compile(context.Background(), 0) }()
	intoTheBuild(t, e.workers[0])
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	var r memoryReply
	require.NoError(t, e.workers[0].call(ctx, &memoryRequest{}, &r))
	t.Logf("memory poll during a compile: answered in %v", time.Since(start))
	assert.True(t, r.Cached, "the last reading, not a read beside the compile")
	require.NoError(t, <-compiled)
}

// TestCompileDeadline: a compile that outlives rbln.compile_timeout kills
// the worker, and says so.
func TestCompileDeadline(t *testing.T) {
	requireTorch(t)
	e, _ := newEngine(t, Options{CompileTimeout: time.Second, Env: compileSleep("30"), RestartBackoff: time.Hour})
	grid, _ := bucketing.NewGrid([]int{1}, nil)
	prog, err := e.Load(context.Background(), loadDigits(t), grid.Shapes())
	require.NoError(t, err)
	start := time.Now()
	err = prog.Compile(context.Background(), 0)
	assert.ErrorIs(t, err, engine.ErrUnavailable)
	assert.ErrorContains(t, err, "past the compile deadline (rbln.compile_timeout 1s)")
	assert.Less(t, time.Since(start), 10*time.Second)
	// Counted once the supervisor is through with the life, just after.
	assert.Eventually(t, func() bool { return testutil.ToFloat64(e.metrics.workerRestarts.WithLabelValues("cpu")) == 1 },
		10*time.Second, 10*time.Millisecond)
}

// TestSupervisorGivesUpAModelWhoseReloadKillsTheWorker: a model whose
// reload kills the worker every time is reloaded three times, then left
// unloaded (not healthy); the worker stays up and is not restarted again,
// and the model can be loaded anew.
func TestSupervisorGivesUpAModelWhoseReloadKillsTheWorker(t *testing.T) {
	requireTorch(t)
	crash := filepath.Join(t.TempDir(), "crash")
	// A model given up is retried after 16 restart backoffs (1.6 s here),
	// doubling: the second below must fall inside the first of them. (At
	// 10 ms the retry came 160 ms after the give-up, and the check passed
	// only while a worker took over a second to start.)
	e, _ := newEngine(t, Options{RestartBackoff: 100 * time.Millisecond, MaxRestartBackoff: 200 * time.Millisecond,
		Env: map[string]string{"STEPSERVE_WORKER_TEST_CRASH_ON_LOAD": crash}})
	grid, _ := bucketing.NewGrid([]int{1}, nil)
	m := loadDigits(t)
	prog, err := e.Load(context.Background(), m, grid.Shapes())
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(crash, nil, 0o644))
	e.KillWorker("cpu")
	restarts := func() float64 { return testutil.ToFloat64(e.metrics.workerRestarts.WithLabelValues("cpu")) }
	require.Eventually(t, func() bool { return restarts() >= 1+maxReloadFailures }, 30*time.Second, 10*time.Millisecond)
	settled := restarts()
	time.Sleep(time.Second) // a loop would go on restarting
	assert.Equal(t, settled, restarts(), "no restart once the model is given up")
	assert.Equal(t, 1.0+maxReloadFailures, settled)
	assert.False(t, prog.Healthy())

	require.NoError(t, os.Remove(crash))
	require.Eventually(t, func() bool { return testutil.ToFloat64(e.metrics.workerUp.WithLabelValues("cpu")) == 1 },
		30*time.Second, 10*time.Millisecond, "the worker comes back up, without the model")
	// A reload that takes the worker down is tried again after a backoff
	// (maxReloadBackoff): once the load can succeed, the model comes back
	// by itself. One tried just before the file went can still take the
	// worker down: the new load waits for that to settle.
	require.Eventually(t, prog.Healthy, 60*time.Second, 10*time.Millisecond, "the model comes back by itself")
	again, err := e.Load(context.Background(), m, grid.Shapes())
	require.NoError(t, err, "the model loads anew")
	defer again.Close()
	assert.True(t, again.Healthy())
}

// TestWorkerStopsInOrder: the worker leads its own process group (a
// terminal's Ctrl-C to the server does not reach it); closing the engine
// asks it to shut down, and it exits by itself, at once and cleanly; a
// SIGTERM ends it cleanly too.
func TestWorkerStopsInOrder(t *testing.T) {
	requireTorch(t)
	var logs syncBuffer
	e, _ := newEngine(t, Options{})
	e.opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	grid, _ := bucketing.NewGrid([]int{1}, nil)
	_, err := e.Load(context.Background(), loadDigits(t), grid.Shapes())
	require.NoError(t, err)
	w := e.workers[0]
	w.logger = e.opts.Logger
	pid := func() int {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.pid
	}
	pgid, err := syscall.Getpgid(pid())
	require.NoError(t, err)
	assert.Equal(t, pid(), pgid, "the worker leads a process group of its own")

	first := pid()
	require.NoError(t, syscall.Kill(first, syscall.SIGTERM))
	require.Eventually(t, func() bool {
		return pid() != first && testutil.ToFloat64(e.metrics.workerUp.WithLabelValues("cpu")) == 1
	}, 60*time.Second, 10*time.Millisecond)
	assert.Contains(t, logs.String(), "exited (<nil>)", "SIGTERM: a clean exit")

	start := time.Now()
	require.NoError(t, e.Close())
	took := time.Since(start)
	t.Logf("engine close, worker stopping by itself: %v", took)
	assert.Less(t, took, e.opts.StopTimeout, "no SIGTERM was needed")
	assert.Contains(t, logs.String(), `msg="torch worker stopped"`)
	assert.Contains(t, logs.String(), `exit="status 0"`)
	assert.NotContains(t, logs.String(), "Traceback")
}

// doorbellProgram loads digits with one bucket and steps it twice, so that
// its next steps ring the doorbell; it returns the program and the worker's
// pid.
func doorbellProgram(t *testing.T, e *Engine) (*program, int) {
	t.Helper()
	grid, _ := bucketing.NewGrid([]int{1}, nil)
	prog, err := e.Load(context.Background(), loadDigits(t), grid.Shapes())
	require.NoError(t, err)
	t.Cleanup(func() { prog.Close() })
	require.NoError(t, prog.Compile(context.Background(), 0))
	for range 2 {
		_, err := prog.Step(context.Background(), 0)
		require.NoError(t, err)
	}
	w := e.workers[0]
	w.mu.Lock()
	defer w.mu.Unlock()
	return prog.(*program), w.pid
}

// stop sends SIGSTOP and waits until the process has stopped: a worker
// polling its doorbell would otherwise answer a step before it stops.
func stop(t *testing.T, pid int) {
	t.Helper()
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		return i > 0 && i+2 < len(s) && s[i+2] == 'T'
	}, 10*time.Second, time.Millisecond)
}

// TestHungDoorbellStepFailsAtTheStallDeadline: a worker stopped (SIGSTOP)
// while a doorbell step waits fails that step with ErrUnavailable at the
// stall deadline, not never, and a fresh worker serves again.
func TestHungDoorbellStepFailsAtTheStallDeadline(t *testing.T) {
	requireTorch(t)
	e, _ := newEngine(t, Options{StallTimeout: time.Second})
	prog, pid := doorbellProgram(t, e)
	stop(t, pid)
	start := time.Now()
	_, err := prog.Step(context.Background(), 0)
	assert.ErrorIs(t, err, engine.ErrUnavailable)
	assert.Less(t, time.Since(start), 10*time.Second, "the step failed at the stall deadline")
	waitHealthy(t, prog, 60*time.Second)
	for range 3 { // the first builds the graph anew, the next ring the new life's doorbell
		_, err = prog.Step(context.Background(), 0)
		require.NoError(t, err)
	}
}

// TestAbandonedDoorbellStepIsLateNotFatal: a step whose caller gives up
// returns the caller's error at once; the worker's answer, when it comes,
// is counted as late and dropped; the worker is not restarted, and the
// next step waits its turn and succeeds.
func TestAbandonedDoorbellStepIsLateNotFatal(t *testing.T) {
	requireTorch(t)
	e, _ := newEngine(t, Options{StallTimeout: 10 * time.Second})
	prog, pid := doorbellProgram(t, e)
	stop(t, pid)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := prog.Step(ctx, 0)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
	_, err = prog.Step(context.Background(), 0)
	require.NoError(t, err, "the next step ran after the abandoned one")
	assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.lateReplies.WithLabelValues("cpu", "step")))
	assert.Zero(t, testutil.ToFloat64(e.metrics.workerRestarts.WithLabelValues("cpu")), "an abandoned step is no reason to restart")
}

// TestDoorbellStepOfAKilledWorker: SIGKILL while a doorbell step waits
// fails it at once with ErrUnavailable.
func TestDoorbellStepOfAKilledWorker(t *testing.T) {
	requireTorch(t)
	e, _ := newEngine(t, Options{StallTimeout: time.Minute})
	prog, pid := doorbellProgram(t, e)
	stop(t, pid) // the step waits
	errc := make(chan error, 1)
	go func() {
		_, err := prog.Step(context.Background(), 0)
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	e.KillWorker("cpu")
	select {
	case err := <-errc:
		assert.ErrorIs(t, err, engine.ErrUnavailable)
	case <-time.After(30 * time.Second):
		t.Fatal("the step of a killed worker never returned")
	}
}
