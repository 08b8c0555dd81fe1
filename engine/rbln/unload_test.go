package rbln

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// programBytes is what the double's compiled program holds on the device.
const programBytes = 4096

// TestUnloadFreesDeviceMemory: a model's weights and compiled programs
// show in the device memory gauges while it is loaded, and once it is
// closed the gauges return to where they were before it loaded, allocated
// and reserved alike: the worker drops the module and its graphs, resets
// dynamo's cache (which alone releases compiled programs: without the
// reset this test fails by the programs' bytes) and empties the
// allocator's cache. The worker is the real one on an RBLN device emulated on the host
// (testdata/emulated_rbln.py), whose allocator counts the tensors the
// worker placed on it while they live and keeps what they free reserved
// until empty_cache.
func TestUnloadFreesDeviceMemory(t *testing.T) {
	requireTorch(t)
	const baseline = 1 << 20 // what the runtime holds before any model
	e := emulatedEngine(t, map[string]any{"available": true, "device_count": 1, "track_memory": true, "memory_baseline": baseline, "program_bytes": programBytes}, Options{})
	e.mu.Lock()
	require.NoError(t, e.start())
	e.mu.Unlock()
	w := e.workers[0]
	gauges := func() [2]float64 {
		w.pollMemory()
		return [2]float64{
			testutil.ToFloat64(e.metrics.deviceMemory.WithLabelValues("0", "0", "0", "allocated")),
			testutil.ToFloat64(e.metrics.deviceMemory.WithLabelValues("0", "0", "0", "reserved")),
		}
	}
	before := gauges()
	require.Equal(t, [2]float64{baseline, baseline}, before)

	m := loadDigits(t)
	m.Config.DeviceDtype = "bfloat16"
	grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, nil)
	require.NoError(t, err)
	r := warmRunner(t, m, e, grid)
	require.NoError(t, r.Run(context.Background(), []*steps.Request{digitsRequest(3, 1)}))
	// Every weight and bias on the device, in bfloat16.
	weights := 0
	for i, sizes := 0, m.Config.MLP.Sizes; i+1 < len(sizes); i++ {
		weights += 2 * (sizes[i]*sizes[i+1] + sizes[i+1])
	}
	loaded := gauges()
	programs := programBytes * len(grid.Shapes())
	assert.Equal(t, [2]float64{baseline + float64(weights+programs), baseline + float64(weights+programs)}, loaded,
		"the weights and a compiled program per bucket are on the device")

	require.NoError(t, onlyProgram(t, e).Close())
	var after [2]float64
	assert.Eventually(t, func() bool {
		after = gauges()
		return after == before
	}, 30*time.Second, 50*time.Millisecond, "the gauges return to where they were before the load")
	t.Logf("device memory (allocated, reserved): %v before the load, %v loaded, %v after Close", before, loaded, after)
}

// TestUnloadKeepsProgramsOtherModelsShare: dynamo's cache is the worker's,
// so unloading one of two compiled models cannot reset it without dropping
// the other's programs: the first model's weights go, its programs stay
// until the second unloads, and then everything goes
// (issue 33, item 4).
func TestUnloadKeepsProgramsOtherModelsShare(t *testing.T) {
	requireTorch(t)
	const baseline = 1 << 20
	e := emulatedEngine(t, map[string]any{"available": true, "device_count": 1, "track_memory": true, "memory_baseline": baseline, "program_bytes": programBytes}, Options{})
	e.mu.Lock()
	require.NoError(t, e.start())
	e.mu.Unlock()
	w := e.workers[0]
	allocated := func() float64 {
		w.pollMemory()
		return testutil.ToFloat64(e.metrics.deviceMemory.WithLabelValues("0", "0", "0", "allocated"))
	}
	load := func(name string) (*models.Model, engine.Program, int) {
		m := loadDigits(t)
		m.Name = name
		m.Config.DeviceDtype = "bfloat16"
		grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, nil)
		require.NoError(t, err)
		prog, err := e.Load(context.Background(), m, grid.Shapes())
		require.NoError(t, err)
		r, err := steps.New(steps.Options{Model: m, Program: prog, Grid: grid, Engine: e.Name()})
		require.NoError(t, err)
		_, err = r.Warmup(context.Background())
		require.NoError(t, err)
		weights := 0
		for i, sizes := 0, m.Config.MLP.Sizes; i+1 < len(sizes); i++ {
			weights += 2 * (sizes[i]*sizes[i+1] + sizes[i+1])
		}
		return m, prog, weights + programBytes*len(grid.Shapes())
	}
	_, first, n1 := load("digits-a")
	_, second, n2 := load("digits-b")
	require.Equal(t, float64(baseline+n1+n2), allocated())

	require.NoError(t, first.Close())
	programs := programBytes * 4 // the first model's, one a bucket
	assert.Eventually(t, func() bool { return allocated() == float64(baseline+n2+programs) }, 30*time.Second, 50*time.Millisecond,
		"the first model's weights are freed, its programs stay cached beside the second's")
	require.NoError(t, second.Close())
	assert.Eventually(t, func() bool { return allocated() == baseline }, 30*time.Second, 50*time.Millisecond,
		"the last compiled model's unload resets the cache: every program is freed")
}
