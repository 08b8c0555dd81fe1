package rbln

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/steps"
)

// TestLanesDoubleBufferOneProgram: a program with two staging lanes is two
// replicas on one device that share its graphs: warming the first warms
// both (two runs per bucket in all), and steps on both lanes at once each
// answer their own requests, as the CPU engine does.
func TestLanesDoubleBufferOneProgram(t *testing.T) {
	requireTorch(t)
	log := filepath.Join(t.TempDir(), "regions")
	e, _ := newEngine(t, Options{Lanes: 2, Env: map[string]string{"PYTHONPATH": fakeRBLN(), "STEPSERVE_FAKE_RBLN_REGIONS": log}})
	regions := func() int {
		b, _ := os.ReadFile(log)
		return strings.Count(string(b), "\n")
	}
	m := loadDigits(t)
	grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, nil)
	require.NoError(t, err)
	prog, err := e.Load(context.Background(), m, grid.Shapes())
	require.NoError(t, err)
	defer prog.Close()
	lanes := engine.ReplicasOf(prog)
	require.Len(t, lanes, 2)
	assert.Equal(t, lanes[0].Device(), lanes[1].Device(), "lanes are replicas of one device")

	first, err := steps.New(steps.Options{Model: m, Program: lanes[0], Grid: grid, Engine: e.Name(), Device: lanes[0].Device()})
	require.NoError(t, err)
	second := first.Sibling(lanes[1], lanes[1].Device())
	for _, r := range []*steps.Runner{first, second} {
		_, err := r.Warmup(context.Background())
		require.NoError(t, err)
	}
	assert.Equal(t, 2*len(grid.Shapes()), regions(), "the second lane's warm-up runs nothing: its graphs are the first's")

	cpu, err := cpufallback.Engine{}.Load(context.Background(), m, grid.Shapes())
	require.NoError(t, err)
	defer cpu.Close()
	ref, err := steps.New(steps.Options{Model: m, Program: cpu, Grid: grid, Engine: "cpu"})
	require.NoError(t, err)

	var wg sync.WaitGroup
	for i, r := range []*steps.Runner{first, second} {
		wg.Go(func() {
			for k := range 50 {
				rows := 1 + (k+i)%7
				got, want := digitsRequest(rows, float32(10*i+k)), digitsRequest(rows, float32(10*i+k))
				if !assert.NoError(t, r.Run(context.Background(), []*steps.Request{got})) {
					return
				}
				require.NoError(t, ref.Run(context.Background(), []*steps.Request{want}))
				assert.InDeltaSlice(t, floats(want.Outputs[0]), floats(got.Outputs[0]), 1e-5, "lane %d step %d", i, k)
			}
		})
	}
	wg.Wait()
}
