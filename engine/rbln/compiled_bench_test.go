package rbln

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/models"
)

// BenchmarkCompiledVsEager steps digits-cnn (batch 1 and 32) and
// tiny-encoder (batch 1 and 32, 64 tokens) on the torch engine in the
// torch 2.x root, compiled with inductor and eager, in one run: the
// step's body (the worker's copy in, graph, copy out) in body-µs/step,
// and the round trip through the server's step. Compare the inductor and
// off lines of one run, never across runs.
//
//	TORCH2_PYTHON=$PWD/engine/rbln/worker/torch2/python go test ./engine/rbln -run '^$' -bench CompiledVsEager
func BenchmarkCompiledVsEager(b *testing.B) {
	python := torch2(b)
	for _, tc := range []struct {
		model string
		seq   int
	}{{"digits-cnn", 0}, {"tiny-encoder", 64}} {
		m, err := models.Load("../../model_repository/" + tc.model)
		require.NoError(b, err)
		m.Config.Engine = "torch"
		for _, batch := range []int{1, 32} {
			for _, mode := range []string{"inductor", "off"} {
				e, err := New(Options{Device: DeviceCPU, Python: python, TorchCompile: mode, StrictWarmup: true})
				require.NoError(b, err)
				shape := bucketing.Shape{Batch: batch, Seq: tc.seq}
				prog, err := e.Load(context.Background(), m, []bucketing.Shape{shape})
				require.NoError(b, err)
				require.NoError(b, prog.Compile(context.Background(), 0))
				for range 3 {
					_, err := prog.Step(context.Background(), 0)
					require.NoError(b, err)
				}
				b.Run(fmt.Sprintf("%s/%s/%s", tc.model, shape.Label(), mode), func(b *testing.B) {
					body0 := prog.(*program).bodyNS.Load()
					n := 0
					for b.Loop() {
						if _, err := prog.Step(context.Background(), 0); err != nil {
							b.Fatal(err)
						}
						n++
					}
					b.ReportMetric(float64(prog.(*program).bodyNS.Load()-body0)/1e3/float64(n), "body-µs/step")
				})
				if r := prog.(engine.ProgramReporter).Programs(context.Background()); len(r) == 1 && r[0].CompileSeconds != nil {
					b.Logf("%s %s %s: compiled in %.2f s", tc.model, shape.Label(), mode, *r[0].CompileSeconds)
				}
				prog.Close()
				e.Close()
			}
		}
	}
}
