package rbln

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
)

// rblnOnThisMachine is an rbln engine whose workers see the torch_rbln test
// double scripted by scenario (or no torch_rbln at all, for nil).
func rblnOnThisMachine(t *testing.T, s map[string]any, opts Options) *Engine {
	opts.Device = DeviceRBLN
	opts.RestartBackoff = time.Hour // a failed start stays failed, for the test to read
	if s != nil {
		path := filepath.Join(t.TempDir(), "scenario.json")
		scenario(t, path, s)
		opts.Env = map[string]string{"PYTHONPATH": fakeRBLN(), "STEPSERVE_FAKE_RBLN_SCENARIO": path}
	}
	e, _ := newEngine(t, opts)
	return e
}

// TestRBLNRefusesToServeFromTheHost: a worker of the rbln engine that has no
// RBLN device refuses the model, and says why, instead of computing on the
// host under the rbln name.
func TestRBLNRefusesToServeFromTheHost(t *testing.T) {
	requireTorch(t)
	for _, tc := range []struct {
		name     string
		scenario map[string]any
		devices  []string
		want     []string
	}{
		{"without torch_rbln", nil, nil,
			[]string{"engine rbln computes only on an RBLN device", "torch_rbln is not importable"}},
		{"no device visible", map[string]any{"available": false}, []string{"3"},
			[]string{"torch.rbln.is_available() is False", "RBLN_VISIBLE_DEVICES=3"}},
		{"a torch without the rbln device type", map[string]any{"available": true}, nil,
			[]string{"torch has no rbln device type"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := rblnOnThisMachine(t, tc.scenario, Options{Devices: tc.devices})
			_, err := e.Load(context.Background(), loadDigits(t), []bucketing.Shape{{Batch: 1}})
			require.Error(t, err)
			for _, w := range tc.want {
				assert.ErrorContains(t, err, w)
			}
			assert.NotErrorIs(t, err, engine.ErrUnavailable, "the worker is up; it refuses the model")
			assert.Equal(t, "rbln", e.Name())
		})
	}
}

// TestRBLNWorkerSeeingOtherThanOneDeviceFailsToStart: each worker drives one
// logical device, so a worker that sees two fails its start with an error
// that says how to configure it.
func TestRBLNWorkerSeeingOtherThanOneDeviceFailsToStart(t *testing.T) {
	requireTorch(t)
	e := rblnOnThisMachine(t, map[string]any{"available": true, "device_count": 2}, Options{Devices: []string{"0,1"}})
	_, err := e.Load(context.Background(), loadDigits(t), []bucketing.Shape{{Batch: 1}})
	require.Error(t, err)
	assert.ErrorIs(t, err, engine.ErrUnavailable)
	assert.ErrorContains(t, err, "the worker for RBLN_VISIBLE_DEVICES=0,1 sees 2 logical RBLN devices (torch.rbln.device_count()), want 1")
	assert.ErrorContains(t, err, "RBLN_NPUS_PER_DEVICE")
}

// syncBuffer is a log destination a test reads while workers write it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRBLNHelloIsLoggedAndMemoryRead: the worker's view of its devices is in
// the log at info, and an rbln worker reads its device memory even before
// a model is loaded on it.
func TestRBLNHelloIsLoggedAndMemoryRead(t *testing.T) {
	requireTorch(t)
	path := filepath.Join(t.TempDir(), "scenario.json")
	scenario(t, path, map[string]any{"available": true, "device_count": 1, "physical_device_count": 1,
		"device_summary": "| rbln:0 | [ 0 ] | Active |", "memory": map[string]any{"npu.0.chiplet.0.allocated.current": 2048,
			"npu.0.chiplet.0.active.current": 4096, "npu.0.chiplet.0.cached.current": 512,
			"npu.0.chiplet.0.num_ooms": 3, "npu.0.chiplet.0.num_alloc_retries": 1}})
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	e, err := New(Options{Device: DeviceRBLN, Python: python, Devices: []string{"0"}, RestartBackoff: time.Hour, Registerer: reg,
		Env:    map[string]string{"PYTHONPATH": fakeRBLN(), "STEPSERVE_FAKE_RBLN_SCENARIO": path},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	_, err = e.Load(context.Background(), loadDigits(t), []bucketing.Shape{{Batch: 1}})
	require.Error(t, err, "this torch has no rbln device type")
	out := logs.String()
	assert.Contains(t, out, `level=INFO msg="rbln worker handshake" engine=rbln device=0`)
	assert.Contains(t, out, `device_kind=rbln device_count=1 physical_device_count=1 device_summary="| rbln:0 | [ 0 ] | Active |"`)
	e.workers[0].pollMemory()
	assert.Equal(t, 2048.0, testutil.ToFloat64(e.metrics.deviceMemory.WithLabelValues("0", "0", "0", "allocated")))
	assert.Equal(t, 4096.0, testutil.ToFloat64(e.metrics.deviceMemory.WithLabelValues("0", "0", "0", "active")))
	assert.Equal(t, 512.0, testutil.ToFloat64(e.metrics.deviceMemory.WithLabelValues("0", "0", "0", "cached")))
	assert.Equal(t, 3.0, testutil.ToFloat64(e.metrics.deviceEvents.WithLabelValues("0", "0", "0", "ooms")), "num_ooms")
	assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.deviceEvents.WithLabelValues("0", "0", "0", "alloc_retries")))
	assert.Zero(t, testutil.ToFloat64(e.metrics.memoryAge.WithLabelValues("0")), "an idle worker reads its memory live")
	n, err := testutil.GatherAndCount(reg, "stepserve_worker_up")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
}

// TestWorkerDevices: the rbln engine takes its devices from configuration,
// else from the server's RBLN_VISIBLE_DEVICES (the pod's, one worker per
// device), else device 0; the torch engine runs one worker on the CPU, or
// as many as it is given.
func TestWorkerDevices(t *testing.T) {
	for _, tc := range []struct {
		name, env string
		opts      Options
		want      []string
		err       string
	}{
		{"default", "", Options{}, []string{"0"}, ""},
		{"from the pod", " 2, 3 ", Options{}, []string{"2", "3"}, ""},
		{"configured wins", "2,3", Options{Devices: []string{"1"}}, []string{"1"}, ""},
		{"torch", "2,3", Options{Device: DeviceCPU}, []string{"cpu"}, ""},
		{"torch, one worker", "", Options{Device: DeviceCPU, Workers: 1}, []string{"cpu"}, ""},
		{"torch, three workers", "", Options{Device: DeviceCPU, Workers: 3}, []string{"cpu0", "cpu1", "cpu2"}, ""},
		{"torch, too many workers", "", Options{Device: DeviceCPU, Workers: 65}, nil, "the torch engine's workers: 65; want 1..64"},
		{"rbln takes no worker count", "", Options{Workers: 2}, nil, "the rbln engine runs a worker per device (rbln.devices)"},
		{"torch takes no devices", "", Options{Device: DeviceCPU, Devices: []string{"0"}}, nil, "the torch engine computes on the host CPU and takes no RBLN devices"},
		{"unknown device kind", "", Options{Device: "gpu"}, nil, `rbln: device "gpu"; want rbln (an RBLN NPU) or cpu (the host CPU)`},
		{"groups of the pod's NPUs", "0,1,2,3,4", Options{NPUsPerDevice: 2}, []string{"0,1", "2,3"}, ""},
		{"one group, no pod list", "", Options{NPUsPerDevice: 4}, []string{"0,1,2,3"}, ""},
		{"too few NPUs for a group", "0", Options{NPUsPerDevice: 2}, nil, "rbln.npus_per_device is 2, but the server's RBLN_VISIBLE_DEVICES lists 1 NPUs"},
		{"groups are configured in rbln.devices", "", Options{NPUsPerDevice: 2, Devices: []string{"0"}}, nil, "write its groups there"},
		{"configured groups", "", Options{Devices: []string{"0,1", "2,3"}}, []string{"0,1", "2,3"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(visibleDevices, tc.env)
			t.Setenv(legacyVisibleDevices, "")
			e, err := New(tc.opts)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, e.opts.Devices)
		})
	}
}

// The older RBLN_DEVICES is the pod's list where RBLN_VISIBLE_DEVICES is
// absent (issue 33, item 1).
func TestWorkerDevicesFromLegacyVariable(t *testing.T) {
	t.Setenv(visibleDevices, "")
	t.Setenv(legacyVisibleDevices, "4,5")
	e, err := New(Options{})
	require.NoError(t, err)
	assert.Equal(t, []string{"4", "5"}, e.opts.Devices)
	t.Setenv(visibleDevices, "1")
	e, err = New(Options{})
	require.NoError(t, err)
	assert.Equal(t, []string{"1"}, e.opts.Devices, "RBLN_VISIBLE_DEVICES wins")
}

// An RSD group's worker sees its NPUs, grouped into one logical device
// before its first device use, and is told how many NPUs to compile for;
// a worker that does not see the group as one device of that many NPUs
// fails its start (issue 33, item 1).
func TestRBLNGroupWorker(t *testing.T) {
	e, err := New(Options{Devices: []string{"2,3"}})
	require.NoError(t, err)
	var got []string
	for _, kv := range (&worker{device: "2,3", e: e}).env() {
		for _, k := range []string{visibleDevices, npusPerDeviceEnv, groupSizeEnv} {
			if strings.HasPrefix(kv, k+"=") {
				got = append(got, kv)
			}
		}
	}
	assert.Subset(t, got, []string{"RBLN_VISIBLE_DEVICES=2,3", "RBLN_NPUS_PER_DEVICE=2", "STEPSERVE_WORKER_NPUS=2"})
	// The pod's own grouping does not regroup a worker's device.
	t.Setenv(npusPerDeviceEnv, "4")
	t.Setenv(deviceMapEnv, "[0,1],[2,3]")
	var single []string
	for _, kv := range (&worker{device: "1", e: e}).env() {
		if strings.HasPrefix(kv, "RBLN_") {
			single = append(single, kv)
		}
	}
	assert.Equal(t, []string{"RBLN_VISIBLE_DEVICES=1"}, single, "a single NPU: no grouping variable at all (Rebel100's cards group themselves)")

	requireTorch(t)
	// The double groups the visible NPUs as the runtime does: one logical
	// device of two NPUs, so the worker starts (and is then refused by
	// this torch, which has no rbln device type).
	var logs syncBuffer
	path := filepath.Join(t.TempDir(), "scenario.json")
	scenario(t, path, map[string]any{"available": true})
	g, err := New(Options{Device: DeviceRBLN, Python: python, Devices: []string{"0,1"}, RestartBackoff: time.Hour,
		Env:    map[string]string{"PYTHONPATH": fakeRBLN(), "STEPSERVE_FAKE_RBLN_SCENARIO": path},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	require.NoError(t, err)
	t.Cleanup(func() { g.Close() })
	_, err = g.Load(context.Background(), loadDigits(t), []bucketing.Shape{{Batch: 1}})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "physical NPUs")
	assert.Contains(t, logs.String(), "device_count=1 physical_device_count=2")
	assert.Contains(t, logs.String(), "RSD group of 2 NPUs")
	assert.Contains(t, logs.String(), "rbln:0 | [0, 1]")

	// A runtime that did not group them: two logical devices.
	bad := rblnOnThisMachine(t, map[string]any{"available": true, "device_count": 1, "physical_device_count": 1}, Options{Devices: []string{"0,1"}})
	_, err = bad.Load(context.Background(), loadDigits(t), []bucketing.Shape{{Batch: 1}})
	require.Error(t, err)
	assert.ErrorContains(t, err, "the worker for the RSD group RBLN_VISIBLE_DEVICES=0,1 sees 1 physical NPUs (torch.rbln.physical_device_count()), want 2")
}

// TestWorkerEnvironment: an rbln worker is given its own device, however
// the server's RBLN_VISIBLE_DEVICES reads; a torch worker is given none;
// torch-rbln's log level is in its own names.
func TestWorkerEnvironment(t *testing.T) {
	t.Setenv(visibleDevices, "2,3")
	env := func(opts Options, device string) []string {
		e, err := New(opts)
		require.NoError(t, err)
		var out []string
		for _, kv := range (&worker{device: device, e: e}).env() {
			if strings.HasPrefix(kv, visibleDevices+"=") || strings.HasPrefix(kv, "TORCH_RBLN_LOG_LEVEL=") {
				out = append(out, kv)
			}
		}
		return out
	}
	rbln := env(Options{}, "3")
	assert.Equal(t, "RBLN_VISIBLE_DEVICES=3", rbln[len(rbln)-2], "the last value is the one the worker sees")
	assert.Contains(t, rbln, "TORCH_RBLN_LOG_LEVEL=WARNING")
	torch := env(Options{Device: DeviceCPU, LogLevel: LogLevel(slog.LevelDebug)}, "cpu")
	assert.Equal(t, []string{"RBLN_VISIBLE_DEVICES=2,3", "TORCH_RBLN_LOG_LEVEL=DEBUG"}, torch, "only the server's own")

	var levels []string
	for _, l := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
		levels = append(levels, LogLevel(l))
	}
	assert.Equal(t, []string{"DEBUG", "INFO", "WARNING", "ERROR"}, levels)
}

// TestBothEnginesShareARegistry: the rbln and torch engines each export the
// worker metrics, labelled with their name.
func TestBothEnginesShareARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, d := range []string{DeviceRBLN, DeviceCPU} {
		_, err := New(Options{Device: d, Registerer: reg})
		require.NoError(t, err)
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var series []string
	for _, mf := range mfs {
		if mf.GetName() != "stepserve_worker_up" {
			continue
		}
		for _, m := range mf.Metric {
			var labels []string
			for _, l := range m.Label {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			series = append(series, strings.Join(labels, ","))
		}
	}
	slices.Sort(series)
	assert.Equal(t, []string{"device=0,engine=rbln", "device=cpu,engine=torch"}, series)
}
