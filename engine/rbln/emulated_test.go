package rbln

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// emulatedEngine is an rbln engine whose workers run on the RBLN device
// the test double emulates on the host (testdata/emulated_rbln.py),
// scripted by scenario s; opts adds devices (default one, "0") and the
// compile cache. The emulated device is the host's CPU, whose worker
// computes in float32 unless told to use the model's device_dtype: it is
// told to.
func emulatedEngine(t *testing.T, s map[string]any, opts Options) *Engine {
	t.Helper()
	path := filepath.Join(t.TempDir(), "scenario.json")
	scenario(t, path, s)
	script, err := filepath.Abs("testdata/emulated_rbln.sh")
	require.NoError(t, err)
	opts.Device, opts.Python = DeviceRBLN, script
	if opts.Devices == nil {
		opts.Devices = []string{"0"}
	}
	opts.Env = map[string]string{"PYTHONPATH": fakeRBLN(), "STEPSERVE_FAKE_RBLN_SCENARIO": path, cpuDtypeEnv: "device"}
	e, _ := newEngine(t, opts)
	return e
}

// loadAndWarm loads m on e over grid's shapes and warms it up (strictly
// where asked), closing the program when the test ends; the warm-up's
// error is the test's to judge.
func loadAndWarm(t *testing.T, e engine.Engine, m *models.Model, grid *bucketing.Grid, strict bool) (engine.Program, *steps.Runner, error) {
	t.Helper()
	prog, err := e.Load(context.Background(), m, grid.Shapes())
	require.NoError(t, err)
	t.Cleanup(func() { prog.Close() })
	r, err := steps.New(steps.Options{Model: m, Program: prog, Grid: grid, Engine: e.Name(), StrictWarmup: strict})
	require.NoError(t, err)
	_, err = r.Warmup(context.Background())
	return prog, r, err
}
