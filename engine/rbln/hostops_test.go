package rbln

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/steps"
)

// hostOpsEngine is an engine on the emulated RBLN device whose compiled
// programs report the scenario's host operators when inspected, compiling
// into cacheDir ("" for none).
func hostOpsEngine(t *testing.T, hostOps map[string]string, cacheDir string) *Engine {
	t.Helper()
	// explain() sees a clean step: one copy each way, nothing else.
	s := map[string]any{"available": true, "device_count": 1,
		"verdict": map[string]any{"clean": true, "reasons": []string{}},
		"dump": map[string]any{
			"hidden_host_bounce": map[string]any{"by_site": map[string]any{}, "total_count": 0, "total_bytes": 0},
			"runtime":            map[string]any{"by_primitive": map[string]any{"h2v": map[string]any{"calls": 1, "ns": 700}, "v2h": map[string]any{"calls": 1, "ns": 900}}},
			"runtime_residency":  map[string]any{"available": true, "total_count": 0},
		}}
	if hostOps != nil {
		s["host_op_reason"] = hostOps
	}
	return emulatedEngine(t, s, Options{CompileCacheDir: cacheDir})
}

// TestHostOpsInCompiledProgram: an operator the compiler split out of a
// bucket's program to run on the host is invisible to explain() (the
// double's regions are clean), but inspecting the program's artifact
// names it (issue 33, item 7): every step of the bucket fires the host_op
// signal naming the operator and the compiler's reason, and strict
// warm-up refuses the model.
func TestHostOpsInCompiledProgram(t *testing.T) {
	requireTorch(t)
	e := hostOpsEngine(t, map[string]string{"aten::sort": "int64 input is not supported on the device"}, t.TempDir())
	m := loadDigits(t)
	m.Config.DeviceDtype = "bfloat16" // the host's torch has no float16 matmul
	grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, nil)
	require.NoError(t, err)

	prog, _, err := loadAndWarm(t, e, m, grid, true)
	require.Error(t, err, "strict warm-up refuses a program with host operators")
	assert.Contains(t, err.Error(), "host_op: the compiled program runs 1 operator(s) on the host: aten::sort (int64 input is not supported on the device)")

	// Each step of the bucket, doorbell ones included, carries them.
	for run := range 3 {
		x, err := prog.Step(context.Background(), 0)
		require.NoError(t, err)
		assert.Equal(t, engine.Count(1), x.HostOps, "run %d", run)
		assert.Equal(t, map[string]string{"aten::sort": "int64 input is not supported on the device"}, x.HostOpReasons)
		v := steps.Check(&x)
		assert.False(t, v.Clean, "explain() said clean, the program says otherwise")
		assert.Equal(t, int64(1), v.Fired[steps.HostOp])
	}
}

// TestHostOpsCleanAndUnknown: a program without host operators reads 0
// (inspected, none), each bucket's artifacts in a directory of their own;
// without a compile cache directory the programs cannot be found, and
// their host operators are unknown, never zero.
func TestHostOpsCleanAndUnknown(t *testing.T) {
	requireTorch(t)
	cache := t.TempDir()
	for _, tc := range []struct {
		name string
		dir  string
		want engine.Count
	}{{"inspected", cache, 0}, {"no cache dir", "", engine.Unknown}} {
		t.Run(tc.name, func(t *testing.T) {
			e := hostOpsEngine(t, nil, tc.dir)
			m := loadDigits(t)
			m.Config.DeviceDtype = "bfloat16"
			grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, nil)
			require.NoError(t, err)
			r := warmRunner(t, m, e, grid) // strict or not, nothing fires
			require.NoError(t, r.Run(context.Background(), []*steps.Request{digitsRequest(2, 1)}))
			x, err := onlyProgram(t, e).Step(context.Background(), 0)
			require.NoError(t, err)
			assert.Equal(t, tc.want, x.HostOps)
			assert.True(t, steps.Check(&x).Clean || !x.HostOps.Known(), x.Reasons)
		})
	}
	artifacts, err := filepath.Glob(filepath.Join(cache, "*", "b*", "*.rbln"))
	require.NoError(t, err)
	dirs := map[string]bool{}
	for _, a := range artifacts {
		dirs[filepath.Dir(a)] = true
	}
	grid, _ := bucketing.NewGrid(loadDigits(t).Config.Buckets.Batch, nil)
	assert.Len(t, dirs, len(grid.Shapes()), "one artifact directory a bucket: %v", artifacts)
}
