package serving

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/models"
)

// TestModelOverTheLimitIsRefusedBeforeItLoads: the estimate (weights from
// the header, the engine's staging) is checked before the weights are
// read or any engine loads them; the error names the estimate and the
// limit.
func TestModelOverTheLimitIsRefusedBeforeItLoads(t *testing.T) {
	// summax: 8 floats of weights (32 B); staging 1x(12+8) + 4x(12+8) = 100 B.
	w := newWorld(t, []string{"a"}, func(o *Options) { o.MaxModelBytes = 100 })
	err := w.set.LoadAll(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "model a: needs about 132 B resident (weights 32 B, engine dev 100 B for 2 buckets), above models.max_model_bytes (100 B)")
	assert.Zero(t, w.dev.Loads(), "nothing reached the engine")

	w = newWorld(t, []string{"a"}, func(o *Options) { o.MaxModelBytes = 132 })
	require.NoError(t, w.set.LoadAll(context.Background()))
	require.NoError(t, w.set.Warmup(context.Background()))
	// A reload on two engines (failover) counts both.
	w.set.opts.Failover = "cpu"
	err = w.set.Load(context.Background(), "a")
	require.ErrorIs(t, err, ErrBadModel)
	assert.Contains(t, err.Error(), "engine dev 100 B for 2 buckets, engine cpu 100 B for 2 buckets")
	m, ok := w.set.Model("a")
	require.True(t, ok)
	assert.True(t, m.Ready(), "the served version keeps serving")
}

// sized is a fake engine that says what it would allocate.
type sized struct {
	*enginetest.Engine
	bytes int64
}

func (s sized) ResidentBytes(*models.Config, []bucketing.Shape) int64 { return s.bytes }

func TestEngineEstimateIsUsedWhenItHasOne(t *testing.T) {
	w := newWorld(t, []string{"a"}, func(o *Options) {
		o.MaxModelBytes = 1 << 20
		o.Engines["dev"] = Engine{Engine: sized{&enginetest.Engine{Label: "dev"}, 2 << 20}}
	})
	err := w.set.LoadAll(context.Background())
	assert.ErrorContains(t, err, "engine dev 2 MiB for 2 buckets), above models.max_model_bytes (1 MiB)")
}

func TestDefaultLimitIsHalfTheMemoryLimit(t *testing.T) {
	l := newModelLimit(0)
	assert.Positive(t, l.bytes)
	assert.Contains(t, l.why, "half the ")
	assert.Equal(t, modelLimit{3 << 30, "3 GiB"}, newModelLimit(3<<30))
}

// TestLoadTimeoutBoundsALoad: a load that does not finish in time is a
// load error naming the timeout; the served version keeps serving, and a
// load or unload waiting behind a stuck one gives up at its own deadline.
func TestLoadTimeoutBoundsALoad(t *testing.T) {
	w := newWorld(t, []string{"a", "b"}, func(o *Options) { o.LoadTimeout = 50 * time.Millisecond })
	ctx := context.Background()
	require.NoError(t, w.set.LoadAll(ctx))
	require.NoError(t, w.set.Warmup(ctx))
	old, _ := w.set.Model("a")

	w.dev.LoadGate = make(chan struct{}) // every engine load hangs
	defer close(w.dev.LoadGate)
	err := w.set.Load(ctx, "a")
	require.ErrorIs(t, err, ErrBadModel)
	assert.ErrorContains(t, err, "the load did not finish within models.load_timeout (50ms)")
	now, _ := w.set.Model("a")
	assert.Same(t, old, now)

	// Behind a stuck load, an unload gives up when its caller does.
	w.set.opts.LoadTimeout = time.Hour
	done := make(chan error, 1)
	go func() { done <- w.set.Load(ctx, "a") }()
	require.Eventually(t, func() bool { return w.dev.Loads() == 4 }, 5*time.Second, time.Millisecond)
	uctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	err = w.set.Unload(uctx, "b")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "another load or unload is still running")
	_, ok := w.set.Model("b")
	assert.True(t, ok, "b is still served")
	w.set.Drain(ctx) // cancels the stuck load
	assert.ErrorIs(t, <-done, context.Canceled)
}

// panicky is a fake engine whose Load panics, as a bug would.
type panicky struct{ *enginetest.Engine }

func (panicky) Load(_ context.Context, m *models.Model, _ []bucketing.Shape) (engine.Program, error) {
	var inputs []models.Tensor
	_ = inputs[len(m.Name)] // an index out of range: a runtime panic, as a bug would be
	return nil, nil
}

func TestPanicInALoadIsALoadError(t *testing.T) {
	w := newWorld(t, []string{"a"}, func(o *Options) {
		o.Engines["rbln"] = Engine{Engine: panicky{&enginetest.Engine{Label: "rbln"}}}
	})
	ctx := context.Background()
	require.NoError(t, w.set.LoadAll(ctx))
	require.NoError(t, w.set.Warmup(ctx))

	require.NoError(t, enginetest.WriteSumMax(filepath.Join(w.repo, "b")))
	require.NoError(t, os.WriteFile(filepath.Join(w.repo, "b", models.ConfigFile), []byte(enginetest.SumMaxYAML+"engine: rbln\n"), 0o644))
	err := w.set.Load(ctx, "b")
	require.ErrorIs(t, err, ErrBadModel)
	assert.ErrorContains(t, err, "model b: the load failed on an internal error (logged)")
	assert.Equal(t, "UNAVAILABLE", state(t, w.set, "b").State)

	// The set is whole: the lock was released, a also reloads.
	require.NoError(t, w.set.Load(ctx, "a"))
	_, err = infer(ctx, w.set, "a", 1, 2, 3)
	assert.NoError(t, err)

	// At start-up too.
	fresh := newWorld(t, []string{"b"}, func(o *Options) {
		o.Engines["rbln"] = Engine{Engine: panicky{&enginetest.Engine{Label: "rbln"}}}
	})
	require.NoError(t, os.WriteFile(filepath.Join(fresh.repo, "b", models.ConfigFile), []byte(enginetest.SumMaxYAML+"engine: rbln\n"), 0o644))
	assert.ErrorContains(t, fresh.set.LoadAll(ctx), "the load failed on an internal error")
}

// TestHostileFilesAreLoadErrors: a FIFO or a link out of the repository
// is a load error at once; the error names the file by its path in the
// repository.
func TestHostileFilesAreLoadErrors(t *testing.T) {
	w := newWorld(t, []string{"a", "fifo", "link"})
	ctx := context.Background()
	require.NoError(t, os.Remove(filepath.Join(w.repo, "fifo", models.ConfigFile)))
	require.NoError(t, syscall.Mkfifo(filepath.Join(w.repo, "fifo", models.ConfigFile), 0o644))
	require.NoError(t, os.Remove(filepath.Join(w.repo, "link", models.WeightsFile)))
	require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(w.repo, "link", models.WeightsFile)))

	err := w.set.Load(ctx, "fifo")
	require.ErrorIs(t, err, ErrBadModel)
	assert.ErrorContains(t, err, "fifo/model.yaml: not a regular file (a FIFO)")
	err = w.set.Load(ctx, "link")
	require.ErrorIs(t, err, ErrBadModel)
	assert.ErrorContains(t, err, "link/weights.safetensors: a symbolic link out of the model repository")
	for _, e := range []string{state(t, w.set, "fifo").Reason, state(t, w.set, "link").Reason, err.Error()} {
		assert.False(t, strings.Contains(e, w.repo), "%q shows the repository's path", e)
	}
	require.NoError(t, w.set.Load(ctx, "a"))

	err = w.set.Load(ctx, "missing")
	assert.ErrorIs(t, err, ErrUnknownModel)
	assert.ErrorContains(t, err, "the repository has no missing/model.yaml")
}

// TestModelsTogetherStayWithinTheLimit: the limit bounds every served
// model together; a reload counts the old version until it is replaced.
func TestModelsTogetherStayWithinTheLimit(t *testing.T) {
	// Each summax holds about 132 B.
	w := newWorld(t, []string{"a", "b", "c"}, func(o *Options) { o.MaxModelBytes = 300 })
	err := w.set.LoadAll(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "model c: needs about 132 B resident, and the 2 models served hold about 264 B: 396 B together, above models.max_model_bytes (300 B)")

	w = newWorld(t, []string{"a", "b"}, func(o *Options) { o.MaxModelBytes = 300 })
	require.NoError(t, w.set.LoadAll(context.Background()))
	require.NoError(t, w.set.Warmup(context.Background()))
	assert.ErrorContains(t, w.set.Load(context.Background(), "a"), "396 B together", "a reload needs room for both versions")
	require.NoError(t, w.set.Unload(context.Background(), "b"))
	require.NoError(t, w.set.Load(context.Background(), "a"), "room enough once b is gone")
}
