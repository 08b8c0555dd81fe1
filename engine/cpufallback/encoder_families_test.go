package cpufallback_test

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// familyReference is what testdata/golden_families.py wrote for one case:
// torch's outputs for sequences batched into one padded step and alone.
type familyReference struct {
	Torch string
	Spec  map[string]any
	Cases []struct {
		InputIDs     []int64 `json:"input_ids"`
		TokenTypeIDs []int64 `json:"token_type_ids"`
		Batched      []float64
		Alone        []float64
	}
}

// familyCases are the references golden_families.py writes, each an HF
// folder (config.json and safetensors, a model.yaml that overrides only
// the inputs and buckets).
var familyCases = []string{"bert-classifier", "roberta", "xlm-roberta-reranker", "camembert", "distilbert", "distilbert-classifier"}

func loadFamily(t testing.TB, name string) (*models.Model, familyReference) {
	t.Helper()
	dir := filepath.Join("testdata", "families", name)
	m, err := models.Load(dir)
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	require.NoError(t, err)
	var ref familyReference
	require.NoError(t, json.Unmarshal(b, &ref))
	require.NotEmpty(t, ref.Cases)
	return m, ref
}

// padRequest builds a one-row step request for a token sequence padded
// with pad up to seq, as PrepareInputs pads the shorter texts of a request.
func padRequest(ids, types []int64, seq int, pad int64, width int) *steps.Request {
	pid, pty, mask := make([]int64, seq), make([]int64, seq), make([]int64, seq)
	for i := range seq {
		pid[i] = pad
		if i < len(ids) {
			pid[i], pty[i], mask[i] = ids[i], types[i], 1
		}
	}
	return &steps.Request{
		Rows: 1, Seq: seq,
		Inputs:  [][]byte{int64Bytes(pid), int64Bytes(mask), int64Bytes(pty)},
		Outputs: [][]byte{make([]byte, 4*width)},
	}
}

func cosine(a, b []float64) float64 {
	var ab, aa, bb float64
	for i := range a {
		ab, aa, bb = ab+a[i]*b[i], aa+a[i]*a[i], bb+b[i]*b[i]
	}
	return ab / math.Sqrt(aa*bb)
}

// TestEncoderFamiliesMatchTorch checks the CPU engine against torch for
// every family and head: the sequences of several lengths in one padded
// step (padded with the family's pad id, as the reference's batch is)
// against torch's batch, and each alone against torch's run on it alone.
func TestEncoderFamiliesMatchTorch(t *testing.T) {
	for _, name := range familyCases {
		t.Run(name, func(t *testing.T) {
			m, ref := loadFamily(t, name)
			grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, m.Config.Buckets.Seq)
			require.NoError(t, err)
			runner := runnerFor(t, m, grid)
			_, err = runner.Warmup(context.Background())
			require.NoError(t, err)

			width := m.Config.Encoder.OutputWidth()
			pad := int64(m.Config.Encoder.PadID())
			seq := 0
			for _, c := range ref.Cases {
				seq = max(seq, len(c.InputIDs))
			}
			var batch []*steps.Request
			for _, c := range ref.Cases {
				batch = append(batch, padRequest(c.InputIDs, c.TokenTypeIDs, seq, pad, width))
			}
			require.NoError(t, runner.Run(context.Background(), batch), "all lengths in one step")

			worst, minCos := 0.0, 1.0
			for i, c := range ref.Cases {
				alone := padRequest(c.InputIDs, c.TokenTypeIDs, len(c.InputIDs), pad, width)
				require.NoError(t, runner.Run(context.Background(), []*steps.Request{alone}))
				for _, pair := range []struct {
					got, want []float64
					how       string
				}{{embedding(batch[i]), c.Batched, "batched"}, {embedding(alone), c.Alone, "alone"}} {
					require.Len(t, pair.got, len(pair.want))
					d := maxAbsDiff(pair.got, pair.want)
					worst = math.Max(worst, d)
					assert.Less(t, d, 1e-4, "sequence %d (length %d) %s", i, len(c.InputIDs), pair.how)
					if width > 1 {
						cos := cosine(pair.got, pair.want)
						minCos = math.Min(minCos, cos)
						assert.GreaterOrEqual(t, cos, 0.9999, "sequence %d %s", i, pair.how)
					}
				}
			}
			t.Logf("%s: max abs error vs torch %s: %.2e, cosine %.7f at least", name, ref.Torch, worst, minCos)
		})
	}
}

// TestEncoderFamiliesSkipWhatTheyDoNotUse: the tensors a model does not
// read (an I64 position_ids, an embedding model's pooler, an lm_head) are
// listed, not read and not counted.
func TestEncoderFamiliesSkipWhatTheyDoNotUse(t *testing.T) {
	m, _ := loadFamily(t, "roberta")
	assert.Equal(t, []string{"lm_head.dense.weight", "roberta.embeddings.position_ids", "roberta.pooler.dense.bias", "roberta.pooler.dense.weight"}, m.Skipped)
	for _, name := range m.Skipped {
		assert.NotContains(t, m.Weights.Tensors, name)
	}
	m, _ = loadFamily(t, "bert-classifier")
	assert.Equal(t, []string{"bert.embeddings.position_ids"}, m.Skipped)
	assert.Equal(t, [][]string{{"contradiction", "entailment", "neutral"}}, m.Labels, "id2label, in id order")
}

func TestEncoderFamiliesStepDoesNotAllocate(t *testing.T) {
	for _, name := range familyCases {
		m, _ := loadFamily(t, name)
		grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, m.Config.Buckets.Seq)
		require.NoError(t, err)
		prog, err := cpufallback.Engine{}.Load(context.Background(), m, grid.Shapes())
		require.NoError(t, err)
		ctx := context.Background()
		for b, s := range grid.Shapes() {
			require.NoError(t, prog.Compile(ctx, b))
			allocs := testing.AllocsPerRun(3, func() {
				if _, err := prog.Step(ctx, b); err != nil {
					t.Fatal(err)
				}
			})
			assert.Zero(t, allocs, "%s bucket %s", name, s.Label())
		}
		prog.Close()
	}
}
