package rbln

import (
	"context"
	"errors"
	"path/filepath"
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
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
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
