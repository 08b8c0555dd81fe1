package rbln

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/steps"
)

// TestTPFailoverIsPerModel: on an RSD group of two NPUs a model without
// tensor-parallel support fails its program (the double's fail_tp);
// with model.yaml tp_failover the worker compiles the bucket again for
// one NPU, as torch-rbln's TORCH_RBLN_USE_TP_FAILOVER does, and says so
// in the step's notes; without it the warm-up fails naming the error
// (issue 33, item 1).
func TestTPFailoverIsPerModel(t *testing.T) {
	requireTorch(t)
	for _, failover := range []bool{true, false} {
		e := emulatedEngine(t, map[string]any{"available": true, "fail_tp": true}, Options{Devices: []string{"0,1"}})
		m := loadDigits(t)
		m.Config.DeviceDtype = "bfloat16"
		m.Config.TPFailover = failover
		grid, err := bucketing.NewGrid([]int{1, 4}, nil)
		require.NoError(t, err)
		prog, r, err := loadAndWarm(t, e, m, grid, false)
		if !failover {
			require.Error(t, err)
			assert.Contains(t, err.Error(), "this model does not support tensor parallelism (tp=2)")
			prog.Close()
			continue
		}
		require.NoError(t, err)
		require.NoError(t, prog.Compile(context.Background(), 0)) // compiled anew: its first step fails over again
		x, err := prog.Step(context.Background(), 0)
		require.NoError(t, err)
		assert.Contains(t, x.Notes, "tensor-parallel failover: the bucket's program failed across the 2-NPU group "+
			"(RuntimeError: rbln (test double): this model does not support tensor parallelism (tp=2)); "+
			"compiled again with num_devices=1, it runs on the group's first NPU (model.yaml tp_failover)")
		require.NoError(t, r.Run(context.Background(), []*steps.Request{digitsRequest(3, 1)}))
		prog.Close()
	}
}
