package serving

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/models"
)

// hostOpDecoders loads the CPU engine's decoder behind device buckets
// whose warm-up reports are warmups.
type hostOpDecoders struct {
	cpufallback.Engine
	warmups []engine.Explain
}

func (e hostOpDecoders) LoadDecoder(ctx context.Context, m *models.Model) (engine.Decoder, error) {
	d, err := e.Engine.LoadDecoder(ctx, m)
	return &observedDecoder{Decoder: d, warmups: e.warmups}, err
}

type observedDecoder struct {
	engine.Decoder
	warmups []engine.Explain
}

func (d *observedDecoder) Shapes() []bucketing.Shape {
	return []bucketing.Shape{{Batch: 4, Seq: 1, Ctx: 128}, {Batch: 4, Seq: 32}}
}
func (d *observedDecoder) ObserveSteps(func(bucket, rows int, padding float64, took time.Duration, x engine.Explain)) {
}
func (d *observedDecoder) Warmups() []engine.Explain { return d.warmups }

// A decoder's warm-up is judged as a Runner's: under strict warm-up a
// bucket whose compiled program runs an operator on the host (which
// explain() cannot see) refuses the model, naming the kind and bucket;
// without it the model serves; a clean or unmeasured warm-up serves.
func TestDecoderWarmupIsJudged(t *testing.T) {
	clean := engine.Explain{Measured: true, Clean: true, H2D: 1, D2H: 1, CPUFallbacks: 0, Recompiles: 0,
		HostBounces: 0, V2VSlow: 0, HostOps: 0}
	hostOp := clean
	hostOp.HostOps, hostOp.HostOpReasons = 1, map[string]string{"aten::sort": "not supported on the device"}
	for _, tc := range []struct {
		name    string
		strict  bool
		warmups []engine.Explain
		refused string
	}{
		{"host op, strict", true, []engine.Explain{clean, hostOp}, "model tiny-llama: warm-up of prefill bucket b4xs32 is not clean on its second run: host_op"},
		{"host op, lenient", false, []engine.Explain{hostOp, clean}, ""},
		{"clean", true, []engine.Explain{clean, clean}, ""},
		{"unmeasured", true, []engine.Explain{{}, {}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := t.TempDir()
			enginetest.CopyModel(t, "../model_repository/tiny-llama", filepath.Join(repo, "tiny-llama"), "")
			s, err := New(Options{Repository: repo, DefaultEngine: "cpu",
				Engines: map[string]Engine{"cpu": {Engine: hostOpDecoders{warmups: tc.warmups}, StrictWarmup: tc.strict}}})
			require.NoError(t, err)
			defer s.Close()
			err = s.Load(context.Background(), "tiny-llama")
			if tc.refused == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.refused)
			assert.Contains(t, err.Error(), "aten::sort (not supported on the device)")
		})
	}
}
