package rbln

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
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
