package serving

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/models"
)

// TestRetireWaitsForTheRunningStep: a step that outlives the drain grace
// keeps its program open until it ends; the unload itself returns.
func TestRetireWaitsForTheRunningStep(t *testing.T) {
	w := newWorld(t, []string{"a"})
	ctx := context.Background()
	w.ready(t)
	gate := make(chan struct{})
	w.dev.Func = func(l engine.Layout, in, out []byte) error { <-gate; return enginetest.SumMax(l, in, out) }
	prog := w.dev.Last()
	answered := make(chan error, 1)
	go func() { _, err := infer(ctx, w.set, "a", 1, 2, 3); answered <- err }()
	require.Eventually(t, func() bool { return prog.Steps() > 4 }, 5*time.Second, time.Millisecond)

	require.NoError(t, w.set.Unload(ctx, "a"), "the unload returns after the grace")
	assert.False(t, prog.Closed(), "the program stays open under its running step")
	close(gate)
	require.NoError(t, <-answered, "the running request is answered with its step's outcome")
	assert.Eventually(t, prog.Closed, 5*time.Second, time.Millisecond, "and closes when the step ends")
}

// TestUnloadDuringStartupWarmup: a model unloaded while the start-up
// warm-up runs is skipped, not warmed closed, and the warm-up succeeds.
func TestUnloadDuringStartupWarmup(t *testing.T) {
	w := newWorld(t, []string{"a", "b"})
	ctx := context.Background()
	require.NoError(t, w.set.LoadAll(ctx))
	w.dev.CompileGate = make(chan struct{})
	warm := make(chan error, 1)
	go func() { warm <- w.set.Warmup(ctx) }()
	require.Eventually(t, func() bool { return w.dev.Compiles() > 0 }, 5*time.Second, time.Millisecond, "the warm-up is compiling")
	unloaded := make(chan error, 1)
	go func() { unloaded <- w.set.Unload(ctx, "b") }()
	require.Eventually(t, func() bool { return w.set.Waiting() == 1 }, 5*time.Second, time.Millisecond, "the unload waits for the warm-up")
	close(w.dev.CompileGate)
	require.NoError(t, <-unloaded)
	require.NoError(t, <-warm)
	_, ok := w.set.Model("b")
	assert.False(t, ok)
	ready, _ := w.set.Ready()
	assert.True(t, ready)
}

// TestLoadsDuringDrainAreRefusedAsStopping: a load waiting for the lock
// when the set starts draining, and one that comes after, get ErrStopping.
func TestLoadsDuringDrainAreRefusedAsStopping(t *testing.T) {
	w := newWorld(t, []string{"a", "b"})
	ctx := context.Background()
	w.dev.CompileGate = make(chan struct{})
	first := make(chan error, 1)
	go func() { first <- w.set.Load(ctx, "a") }()
	require.Eventually(t, func() bool { return w.dev.Loads() == 1 }, 5*time.Second, time.Millisecond)
	second := make(chan error, 1)
	go func() { second <- w.set.Load(ctx, "b") }()
	require.Eventually(t, func() bool { return w.set.Waiting() == 1 }, 5*time.Second, time.Millisecond, "the second load waits for the first")
	w.set.Drain(ctx)
	assert.ErrorIs(t, <-first, ErrStopping)
	assert.ErrorIs(t, <-second, ErrStopping)
	assert.ErrorIs(t, w.set.Load(ctx, "b"), ErrStopping)
	assert.Empty(t, w.set.Models())
	for _, p := range w.dev.Programs() {
		assert.True(t, p.Closed(), "a cancelled load releases its program")
	}
}

// TestPanicInWarmupReleasesTheNewModel: a load whose warm-up panics fails,
// and leaves neither its program nor its series behind.
func TestPanicInWarmupReleasesTheNewModel(t *testing.T) {
	w := newWorld(t, []string{"a"})
	w.dev.Func = func(engine.Layout, []byte, []byte) error { panic("a bug in an engine") }
	err := w.set.Load(context.Background(), "a")
	require.ErrorIs(t, err, ErrBadModel)
	assert.ErrorContains(t, err, "internal error (logged)")
	require.Len(t, w.dev.Programs(), 1)
	assert.True(t, w.dev.Last().Closed())
	mfs, err := w.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				assert.False(t, l.GetName() == "model" && l.GetValue() == "a", "%s still has a series for the model that failed to load", mf.GetName())
			}
		}
	}
}

// TestModelOfAnUnavailableEngineIsSkippedAtStart: a model whose engine this
// machine cannot run (the torch engine without torch) is skipped by
// LoadAll, its reason in the index; the others are served.
func TestModelOfAnUnavailableEngineIsSkippedAtStart(t *testing.T) {
	w := newWorld(t, []string{"a", "b"}, func(o *Options) {
		o.Engines["torch"] = Engine{Start: func() (engine.Engine, error) {
			return nil, fmt.Errorf("%w: /usr/bin/python3 cannot import torch", ErrEngineUnavailable)
		}}
	})
	path := filepath.Join(w.repo, "b", "model.yaml")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, append(b, []byte("\nengine: torch\n")...), 0o644))
	w.ready(t)
	_, err = infer(context.Background(), w.set, "a", 1, 2, 3)
	assert.NoError(t, err, "the other model serves")
	_, ok := w.set.Model("b")
	assert.False(t, ok)
	e := state(t, w.set, "b")
	assert.Contains(t, e.Reason, "cannot import torch")
	ready, _ := w.set.Ready()
	assert.True(t, ready, "a skipped model does not hold readiness back")
}

// downEngine is an engine whose device never comes up.
type downEngine struct{}

func (downEngine) Name() string { return "dev" }
func (downEngine) Load(context.Context, *models.Model, []bucketing.Shape) (engine.Program, error) {
	return nil, fmt.Errorf("%w: the worker did not start (bad rbln.python)", engine.ErrUnavailable)
}

// TestUnavailableEngineAtStartServesOnFailover: with a failover engine, a
// model whose engine cannot load it now (its worker does not start) serves
// on the failover engine instead of stopping the server; without one, the
// load fails.
func TestUnavailableEngineAtStartServesOnFailover(t *testing.T) {
	w := newWorld(t, []string{"a"}, withFailover, func(o *Options) { o.Engines["dev"] = Engine{Engine: downEngine{}} })
	w.ready(t)
	y, err := infer(context.Background(), w.set, "a", 1, 2, 3)
	require.NoError(t, err)
	assert.Equal(t, []float32{6, 3}, y)
	m, _ := w.set.Model("a")
	assert.Equal(t, "cpu", m.Engine())

	w = newWorld(t, []string{"a"}, func(o *Options) { o.Engines["dev"] = Engine{Engine: downEngine{}} })
	assert.ErrorIs(t, w.set.LoadAll(context.Background()), engine.ErrUnavailable)
}

// breakModel writes a model.yaml no loader takes into name's directory.
func breakModel(t *testing.T, w *world, name string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(w.repo, name, models.ConfigFile), []byte("architecture: nonsense\n"), 0o644))
}

// At start, a bad model stops the load naming every model that failed
// (models.exit_on_error, Triton's default); with KeepGoing the others are
// served, the failed ones listed UNAVAILABLE with their reasons, and
// strict readiness waits for them until they load.
func TestStartWithBadModels(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, []string{"a", "b", "c"})
	breakModel(t, w, "b")
	breakModel(t, w, "c")
	err := w.set.LoadAll(ctx)
	require.Error(t, err)
	assert.ErrorContains(t, err, "2 of 3 models failed to load")
	assert.ErrorContains(t, err, "model b:")
	assert.ErrorContains(t, err, "model c:", "every failed model is named, not only the first")

	for _, strict := range []bool{true, false} {
		w := newWorld(t, []string{"a", "b", "c"}, func(o *Options) { o.KeepGoing, o.StrictReadiness = true, strict })
		breakModel(t, w, "b")
		require.NoError(t, w.set.LoadAll(ctx))
		require.NoError(t, w.set.Warmup(ctx))
		_, err := infer(ctx, w.set, "a", 1, 2, 3)
		require.NoError(t, err, "the good model is served")
		index, err := w.set.Index(ctx)
		require.NoError(t, err)
		require.Len(t, index, 3)
		assert.Equal(t, "READY", index[0].State)
		assert.Equal(t, "UNAVAILABLE", index[1].State)
		assert.Contains(t, index[1].Reason, "invalid model.yaml", "the reason is listed")
		ready, which := w.set.Ready()
		if strict {
			assert.False(t, ready, "strict: a model that failed at start is not ready")
			assert.Equal(t, "b", which)
			require.NoError(t, enginetest.WriteSumMax(filepath.Join(w.repo, "b")))
			require.NoError(t, w.set.Load(ctx, "b"))
			ready, _ = w.set.Ready()
			assert.True(t, ready, "ready once it loads")
		} else {
			assert.True(t, ready, "not strict: ready with the models it has")
		}
	}
}

// A model's ReadyIn is its own load and warm-up, not the loads of the
// models LoadAll read after it before the warm-ups began: a CPU model is
// not reported as taking the seconds a worker engine took to start
// (issue 34). The engine that is slow to start sleeps on synctest's clock.
func TestReadyInIsTheModelsOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		require.NoError(t, enginetest.WriteSumMax(filepath.Join(dir, "a")))
		require.NoError(t, enginetest.WriteSumMax(filepath.Join(dir, "b")))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "b", "model.yaml"), []byte(enginetest.SumMaxYAML+"engine: rbln\n"), 0o644))
		s, err := New(Options{Repository: dir, DefaultEngine: "cpu", Engines: map[string]Engine{
			"cpu":  {Engine: &enginetest.Engine{}},
			"rbln": {Start: func() (engine.Engine, error) { time.Sleep(5 * time.Second); return &enginetest.Engine{}, nil }},
		}})
		require.NoError(t, err)
		defer s.Close()
		require.NoError(t, s.LoadAll(context.Background()))
		require.NoError(t, s.Warmup(context.Background()))
		a, _ := s.Model("a")
		b, _ := s.Model("b")
		assert.Less(t, a.ReadyIn(), time.Second, "a's own load and warm-up")
		assert.GreaterOrEqual(t, b.ReadyIn(), 5*time.Second, "b's includes its engine's start")
	})
}
