package cpufallback

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/models"
)

// TestReplicasStepSideBySide: per_device 2 loads two replicas on the one
// device, cpu, each with staging of its own; steps on both at once give
// each the answer a single replica gives.
func TestReplicasStepSideBySide(t *testing.T) {
	m := randomMLP(t, []int{64, 128, 10}, "relu", "softmax")
	buckets := []bucketing.Shape{{Batch: 4}}
	one, err := Engine{}.Load(context.Background(), m, buckets)
	require.NoError(t, err)
	defer one.Close()
	assert.Len(t, engine.ReplicasOf(one), 1)

	m.Config.Instances = models.Instances{Devices: []string{"cpu"}, PerDevice: 2}
	two, err := Engine{}.Load(context.Background(), m, buckets)
	require.NoError(t, err)
	reps := engine.ReplicasOf(two)
	require.Len(t, reps, 2)
	for _, r := range reps {
		assert.Equal(t, "cpu", r.Device())
		require.NoError(t, r.Compile(context.Background(), 0))
	}
	in0, _ := reps[0].Staging(0)
	in1, _ := reps[1].Staging(0)
	assert.NotSame(t, &in0[0], &in1[0], "each replica stages on buffers of its own")

	rng := rand.New(rand.NewPCG(5, 6))
	var inputs [2][]float32
	var want [2][]float32
	for i := range inputs {
		inputs[i] = make([]float32, 4*64)
		for j := range inputs[i] {
			inputs[i][j] = float32(rng.Float64() * 4)
		}
		in, out := one.Staging(0)
		copy(floats(in), inputs[i])
		_, err := one.Step(context.Background(), 0)
		require.NoError(t, err)
		want[i] = append([]float32(nil), floats(out)...)
	}
	for round := range 20 {
		var wg sync.WaitGroup
		for i, r := range reps {
			wg.Go(func() {
				in, out := r.Staging(0)
				copy(floats(in), inputs[i])
				x, err := r.Step(context.Background(), 0)
				assert.NoError(t, err)
				assert.True(t, x.Clean)
				assert.Equal(t, want[i], floats(out), "replica %d round %d", i, round)
			})
		}
		wg.Wait()
	}
	require.NoError(t, two.Close())
	for _, r := range reps {
		assert.False(t, r.Healthy(), "closing the program closes every replica")
	}
}

func TestReplicasNameTheCPU(t *testing.T) {
	m := randomMLP(t, []int{4, 2}, "relu", "none")
	m.Config.Instances = models.Instances{Devices: []string{"0"}}
	_, err := Engine{}.Load(context.Background(), m, []bucketing.Shape{{Batch: 1}})
	assert.ErrorContains(t, err, `instances.devices: engine cpu has no device "0"; its devices are cpu`)

	m.Config.Instances = models.Instances{All: true, PerDevice: 3}
	p, err := Engine{}.Load(context.Background(), m, []bucketing.Shape{{Batch: 1}})
	require.NoError(t, err)
	assert.Len(t, engine.ReplicasOf(p), 3)
	p.Close()

	m.Config.Instances = models.Instances{All: true, MinReady: 2}
	_, err = Engine{}.Load(context.Background(), m, []bucketing.Shape{{Batch: 1}})
	assert.ErrorContains(t, err, "instances.min_ready: 2 is more than the 1 replicas placed on engine cpu (cpu)")

	m.Config.Instances = models.Instances{PerDevice: 2}
	perReplica := Engine{}.ResidentBytes(&models.Config{MLP: m.Config.MLP, Inputs: m.Config.Inputs, Outputs: m.Config.Outputs}, []bucketing.Shape{{Batch: 8}})
	both := Engine{}.ResidentBytes(m.Config, []bucketing.Shape{{Batch: 8}})
	weights := residentWeightBytes(m.Config)
	assert.Equal(t, 2*(perReplica-weights), both-weights, "each replica's staging and plans count, the weights once")
}
