package serving

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/steps"
)

// replicated is a world whose model "a" is loaded as instances says, on a
// fake device engine with devices 0 and 1.
func replicated(t *testing.T, instances string, opts ...option) *world {
	t.Helper()
	w := newWorld(t, []string{"a"}, opts...)
	w.dev.Devices = []string{"0", "1"}
	require.NoError(t, os.WriteFile(filepath.Join(w.repo, "a", "model.yaml"),
		[]byte(enginetest.SumMaxYAML+"instances: "+instances+"\n"), 0o644))
	return w
}

// hold makes every step of the engine after warm-up wait until release
// is closed, telling entered which program it runs on.
func hold(e *enginetest.Engine) (entered chan *enginetest.Program, release chan struct{}) {
	entered, release = make(chan *enginetest.Program, 16), make(chan struct{})
	e.BeforeStep = func(p *enginetest.Program, _ int) {
		entered <- p
		<-release
	}
	return entered, release
}

func TestReplicasLoadOnEveryDevice(t *testing.T) {
	w := replicated(t, "{devices: all, per_device: 2}")
	w.ready(t)
	m, _ := w.set.Model("a")
	progs := w.dev.Programs()
	require.Len(t, progs, 4)
	var devices []string
	for _, p := range progs {
		devices = append(devices, p.Device())
		assert.Equal(t, 4, p.Steps(), "every replica is warmed up: two buckets twice")
	}
	assert.Equal(t, []string{"0", "1", "0", "1"}, devices)
	total, healthy := m.Backend().Replicas()
	assert.Equal(t, [2]int{4, 4}, [2]int{total, healthy})
	assert.True(t, m.Ready())
	y, err := infer(context.Background(), w.set, "a", 1, 5, 3)
	require.NoError(t, err)
	assert.Equal(t, []float32{9, 5}, y)

	require.NoError(t, testutil.GatherAndCompare(w.reg, stringsReader(`
# HELP stepserve_model_replicas Replicas the model is loaded as on its engine (model.yaml's instances: devices x per_device).
# TYPE stepserve_model_replicas gauge
stepserve_model_replicas{engine="dev",model="a"} 4
# HELP stepserve_model_replicas_healthy Replicas of the model whose device is up now; the model is ready with at least instances.min_ready of them (or a failover engine).
# TYPE stepserve_model_replicas_healthy gauge
stepserve_model_replicas_healthy{engine="dev",model="a"} 4
`), "stepserve_model_replicas", "stepserve_model_replicas_healthy"))
}

// A device the engine does not have is a load error that names the ones
// it has; min_ready above what devices: all places is refused at load.
func TestReplicasOnDevicesTheEngineLacks(t *testing.T) {
	w := replicated(t, "{devices: [0, 7]}")
	err := w.set.LoadAll(context.Background())
	require.Error(t, err)
	assert.ErrorContains(t, err, `instances.devices: engine dev has no device "7"; its devices are 0, 1`)

	w = replicated(t, "{devices: all, min_ready: 3}")
	err = w.set.LoadAll(context.Background())
	assert.ErrorContains(t, err, "instances.min_ready: 3 is more than the 2 replicas placed on engine dev (0, 1)")
}

// The model is ready while at least min_ready replicas are healthy, and
// serves from the healthy ones.
func TestReadinessFollowsMinReady(t *testing.T) {
	w := replicated(t, "{devices: all, per_device: 2, min_ready: 2}")
	w.ready(t)
	m, _ := w.set.Model("a")
	progs := w.dev.Programs()
	ctx := context.Background()

	progs[0].SetHealthy(false)
	progs[1].SetHealthy(false)
	assert.True(t, m.Ready(), "two of four healthy: min_ready 2")
	assert.Equal(t, 2.0, gauge(t, w, "stepserve_model_replicas_healthy"))
	before := progs[2].Steps() + progs[3].Steps()
	for range 6 {
		y, err := infer(ctx, w.set, "a", 1, 2, 3)
		require.NoError(t, err)
		assert.Equal(t, []float32{6, 3}, y)
	}
	assert.Equal(t, before+6, progs[2].Steps()+progs[3].Steps(), "every step ran on a healthy replica")

	progs[2].SetHealthy(false)
	assert.False(t, m.Ready(), "one healthy, two needed")
	assert.Equal(t, "LOADING", state(t, w.set, "a").State)
	_, err := infer(ctx, w.set, "a", 1, 2, 3)
	assert.NoError(t, err, "not ready, but the healthy replica still answers what reaches it")

	progs[3].SetHealthy(false)
	_, err = infer(ctx, w.set, "a", 1, 2, 3)
	assert.ErrorIs(t, err, engine.ErrUnavailable, "no replica left: the step says why")

	progs[0].SetHealthy(true)
	progs[1].SetHealthy(true)
	assert.True(t, m.Ready())
}

// gauge reads one of the set's gauges for model a.
func gauge(t *testing.T, w *world, name string) float64 {
	t.Helper()
	mfs, err := w.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "model" && l.GetValue() == "a" {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s for model a", name)
	return 0
}

// A batch whose replica turns out to be down runs again on another one:
// its requests are answered, never twice.
func TestBatchMovesToAnotherReplicaWhenItsDeviceGoes(t *testing.T) {
	w := replicated(t, "{devices: [0, 1]}")
	w.ready(t)
	progs := w.dev.Programs()
	ctx := context.Background()
	// The device fails the step while the program still says healthy:
	// a worker that died under the step.
	progs[0].Fail(engine.ErrUnavailable)
	progs[1].Fail(engine.ErrUnavailable)
	_, err := infer(ctx, w.set, "a", 1, 2, 3)
	assert.ErrorIs(t, err, engine.ErrUnavailable, "both gone: the error, after one retry")

	assert.Equal(t, [2]int{1, 1}, [2]int{progs[0].Failed(), progs[1].Failed()}, "tried once on each")

	// Replica 0 still says it is healthy, so it gets its turn; each batch
	// it fails runs again on 1.
	progs[1].Fail(nil)
	for range 4 {
		y, err := infer(ctx, w.set, "a", 1, 2, 3)
		require.NoError(t, err)
		assert.Equal(t, []float32{6, 3}, y)
	}
	assert.Equal(t, 4+4, progs[1].Steps(), "warm-up, then all four")
	assert.Greater(t, progs[0].Failed(), 1, "some of the four were tried on 0 first")
}

// A batch whose step took its device down (engine.ErrStepLost) is
// answered with the error and never run on another replica: its input may
// have been the cause, and would take the next device down too.
func TestBatchThatTookItsDeviceDownIsNotReplayed(t *testing.T) {
	w := replicated(t, "{devices: [0, 1]}")
	w.ready(t)
	progs := w.dev.Programs()
	lost := fmt.Errorf("%w: %w", engine.ErrStepLost, engine.ErrUnavailable)
	progs[0].Fail(lost)
	progs[1].Fail(lost)
	_, err := infer(context.Background(), w.set, "a", 1, 2, 3)
	assert.ErrorIs(t, err, engine.ErrStepLost)
	assert.Equal(t, 1, progs[0].Failed()+progs[1].Failed(), "run once, on one replica")
}

// Two batches run at once on two replicas: the fake engine's step hook
// sees both steps inside it before either is let go.
func TestTwoReplicasStepAtOnce(t *testing.T) {
	w := replicated(t, "{devices: all}")
	w.ready(t)
	entered, release := hold(w.dev)
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			y, err := infer(ctx, w.set, "a", 1, 2, 3)
			assert.NoError(t, err)
			assert.Equal(t, []float32{6, 3}, y)
		})
	}
	seen := map[*enginetest.Program]bool{}
	for range 2 {
		select {
		case p := <-entered:
			seen[p] = true
		case <-time.After(30 * time.Second):
			t.Fatal("the second batch did not start while the first was stepping")
		}
	}
	assert.Len(t, seen, 2, "one step on each replica")
	close(release)
	wg.Wait()
}

// The least-loaded healthy replica takes the batch: with one replica
// busy, the next batch goes to the idle one on the other device; an
// unhealthy one is passed over however idle.
func TestDispatcherPicksTheLeastLoadedHealthyReplica(t *testing.T) {
	w := replicated(t, "{devices: all, per_device: 2}")
	w.ready(t)
	m, _ := w.set.Model("a")
	progs := w.dev.Programs() // devices 0, 1, 0, 1
	entered, release := hold(w.dev)
	progs[1].SetHealthy(false)

	var wg sync.WaitGroup
	run := func() *enginetest.Program {
		wg.Go(func() {
			assert.NoError(t, m.replicas.Run(context.Background(), []*steps.Request{summaxRequest()}))
		})
		select {
		case p := <-entered:
			return p
		case <-time.After(30 * time.Second):
			t.Fatal("no replica took the batch")
			return nil
		}
	}
	first := run()
	second := run()
	third := run()
	assert.NotEqual(t, first.Device(), second.Device(), "the second batch goes to the idle device")
	assert.NotSame(t, progs[1], first)
	assert.NotSame(t, progs[1], second)
	assert.NotSame(t, progs[1], third, "never the unhealthy replica")
	assert.Len(t, map[*enginetest.Program]bool{first: true, second: true, third: true}, 3, "three batches on three replicas")
	close(release)
	wg.Wait()
}

func summaxRequest() *steps.Request {
	return &steps.Request{Rows: 1, Inputs: [][]byte{make([]byte, 12)}, Outputs: [][]byte{make([]byte, 8)}}
}

// With a failover engine, the model fails over only once no replica is
// left, and the failover engine holds one replica whatever instances say.
func TestReplicasWithFailover(t *testing.T) {
	w := replicated(t, "{devices: all}", withFailover)
	w.ready(t)
	m, _ := w.set.Model("a")
	require.Len(t, w.cpu.Programs(), 1, "one replica on the failover engine")
	progs := w.dev.Programs()
	ctx := context.Background()
	progs[0].SetHealthy(false)
	_, err := infer(ctx, w.set, "a", 1, 2, 3)
	require.NoError(t, err)
	assert.Equal(t, 4, w.cpu.Last().Steps(), "a replica is left: no failover")
	progs[1].SetHealthy(false)
	assert.True(t, m.Ready())
	_, err = infer(ctx, w.set, "a", 1, 2, 3)
	require.NoError(t, err)
	assert.Equal(t, 5, w.cpu.Last().Steps(), "none left: the failover engine serves")
}

// Each replica's staging counts toward the model's memory, and the
// failover engine's one replica once.
func TestReplicasCountTowardTheModelsMemory(t *testing.T) {
	// summax: weights 32 B; one replica's staging 100 B.
	w := replicated(t, "{devices: all, per_device: 2}", func(o *Options) { o.MaxModelBytes = 400 })
	err := w.set.LoadAll(context.Background())
	require.Error(t, err)
	assert.ErrorContains(t, err, "needs about 432 B resident (weights 32 B, engine dev 400 B for 2 buckets on 4 replicas)")
	assert.Zero(t, w.dev.Loads())

	w = replicated(t, "{devices: all}", withFailover, func(o *Options) { o.MaxModelBytes = 300 })
	err = w.set.LoadAll(context.Background())
	assert.ErrorContains(t, err, "needs about 332 B resident (weights 32 B, engine dev 200 B for 2 buckets on 2 replicas, engine cpu 100 B for 2 buckets)")
}
