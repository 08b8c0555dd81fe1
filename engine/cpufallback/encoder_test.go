package cpufallback_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// reference is what testdata/golden_encoder.py wrote: torch's pooled
// embeddings for sequences of several lengths.
type reference struct {
	Torch string
	Cases []struct {
		InputIDs     []int64 `json:"input_ids"`
		TokenTypeIDs []int64 `json:"token_type_ids"`
		CLS          []float64
		Mean         []float64
	}
}

func loadReference(t *testing.T) (*models.Model, reference) {
	m, err := models.Load("testdata/encoder")
	require.NoError(t, err)
	b, err := os.ReadFile("testdata/encoder/reference.json")
	require.NoError(t, err)
	var ref reference
	require.NoError(t, json.Unmarshal(b, &ref))
	require.NotEmpty(t, ref.Cases)
	return m, ref
}

func int64Bytes(v []int64) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, uint64(x))
	}
	return b
}

// encodeRequest builds a one-row step request for a token sequence.
func encodeRequest(ids, types []int64, hidden int) *steps.Request {
	mask := make([]int64, len(ids))
	for i := range mask {
		mask[i] = 1
	}
	return &steps.Request{
		Rows: 1, Seq: len(ids),
		Inputs:  [][]byte{int64Bytes(ids), int64Bytes(mask), int64Bytes(types)},
		Outputs: [][]byte{make([]byte, 4*hidden)},
	}
}

func embedding(r *steps.Request) []float64 {
	out := make([]float64, len(r.Outputs[0])/4)
	for i := range out {
		out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(r.Outputs[0][4*i:])))
	}
	return out
}

// runnerFor loads m on the CPU engine for grid's buckets and returns a
// runner over it; the program is closed when the test ends.
func runnerFor(t testing.TB, m *models.Model, grid *bucketing.Grid) *steps.Runner {
	t.Helper()
	prog, err := cpufallback.Engine{}.Load(context.Background(), m, grid.Shapes())
	require.NoError(t, err)
	t.Cleanup(func() { prog.Close() })
	return runnerOver(t, m, prog, grid)
}

func runnerOver(t testing.TB, m *models.Model, prog engine.Program, grid *bucketing.Grid) *steps.Runner {
	t.Helper()
	runner, err := steps.New(steps.Options{Model: m, Program: prog, Grid: grid})
	require.NoError(t, err)
	return runner
}

// goldenEmbeddings runs every golden case in one step and returns their
// pooled embeddings, in order.
func goldenEmbeddings(t testing.TB, runner *steps.Runner, m *models.Model, ref reference) [][]float64 {
	t.Helper()
	var batch []*steps.Request
	for _, c := range ref.Cases {
		batch = append(batch, encodeRequest(c.InputIDs, c.TokenTypeIDs, m.Encoder.Config.Hidden))
	}
	require.NoError(t, runner.Run(context.Background(), batch))
	out := make([][]float64, len(batch))
	for i, r := range batch {
		out[i] = embedding(r)
	}
	return out
}

func maxAbsDiff(a, b []float64) float64 {
	d := 0.0
	for i := range a {
		d = math.Max(d, math.Abs(a[i]-b[i]))
	}
	return d
}

// TestEncoderMatchesTorch checks the CPU engine's embeddings against torch's
// nn.TransformerEncoderLayer, for sequences of several lengths batched into
// one padded step and run one by one, with cls and with mean pooling.
func TestEncoderMatchesTorch(t *testing.T) {
	for _, pooling := range []string{"cls", "mean"} {
		t.Run(pooling, func(t *testing.T) {
			m, ref := loadReference(t)
			m.Encoder.Config.Pooling = pooling
			grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, m.Config.Buckets.Seq)
			require.NoError(t, err)
			prog, err := cpufallback.Engine{}.Load(context.Background(), m, grid.Shapes())
			require.NoError(t, err)
			defer prog.Close()
			runner, err := steps.New(steps.Options{Model: m, Program: prog, Grid: grid})
			require.NoError(t, err)
			_, err = runner.Warmup(context.Background())
			require.NoError(t, err)

			H := m.Encoder.Config.Hidden
			var batch []*steps.Request
			for _, c := range ref.Cases {
				batch = append(batch, encodeRequest(c.InputIDs, c.TokenTypeIDs, H))
			}
			require.NoError(t, runner.Run(context.Background(), batch), "all lengths in one step")

			worst := 0.0
			for i, c := range ref.Cases {
				want := c.CLS
				if pooling == "mean" {
					want = c.Mean
				}
				alone := encodeRequest(c.InputIDs, c.TokenTypeIDs, H)
				require.NoError(t, runner.Run(context.Background(), []*steps.Request{alone}))
				for _, got := range [][]float64{embedding(batch[i]), embedding(alone)} {
					d := maxAbsDiff(got, want)
					worst = math.Max(worst, d)
					assert.Less(t, d, 1e-4, "sequence %d (length %d)", i, len(c.InputIDs))
				}
			}
			t.Logf("%s pooling: max abs error vs torch %s: %.2e", pooling, ref.Torch, worst)
		})
	}
}

func TestEncoderNormalizeAndBadIDs(t *testing.T) {
	m, ref := loadReference(t)
	m.Encoder.Config.Normalize = true
	grid, err := bucketing.NewGrid([]int{1}, []int{32})
	require.NoError(t, err)
	prog, err := cpufallback.Engine{}.Load(context.Background(), m, grid.Shapes())
	require.NoError(t, err)
	runner, err := steps.New(steps.Options{Model: m, Program: prog, Grid: grid})
	require.NoError(t, err)
	c := ref.Cases[0]
	r := encodeRequest(c.InputIDs, c.TokenTypeIDs, m.Encoder.Config.Hidden)
	require.NoError(t, runner.Run(context.Background(), []*steps.Request{r}))
	var norm, refNorm float64
	for _, v := range c.CLS {
		refNorm += v * v
	}
	for i, v := range embedding(r) {
		norm += v * v
		assert.InDelta(t, c.CLS[i]/math.Sqrt(refNorm), v, 1e-4)
	}
	assert.InDelta(t, 1, norm, 1e-5)

	bad := encodeRequest([]int64{1, 100000}, []int64{0, 0}, m.Encoder.Config.Hidden)
	err = runner.Run(context.Background(), []*steps.Request{bad})
	assert.ErrorContains(t, err, "id 100000 or type 0 outside the vocabulary")
}

func TestEncoderStepDoesNotAllocate(t *testing.T) {
	m, _ := loadReference(t)
	grid, err := bucketing.NewGrid([]int{1, 4}, []int{32, 64})
	require.NoError(t, err)
	prog, err := cpufallback.Engine{}.Load(context.Background(), m, grid.Shapes())
	require.NoError(t, err)
	ctx := context.Background()
	for b, s := range grid.Shapes() {
		require.NoError(t, prog.Compile(ctx, b))
		allocs := testing.AllocsPerRun(5, func() {
			if _, err := prog.Step(ctx, b); err != nil {
				t.Fatal(err)
			}
		})
		assert.Zero(t, allocs, "bucket %s", s.Label())
	}
}

// BenchmarkEncoderStep measures every bucket of the shipped tiny-encoder,
// sequences filling the bucket: sequences per second and GFLOP/s (the products of one step, counted as
// bench/encoder_numpy.py counts them for OpenBLAS).
func BenchmarkEncoderStep(b *testing.B) {
	m, err := models.Load("../../model_repository/tiny-encoder")
	require.NoError(b, err)
	grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, m.Config.Buckets.Seq)
	require.NoError(b, err)
	prog, err := cpufallback.Engine{}.Load(context.Background(), m, grid.Shapes())
	require.NoError(b, err)
	for i, s := range grid.Shapes() {
		require.NoError(b, prog.Compile(context.Background(), i))
		// Full-length sequences: every token real, so that the step does
		// all the work the FLOP count assumes (it leaves padding out).
		in, _ := prog.Staging(i)
		clear(in)
		mask := engine.NewLayout(m.Config, s).Inputs[models.EncoderAttentionMask]
		for j := mask.Offset; j < mask.Offset+mask.Bytes; j += 8 {
			in[j] = 1
		}
		b.Run(s.Label(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := prog.Step(context.Background(), i); err != nil {
					b.Fatal(err)
				}
			}
			sec := b.Elapsed().Seconds() / float64(b.N)
			b.ReportAllocs()
			b.ReportMetric(float64(s.Batch)/sec, "seq/s")
			b.ReportMetric(cpufallback.EncoderFLOPs(m.Encoder.Config, s.Batch, s.Seq)/sec/1e9, "GFLOP/s")
		})
	}
}

// bf16MinCosine is the agreement the bfloat16 opt-in promises: the cosine
// of each pooled embedding with torch's float32 one (measured 0.9999+ on
// the golden encoder; bfloat16 keeps 8 bits of mantissa).
const bf16MinCosine = 0.999

// TestEncoderBFloat16 runs the golden encoder with engine: cpu and
// device_dtype bfloat16: where the CPU has AVX512_BF16, every pooled
// embedding is within bf16MinCosine of torch's float32 reference and a
// step allocates nothing; elsewhere the load is refused and says why (and
// a model written for another engine loads, in float32).
func TestEncoderBFloat16(t *testing.T) {
	m, ref := loadReference(t)
	m.Config.DeviceDtype, m.Config.Engine = "bfloat16", "cpu"
	m.Encoder.Config.Pooling = "mean"
	grid, err := bucketing.NewGrid([]int{1, 4}, []int{64})
	require.NoError(t, err)
	prog, err := cpufallback.Engine{}.Load(context.Background(), m, grid.Shapes())
	if err != nil {
		assert.ErrorContains(t, err, "device_dtype bfloat16 needs a CPU with AVX512_BF16")
		m.Config.Engine = "rbln" // the CPU engine as its failover
		fb, fbErr := cpufallback.Engine{}.Load(context.Background(), m, grid.Shapes())
		require.NoError(t, fbErr, "a model written for another engine loads, in float32")
		fb.Close()
		t.Skipf("refused as it should be on this CPU or build: %v", err)
	}
	defer prog.Close()
	embeddings := goldenEmbeddings(t, runnerOver(t, m, prog, grid), m, ref)
	worst, worstAbs := 1.0, 0.0
	for i, c := range ref.Cases {
		got := embeddings[i]
		cos := cosine(got, c.Mean)
		worst = math.Min(worst, cos)
		worstAbs = math.Max(worstAbs, maxAbsDiff(got, c.Mean))
		assert.GreaterOrEqual(t, cos, bf16MinCosine, "sequence %d (length %d)", i, len(c.InputIDs))
	}
	t.Logf("bfloat16 against torch float32: min cosine per row 1 - %.1e, max abs diff %.2e", 1-worst, worstAbs)
	ctx := context.Background()
	for b := range grid.Shapes() {
		require.NoError(t, prog.Compile(ctx, b))
		assert.Zero(t, testing.AllocsPerRun(5, func() {
			if _, err := prog.Step(ctx, b); err != nil {
				t.Fatal(err)
			}
		}), "bucket %d", b)
	}
}
