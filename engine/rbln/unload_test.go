package rbln

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/steps"
)

// TestUnloadFreesDeviceMemory: a model's weights show in the device memory
// gauges while it is loaded, and once it is closed the gauges return to
// where they were before it loaded, allocated and reserved alike: the
// worker drops the module and its graphs and empties the allocator's
// cache. The worker is the real one on an RBLN device emulated on the host
// (testdata/emulated_rbln.py), whose allocator counts the tensors the
// worker placed on it while they live and keeps what they free reserved
// until empty_cache.
func TestUnloadFreesDeviceMemory(t *testing.T) {
	requireTorch(t)
	path := filepath.Join(t.TempDir(), "scenario.json")
	const baseline = 1 << 20 // what the runtime holds before any model
	scenario(t, path, map[string]any{"available": true, "device_count": 1, "track_memory": true, "memory_baseline": baseline})
	script, err := filepath.Abs("testdata/emulated_rbln.sh")
	require.NoError(t, err)
	// The emulated device is the host's CPU, whose worker computes in
	// float32 unless told to use the model's device_dtype.
	e, _ := newEngine(t, Options{Device: DeviceRBLN, Devices: []string{"0"}, Python: script,
		Env: map[string]string{"PYTHONPATH": fakeRBLN(), "STEPSERVE_FAKE_RBLN_SCENARIO": path, cpuDtypeEnv: "device"}})
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
	assert.Equal(t, [2]float64{baseline + float64(weights), baseline + float64(weights)}, loaded, "the weights are on the device")

	require.NoError(t, onlyProgram(t, e).Close())
	var after [2]float64
	assert.Eventually(t, func() bool {
		after = gauges()
		return after == before
	}, 30*time.Second, 50*time.Millisecond, "the gauges return to where they were before the load")
	t.Logf("device memory (allocated, reserved): %v before the load, %v loaded, %v after Close", before, loaded, after)
}
