package steps

import (
	"context"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
)

// Runners of two replicas step on their own staging, side by side, and
// count into the model's one set of stats, explain history and step
// metrics; each device's steps are counted apart.
func TestSiblingRunnersShareTheModelsFigures(t *testing.T) {
	m := testModel()
	grid, err := bucketing.NewGrid([]int{1, 4}, nil)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	metrics, err := NewMetrics(reg)
	require.NoError(t, err)
	a, b := newDoubler(m.Config, grid), newDoubler(m.Config, grid)
	b.explain = engine.Explain{Measured: true, Clean: false, Reasons: []string{"on b"}, H2D: 1, D2H: 1, HostBounces: 1}
	first, err := New(Options{Model: m, Program: a, Engine: "fake", Device: "0", Grid: grid, Metrics: metrics})
	require.NoError(t, err)
	second := first.Sibling(b, "1")
	assert.Equal(t, "1", second.Device())

	var wg sync.WaitGroup
	for i, r := range []*Runner{first, second, first, second} {
		wg.Go(func() {
			q := request(1, float32(10*i))
			assert.NoError(t, r.Run(context.Background(), []*Request{q}))
			assert.Equal(t, []float32{float32(20 * i), float32(20*i + 2)}, decode(q.Outputs[0]))
		})
	}
	wg.Wait()
	assert.Len(t, a.seen, 2, "each replica's steps ran on its own program")
	assert.Len(t, b.seen, 2)

	for _, r := range []*Runner{first, second} {
		assert.Equal(t, int64(4), r.Stats()[0].Steps, "one set of stats")
		assert.Len(t, r.Explains(), 2, "one explain history: the second replica's two steps")
	}
	assert.Equal(t, 4.0, testutil.ToFloat64(metrics.steps.WithLabelValues("m", "b1", "fake", "clean"))+
		testutil.ToFloat64(metrics.steps.WithLabelValues("m", "b1", "fake", "overhead")))
	assert.Equal(t, 2.0, testutil.ToFloat64(metrics.deviceSteps.WithLabelValues("m", "fake", "0")))
	assert.Equal(t, 2.0, testutil.ToFloat64(metrics.deviceSteps.WithLabelValues("m", "fake", "1")))

	metrics.Forget("m")
	n, err := testutil.GatherAndCount(reg, "stepserve_device_steps_total")
	require.NoError(t, err)
	assert.Zero(t, n, "an unloaded model's device series go with it")
}
