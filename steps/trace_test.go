package steps

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/internal/trace"
)

// copier is a program that copies its input staging to its output and
// allocates nothing, with a device time, as the CPU engine reports one.
type copier struct{ staging [][2][]byte }

func (c *copier) Compile(context.Context, int) error { return nil }
func (c *copier) Healthy() bool                      { return true }
func (c *copier) Staging(b int) ([]byte, []byte)     { return c.staging[b][0], c.staging[b][1] }
func (c *copier) Step(_ context.Context, b int) (engine.Explain, error) {
	copy(c.staging[b][1], c.staging[b][0])
	return engine.Explain{Measured: true, Clean: true, H2D: 1, D2H: 1, DeviceNS: 1000}, nil
}

func newCopier(t testing.TB) (*Runner, *trace.Tracer) {
	m := testModel()
	grid, err := bucketing.NewGrid([]int{1, 4}, nil)
	require.NoError(t, err)
	c := &copier{}
	for _, s := range grid.Shapes() {
		l := engine.NewLayout(m.Config, s)
		c.staging = append(c.staging, [2][]byte{make([]byte, l.InBytes), make([]byte, l.OutBytes)})
	}
	metrics, err := NewMetrics(nil)
	require.NoError(t, err)
	r, err := New(Options{Model: m, Program: c, Engine: "cpu", Grid: grid, Metrics: metrics})
	require.NoError(t, err)
	return r, trace.New(trace.Options{Dir: t.TempDir()})
}

// TestUntracedStepsDoNotAllocate holds the step path to no allocation
// while tracing is off, and while it is on for another model.
func TestUntracedStepsDoNotAllocate(t *testing.T) {
	r, tracer := newCopier(t)
	q := request(2, 1)
	reqs := []*Request{q}
	ctx := context.Background()
	run := func() {
		q.Trace = tracer.Sample("m")
		if err := r.Run(ctx, reqs); err != nil {
			t.Fatal(err)
		}
	}
	run() // the device histogram's series is made on the first measured step
	assert.Zero(t, testing.AllocsPerRun(100, run), "tracing off")
	_, err := tracer.Update("other", []byte(`{"trace_level":["TIMESTAMPS"],"trace_count":"-1"}`))
	require.NoError(t, err)
	assert.Zero(t, testing.AllocsPerRun(100, run), "tracing on for another model only")
	assert.Equal(t, []float32{1, 2, 3, 4}, decode(q.Outputs[0]))
}

// BenchmarkStepTracing is the cost of a step (of the copier: the runner's
// own work) with tracing off, and with every step traced at TIMESTAMPS.
func BenchmarkStepTracing(b *testing.B) {
	for _, level := range []string{"OFF", "TIMESTAMPS"} {
		b.Run(level, func(b *testing.B) {
			r, tracer := newCopier(b)
			defer tracer.Close()
			_, err := tracer.Update("", []byte(`{"trace_level":["`+level+`"],"trace_count":"-1","log_frequency":"100"}`))
			require.NoError(b, err)
			q := request(2, 1)
			reqs := []*Request{q}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				q.Trace = tracer.Sample("m")
				q.Trace.Stamp(trace.Enqueued)
				q.Trace.Stamp(trace.Batched)
				if err := r.Run(ctx, reqs); err != nil {
					b.Fatal(err)
				}
				q.Trace.Done(200)
			}
		})
	}
}
