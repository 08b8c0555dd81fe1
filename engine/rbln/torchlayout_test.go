package rbln

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/models"
)

// mixedTorchModel is cmd/serve's test module (inputs FP32 and INT64,
// outputs FP32 and INT64) in a directory of its own, with weights from
// its seeded initialisation.
func mixedTorchModel(t *testing.T) *models.Model {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mixed")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	src := "../../cmd/serve/testdata"
	for _, f := range []string{"model.py", "model.yaml"} {
		b, err := os.ReadFile(filepath.Join(src, "torch", f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	spec, _ := json.Marshal(map[string]any{
		"module": "model.py", "config": map[string]any{"vocab": 50, "width": 16},
		"inputs":  []map[string]string{{"name": "image", "datatype": "FP32"}, {"name": "tokens", "datatype": "INT64"}},
		"outputs": []map[string]string{{"name": "scores", "datatype": "FP32"}, {"name": "best", "datatype": "INT64"}},
	})
	require.NoError(t, os.WriteFile(filepath.Join(dir, "spec.json"), spec, 0o644))
	out, err := exec.Command(python, filepath.Join(src, "torch_reference.py"), dir, "init").CombinedOutput()
	require.NoError(t, err, "%s", out)
	m, err := models.Load(dir)
	require.NoError(t, err)
	return m
}

// TestTorchBoundaryHasOneDtypeWherePossible (issue 33, item 3): an
// architecture torch model whose inputs (outputs) share one device type
// stages a row of that type, sliced in the graph with no bitcast, so it
// runs where the frontend lowers no Tensor.view(dtype) (the double
// refuses it); a model that mixes types keeps the byte row, which such a
// frontend refuses at warm-up, naming the bitcast, and which runs where
// the bitcast is lowered.
func TestTorchBoundaryHasOneDtypeWherePossible(t *testing.T) {
	requireTorch(t)
	for _, tc := range []struct {
		name         string
		model        func(t *testing.T) *models.Model
		refuse       bool
		byteRow, err bool
	}{
		{"one dtype, bitcast refused", func(t *testing.T) *models.Model {
			m, err := models.Load("../../model_repository/digits-cnn")
			require.NoError(t, err)
			return m
		}, true, false, false},
		{"mixed dtypes, bitcast lowered", mixedTorchModel, false, true, false},
		{"mixed dtypes, bitcast refused", mixedTorchModel, true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := emulatedEngine(t, map[string]any{"available": true, "device_count": 1, "refuse_bitcast": tc.refuse,
				"verdict": map[string]any{"clean": true, "reasons": []string{}},
				"dump": map[string]any{
					"runtime": map[string]any{"by_primitive": map[string]any{"h2v": map[string]any{"calls": 1, "ns": 700}, "v2h": map[string]any{"calls": 1, "ns": 900}}},
				}}, Options{})
			m := tc.model(t)
			m.Config.DeviceDtype = "bfloat16" // the host's torch has no float16 convolution
			grid, err := bucketing.NewGrid([]int{1, 4}, nil)
			require.NoError(t, err)
			_, _, err = loadAndWarm(t, e, m, grid, true)
			for _, b := range onlyProgram(t, e).bounds {
				assert.Equal(t, tc.byteRow, b.in.byteRow, "inputs")
				assert.Equal(t, tc.byteRow, b.out.byteRow, "outputs")
				if !tc.byteRow {
					assert.Equal(t, dtBFloat16, b.in.dt, "the row is in the compute dtype")
				}
			}
			if tc.err {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "aten::view.dtype, a bitcast, is not lowered")
				return
			}
			require.NoError(t, err)
		})
	}
}
