package rbln

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/serving"
	"github.com/stepserve/stepserve/steps"
)

// digitsRepo is a repository holding the shipped digits model on the
// torch engine, with extra appended to its model.yaml.
func digitsRepo(t testing.TB, extra string) string {
	repo := t.TempDir()
	dir := filepath.Join(repo, "digits")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for _, f := range []string{"model.yaml", "weights.safetensors", "labels.txt"} {
		b, err := os.ReadFile(filepath.Join("../../model_repository/digits", f))
		require.NoError(t, err)
		if f == "model.yaml" {
			b = []byte(strings.Replace(string(b), "engine: cpu", "engine: torch", 1) + extra)
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	return repo
}

// TestReplicasOnTwoWorkers serves digits with instances {devices: all} on
// a torch engine of two workers: one replica on each, both warmed up and
// answering as the CPU engine does. With one worker killed, the model
// stays ready (min_ready 1) and the other serves every request until the
// first is back.
func TestReplicasOnTwoWorkers(t *testing.T) {
	requireTorch(t)
	e, _ := newEngine(t, Options{Workers: 2})
	assert.Equal(t, []string{"cpu0", "cpu1"}, e.DeviceNames())
	reg := prometheus.NewRegistry()
	stepMetrics, err := steps.NewMetrics(reg)
	require.NoError(t, err)
	set, err := serving.New(serving.Options{Repository: digitsRepo(t, "instances: {devices: all}\n"), DefaultEngine: "torch",
		Engines: map[string]serving.Engine{"torch": {Engine: e}}, StepMetrics: stepMetrics, Registerer: reg, Logger: testLogger(t)})
	require.NoError(t, err)
	defer set.Close()
	ctx := context.Background()
	require.NoError(t, set.LoadAll(ctx))
	require.NoError(t, set.Warmup(ctx))
	m, ok := set.Model("digits")
	require.True(t, ok)
	total, healthy := m.Backend().Replicas()
	require.Equal(t, [2]int{2, 2}, [2]int{total, healthy})
	for _, w := range e.workers {
		w.mu.Lock()
		assert.Len(t, w.programs, 1, "one replica on worker %s", w.device)
		w.mu.Unlock()
	}

	onCPU := runners(t, m.Model(), cpufallback.Engine{})
	check := func(rows int, seed float32) {
		t.Helper()
		want := digitsRequest(rows, seed)
		_, got, err := m.Infer(ctx, &serving.Request{Rows: rows, Inputs: []models.Input{{Shape: []int64{int64(rows), 64}, Data: want.Inputs[0]}}})
		require.NoError(t, err)
		require.NoError(t, onCPU.Run(ctx, []*steps.Request{want}))
		assert.InDeltaSlice(t, floats(want.Outputs[0]), floats(got.Outputs[0]), 1e-4)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { check(1+i%3, float32(i)) })
	}
	wg.Wait()
	steps := func(device string) float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() != "stepserve_device_steps_total" {
				continue
			}
			for _, s := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range s.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["model"] == "digits" && labels["engine"] == "torch" && labels["device"] == device {
					return s.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
	assert.Greater(t, steps("cpu0")+steps("cpu1"), 0.0)

	// Placing on a device the engine does not have says which it has.
	prog, err := e.Load(ctx, m.Model(), []bucketing.Shape{{Batch: 1}})
	require.NoError(t, err, "the same instances load again")
	assert.Len(t, engine.ReplicasOf(prog), 2)
	prog.Close()
	bad := *m.Model()
	cfg := *bad.Config
	cfg.Instances.All, cfg.Instances.Devices = false, []string{"cpu7"}
	bad.Config = &cfg
	_, err = e.Load(ctx, &bad, []bucketing.Shape{{Batch: 1}})
	assert.ErrorContains(t, err, `instances.devices: engine torch has no device "cpu7"; its devices are cpu0, cpu1`)

	// One worker dies: the model stays ready, served by the other.
	e.KillWorker("cpu0")
	require.Eventually(t, func() bool { _, h := m.Backend().Replicas(); return h == 1 }, 10*time.Second, time.Millisecond)
	assert.True(t, m.Ready(), "one healthy replica is min_ready")
	before, down := steps("cpu1"), 0
	for i := range 4 {
		_, h1 := m.Backend().Replicas()
		check(2, float32(10+i))
		if _, h2 := m.Backend().Replicas(); h1 == 1 && h2 == 1 {
			down++ // cpu0 was down throughout
			assert.True(t, m.Ready())
		}
	}
	require.Positive(t, down, "cpu0 came back before any request was sent")
	assert.GreaterOrEqual(t, steps("cpu1")-before, float64(down), "the requests sent while cpu0 was down ran on cpu1")
	require.Eventually(t, func() bool { _, h := m.Backend().Replicas(); return h == 2 }, 60*time.Second, 10*time.Millisecond,
		"the killed worker comes back with its replica")
	check(3, 20)
}

// BenchmarkReplicasOnWorkers serves digits from 16 concurrent callers on
// the torch engine as one replica (one worker) and as two (two workers,
// devices: all), in the same run, and reports requests per second.
func BenchmarkReplicasOnWorkers(b *testing.B) {
	for _, workers := range []int{1, 2} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			e, err := New(Options{Device: DeviceCPU, Python: python, Workers: workers})
			require.NoError(b, err)
			defer e.Close()
			set, err := serving.New(serving.Options{Repository: digitsRepo(b, "instances: {devices: all}\n"), DefaultEngine: "torch",
				Engines: map[string]serving.Engine{"torch": {Engine: e}}})
			require.NoError(b, err)
			defer set.Close()
			require.NoError(b, set.LoadAll(context.Background()))
			require.NoError(b, set.Warmup(context.Background()))
			m, _ := set.Model("digits")
			b.SetParallelism(8)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					in := digitsRequest(1, 3).Inputs[0]
					if _, _, err := m.Infer(context.Background(), &serving.Request{Rows: 1, Inputs: []models.Input{{Shape: []int64{1, 64}, Data: in}}}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
		})
	}
}
