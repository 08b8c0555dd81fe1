package serving

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/steps"
)

// world is a set over a repository of summax models, on fake engines.
type world struct {
	repo string
	set  *Set
	reg  *prometheus.Registry
	dev  *enginetest.Engine // the default engine: a device that can go down
	cpu  *enginetest.Engine // the failover engine
}

type option func(*Options)

func withFailover(o *Options) { o.Failover = "cpu" }

func newWorld(t *testing.T, names []string, opts ...option) *world {
	t.Helper()
	w := &world{repo: t.TempDir(), reg: prometheus.NewRegistry(),
		dev: &enginetest.Engine{Label: "dev", Func: enginetest.SumMax},
		cpu: &enginetest.Engine{Label: "cpu", Func: enginetest.SumMax}}
	for _, n := range names {
		require.NoError(t, enginetest.WriteSumMax(filepath.Join(w.repo, n)))
	}
	stepMetrics, err := steps.NewMetrics(w.reg)
	require.NoError(t, err)
	o := Options{Repository: w.repo, DefaultEngine: "dev", DrainGrace: time.Second,
		Engines:     map[string]Engine{"dev": {Engine: w.dev}, "cpu": {Engine: w.cpu, StrictWarmup: true}},
		StepMetrics: stepMetrics, Registerer: w.reg}
	for _, f := range opts {
		f(&o)
	}
	w.set, err = New(o)
	require.NoError(t, err)
	t.Cleanup(func() { w.set.Close() })
	return w
}

// ready loads and warms up the world's repository.
func (w *world) ready(t *testing.T) {
	t.Helper()
	require.NoError(t, w.set.LoadAll(context.Background()))
	require.NoError(t, w.set.Warmup(context.Background()))
}

// infer runs one row through the named model and returns y.
func infer(ctx context.Context, s *Set, name string, x ...float32) ([]float32, error) {
	m, ok := s.Model(name)
	if !ok {
		return nil, ErrUnknownModel
	}
	in := make([]byte, 12)
	for i, v := range x {
		binary.LittleEndian.PutUint32(in[4*i:], math.Float32bits(v))
	}
	r := &steps.Request{Rows: 1, Inputs: [][]byte{in}, Outputs: [][]byte{make([]byte, 8)}}
	if err := m.submit(ctx, r, batching.Params{}); err != nil {
		return nil, err
	}
	return []float32{math.Float32frombits(binary.LittleEndian.Uint32(r.Outputs[0])),
		math.Float32frombits(binary.LittleEndian.Uint32(r.Outputs[0][4:]))}, nil
}

func state(t *testing.T, s *Set, name string) IndexEntry {
	t.Helper()
	index, err := s.Index(context.Background())
	require.NoError(t, err)
	for _, e := range index {
		if e.Name == name {
			return e
		}
	}
	t.Fatalf("%s is not in the index %v", name, index)
	return IndexEntry{}
}

func TestReadinessFollowsWarmupAndDevice(t *testing.T) {
	w := newWorld(t, []string{"a", "b"})
	ctx := context.Background()
	require.NoError(t, w.set.LoadAll(ctx))
	require.Len(t, w.set.Models(), 2)
	assert.Equal(t, "a", w.set.Models()[0].Model().Name)

	ready, which := w.set.Ready()
	assert.False(t, ready, "loaded is not ready: nothing is compiled yet")
	assert.Equal(t, "a", which)
	assert.Equal(t, "LOADING", state(t, w.set, "a").State)
	assert.Equal(t, 0.0, testutil.ToFloat64(collectorFor(w, "a")))

	require.NoError(t, w.set.Warmup(ctx))
	ready, _ = w.set.Ready()
	assert.True(t, ready)
	assert.Equal(t, IndexEntry{Name: "a", Version: "1", State: "READY"}, state(t, w.set, "a"))
	assert.Equal(t, 1.0, testutil.ToFloat64(collectorFor(w, "a")))
	for _, p := range w.dev.Programs() {
		assert.Equal(t, 4, p.Steps(), "warm-up runs each of the two buckets twice")
	}
	y, err := infer(ctx, w.set, "b", 1, 5, 3)
	require.NoError(t, err)
	assert.Equal(t, []float32{9, 5}, y)

	// The device of b goes down: b is not ready, and nothing fails over.
	m, _ := w.set.Model("b")
	w.dev.Programs()[1].SetHealthy(false)
	assert.False(t, m.Ready())
	ready, which = w.set.Ready()
	assert.False(t, ready)
	assert.Equal(t, "b", which)
	assert.Equal(t, "LOADING", state(t, w.set, "b").State)
	_, err = infer(ctx, w.set, "b", 1, 2, 3)
	assert.ErrorIs(t, err, engine.ErrUnavailable)
	w.dev.Programs()[1].SetHealthy(true)
	assert.True(t, m.Ready())
	assert.Equal(t, "dev", m.Engine())
}

// collectorFor reads stepserve_model_ready for one model.
func collectorFor(w *world, model string) prometheus.Collector {
	return prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
		for _, m := range w.set.Models() {
			if m.Model().Name == model {
				v := 0.0
				if m.Ready() {
					v = 1
				}
				ch <- prometheus.MustNewConstMetric(readyDesc, prometheus.GaugeValue, v, model, m.Engine())
			}
		}
	})
}

func TestReadyMetricIsCollectedFromTheSet(t *testing.T) {
	w := newWorld(t, []string{"a"})
	require.NoError(t, w.set.LoadAll(context.Background()))
	require.NoError(t, testutil.GatherAndCompare(w.reg, stringsReader(`
# HELP stepserve_model_ready 1 when the model takes requests (loaded, warmed up, its device up or failed over), 0 when it does not.
# TYPE stepserve_model_ready gauge
stepserve_model_ready{engine="dev",model="a"} 0
`), "stepserve_model_ready"))
	require.NoError(t, w.set.Warmup(context.Background()))
	require.NoError(t, w.set.Unload(context.Background(), "a"))
	n, err := testutil.GatherAndCount(w.reg, "stepserve_model_ready", "stepserve_model_load_duration_seconds")
	require.NoError(t, err)
	assert.Zero(t, n, "an unloaded model's series are gone")
}

func TestLoadCancelledLeavesTheServedModel(t *testing.T) {
	w := newWorld(t, []string{"a"})
	ctx := context.Background()
	w.ready(t)
	old, _ := w.set.Model("a")

	// A reload whose client goes away while the engine loads.
	w.dev.LoadGate = make(chan struct{})
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.set.Load(lctx, "a") }()
	require.Eventually(t, func() bool { return w.dev.Loads() == 2 }, 5*time.Second, time.Millisecond)
	cancel()
	err := <-done
	require.ErrorIs(t, err, ErrBadModel)
	require.ErrorIs(t, err, context.Canceled)
	now, _ := w.set.Model("a")
	assert.Same(t, old, now, "the served model is untouched")
	assert.True(t, now.Ready())
	_, err = infer(ctx, w.set, "a", 1, 2, 3)
	assert.NoError(t, err)
	assert.Equal(t, "READY", state(t, w.set, "a").State)

	// Cancelled during the warm-up: the half-loaded program is closed.
	close(w.dev.LoadGate)
	w.dev.LoadGate = nil
	w.dev.CompileGate = make(chan struct{})
	lctx, cancel = context.WithCancel(ctx)
	go func() { done <- w.set.Load(lctx, "a") }()
	require.Eventually(t, func() bool { return w.dev.Loads() == 3 && w.dev.Last() != nil && w.dev.Last() != old.program }, 5*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	assert.True(t, w.dev.Last().Closed(), "the new program is released")
	now, _ = w.set.Model("a")
	assert.Same(t, old, now)
	assert.False(t, old.program.(*enginetest.Program).Closed())
}

func TestDrainCancelsALoadInProgress(t *testing.T) {
	w := newWorld(t, []string{"a"})
	w.dev.CompileGate = make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- w.set.Load(context.Background(), "a") }()
	require.Eventually(t, func() bool { return w.dev.Loads() == 1 }, 5*time.Second, time.Millisecond)
	w.set.Drain(context.Background())
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("a load went on compiling after the set started draining")
	}
	_, ok := w.set.Model("a")
	assert.False(t, ok)
}

func TestReloadSwapsOnlyWhenTheNewModelIsReady(t *testing.T) {
	w := newWorld(t, []string{"a"})
	ctx := context.Background()
	w.ready(t)
	old, _ := w.set.Model("a")

	// While the new one compiles, the old one serves.
	w.dev.CompileGate = make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- w.set.Load(ctx, "a") }()
	require.Eventually(t, func() bool { return w.dev.Loads() == 2 }, 5*time.Second, time.Millisecond)
	for range 3 {
		y, err := infer(ctx, w.set, "a", 2, 2, 2)
		require.NoError(t, err)
		assert.Equal(t, []float32{6, 2}, y)
	}
	close(w.dev.CompileGate)
	require.NoError(t, <-done)
	now, _ := w.set.Model("a")
	assert.NotSame(t, old, now)
	assert.True(t, now.Ready())
	assert.True(t, old.program.(*enginetest.Program).Closed(), "the old version is closed once replaced")
	_, err := infer(ctx, w.set, "a", 1, 2, 3)
	assert.NoError(t, err)

	// A reload that fails keeps the model that was served, and says why in
	// the index.
	require.NoError(t, os.WriteFile(filepath.Join(w.repo, "a", "model.yaml"), []byte("architecture: mlp\n"), 0o644))
	err = w.set.Load(ctx, "a")
	require.ErrorIs(t, err, ErrBadModel)
	still, _ := w.set.Model("a")
	assert.Same(t, now, still)
	assert.Equal(t, "READY", state(t, w.set, "a").State)
}

func TestLoadErrors(t *testing.T) {
	w := newWorld(t, []string{"a"})
	ctx := context.Background()
	for _, name := range []string{"nope", "../a", ""} {
		assert.ErrorIs(t, w.set.Load(ctx, name), ErrUnknownModel, name)
	}
	w.dev.LoadErr = errors.New("out of device memory")
	err := w.set.Load(ctx, "a")
	require.ErrorIs(t, err, ErrBadModel)
	assert.Contains(t, err.Error(), "model a: load on engine dev: out of device memory")
	assert.Equal(t, IndexEntry{Name: "a", State: "UNAVAILABLE", Reason: "model a: load on engine dev: out of device memory"}, state(t, w.set, "a"))
	assert.ErrorIs(t, w.set.Unload(ctx, "a"), ErrUnknownModel)

	// A batching key out of range is named, before anything is loaded.
	loads := w.dev.Loads()
	require.NoError(t, os.WriteFile(filepath.Join(w.repo, "a", "model.yaml"), []byte(enginetest.SumMaxYAML+"batching: {max_queue_size: 0}\n"), 0o644))
	assert.ErrorContains(t, w.set.Load(ctx, "a"), `model a: model.yaml: batching.max_queue_size: "0"; want an integer of at least 1`)
	assert.Equal(t, loads, w.dev.Loads())

	// A model naming an engine the server does not have.
	require.NoError(t, os.WriteFile(filepath.Join(w.repo, "a", "model.yaml"), []byte(enginetest.SumMaxYAML+"engine: rbln\n"), 0o644))
	assert.ErrorContains(t, w.set.Load(ctx, "a"), `no engine "rbln"; this server has [cpu dev]`)
}

func TestUnloadDrainsTheQueue(t *testing.T) {
	w := newWorld(t, []string{"a"})
	ctx := context.Background()
	w.ready(t)
	m, _ := w.set.Model("a")

	// Requests in flight when the unload starts are answered.
	gate := make(chan struct{})
	w.dev.Func = func(l engine.Layout, in, out []byte) error { <-gate; return enginetest.SumMax(l, in, out) }
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() { _, err := infer(ctx, w.set, "a", 1, 1, 1); errs <- err })
	}
	// One runs, the other seven wait: every one was accepted before the
	// unload begins.
	require.Eventually(t, func() bool { return w.dev.Last().Steps() > 4 && m.batcher.Depth() == 7 }, 5*time.Second, time.Millisecond)
	unloaded := make(chan error, 1)
	go func() { unloaded <- w.set.Unload(ctx, "a") }()
	require.Eventually(t, func() bool { _, ok := w.set.Model("a"); return !ok }, 5*time.Second, time.Millisecond)
	close(gate)
	require.NoError(t, <-unloaded)
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	assert.True(t, m.program.(*enginetest.Program).Closed())
	assert.False(t, m.Ready())
	assert.Equal(t, IndexEntry{Name: "a", State: "UNAVAILABLE", Reason: "unloaded"}, state(t, w.set, "a"))
}

func TestFailoverServesWhileTheDeviceIsDown(t *testing.T) {
	w := newWorld(t, []string{"a"}, withFailover)
	ctx := context.Background()
	w.ready(t)
	m, _ := w.set.Model("a")
	assert.Equal(t, 4, w.cpu.Last().Steps(), "the failover engine is warmed up too")
	failovers := func() float64 {
		return testutil.ToFloat64(w.set.metrics.failovers.WithLabelValues("a", "dev", "cpu"))
	}
	assert.Equal(t, 0.0, failovers())

	_, err := infer(ctx, w.set, "a", 1, 2, 3)
	require.NoError(t, err)
	assert.Equal(t, 4, w.cpu.Last().Steps(), "a healthy device serves")

	// A step that finds the device gone is run again on the failover.
	w.dev.Last().Fail(engine.ErrUnavailable)
	y, err := infer(ctx, w.set, "a", 1, 2, 3)
	require.NoError(t, err)
	assert.Equal(t, []float32{6, 3}, y)
	assert.Equal(t, 1.0, failovers())
	w.dev.Last().Fail(nil)

	// While the device is down the model stays ready and is served.
	w.dev.Last().SetHealthy(false)
	assert.True(t, m.Ready())
	_, err = infer(ctx, w.set, "a", 4, 5, 6)
	require.NoError(t, err)
	assert.Equal(t, 1.0, failovers(), "one switch is counted once")

	// Back on the device.
	w.dev.Last().SetHealthy(true)
	steps := w.dev.Last().Steps()
	_, err = infer(ctx, w.set, "a", 4, 5, 6)
	require.NoError(t, err)
	assert.Equal(t, steps+1, w.dev.Last().Steps())

	// Without failover, a model on the failover engine itself has none.
	require.NoError(t, os.WriteFile(filepath.Join(w.repo, "a", "model.yaml"), []byte(enginetest.SumMaxYAML+"engine: cpu\n"), 0o644))
	require.NoError(t, w.set.Load(ctx, "a"))
	m, _ = w.set.Model("a")
	assert.Nil(t, m.fallback)
	assert.Equal(t, "cpu", m.Engine())
}

func TestEnginesStartOnFirstUseOnce(t *testing.T) {
	starts := 0
	dir := t.TempDir()
	require.NoError(t, enginetest.WriteSumMax(filepath.Join(dir, "a")))
	require.NoError(t, enginetest.WriteSumMax(filepath.Join(dir, "b")))
	s, err := New(Options{Repository: dir, DefaultEngine: "lazy", Engines: map[string]Engine{
		"lazy": {Start: func() (engine.Engine, error) { starts++; return &enginetest.Engine{}, nil }},
		"rbln": {Start: func() (engine.Engine, error) { return nil, errors.New("no device") }},
	}})
	require.NoError(t, err)
	defer s.Close()
	assert.Zero(t, starts, "nothing starts before a model needs it")
	require.NoError(t, s.LoadAll(context.Background()))
	assert.Equal(t, 1, starts)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "b", "model.yaml"), []byte(enginetest.SumMaxYAML+"engine: rbln\n"), 0o644))
	for range 2 {
		assert.ErrorContains(t, s.Load(context.Background(), "b"), "serving: starting engine rbln: no device")
	}

	_, err = New(Options{DefaultEngine: "nope", Engines: map[string]Engine{"cpu": {Engine: &enginetest.Engine{}}}})
	assert.ErrorContains(t, err, `engine "nope" is not among the engines given (cpu)`)
	_, err = New(Options{Engines: map[string]Engine{"cpu": {}}})
	assert.ErrorContains(t, err, "set exactly one of Engine and Start")
}

func TestStartupRefusesAnIncompleteRepository(t *testing.T) {
	w := newWorld(t, []string{"a", "b"})
	require.NoError(t, os.Remove(filepath.Join(w.repo, "b", "weights.safetensors")))
	err := w.set.LoadAll(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "weights.safetensors")

	empty := newWorld(t, nil)
	assert.ErrorContains(t, empty.set.LoadAll(context.Background()), "holds no model")
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }

// TestLazyWarmupCountsRecompiles: a lazy model is ready at once, and each
// bucket's first step builds its program, counted as a recompile and kept
// in the model's explain history.
func TestLazyWarmupCountsRecompiles(t *testing.T) {
	w := newWorld(t, nil)
	require.NoError(t, os.MkdirAll(filepath.Join(w.repo, "a"), 0o755))
	require.NoError(t, enginetest.WriteSumMax(filepath.Join(w.repo, "a")))
	require.NoError(t, os.WriteFile(filepath.Join(w.repo, "a", "model.yaml"), []byte(enginetest.SumMaxYAML+"warmup: lazy\n"), 0o644))
	ctx := context.Background()
	w.ready(t)
	m, _ := w.set.Model("a")
	assert.True(t, m.Ready(), "ready without compiling")
	assert.Zero(t, w.dev.Last().Steps())

	in3 := make([]byte, 36)
	for range 2 {
		_, err := infer(ctx, w.set, "a", 1, 2, 3)
		require.NoError(t, err)
		r := &steps.Request{Rows: 3, Inputs: [][]byte{in3}, Outputs: [][]byte{make([]byte, 24)}}
		require.NoError(t, m.submit(ctx, r, batching.Params{}))
	}
	for _, b := range []string{"b1", "b4"} {
		for verdict, want := range map[string]float64{"overhead": 1, "clean": 1} {
			got, err := gatherValue(w.reg, "stepserve_steps_total", map[string]string{"bucket": b, "verdict": verdict})
			require.NoError(t, err)
			assert.Equal(t, want, got, "%s %s", b, verdict)
		}
		got, err := gatherValue(w.reg, "stepserve_step_signals_total", map[string]string{"bucket": b, "signal": "recompile"})
		require.NoError(t, err)
		assert.Equal(t, 1.0, got, b)
	}
	recs := m.Backend().Explains()
	require.Len(t, recs, 2)
	assert.Equal(t, "b4", recs[0].Bucket, "newest first")
	assert.Equal(t, "b1", recs[1].Bucket)
	for _, r := range recs {
		assert.Equal(t, int64(1), r.Signals["recompile"])
		assert.Contains(t, r.Explain.(engine.Explain).Reasons[0], "was not compiled at load")
	}
}

// gatherValue sums the samples of a metric whose labels include want.
func gatherValue(g prometheus.Gatherer, name string, want map[string]string) (float64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, err
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue metric
				}
			}
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			} else if g := m.GetGauge(); g != nil {
				sum += g.GetValue()
			}
		}
	}
	return sum, nil
}
