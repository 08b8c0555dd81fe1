package cpufallback_test

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// kernelSets is every kernel set the CPU engine has, whichever this CPU
// and build run: the AVX-512 products (with bfloat16 products where the CPU
// has AVX512_BF16, for device_dtype bfloat16), the AVX2 products, and the
// portable set ("go": the build's BLAS, gonum or OpenBLAS).
var kernelSets = []string{"avx512", "avx512+bf16", "avx2", "go"}

// bf16MaxScoreError bounds a one-score head (a reranker) in bfloat16
// against torch's float32. bfloat16 keeps 8 significant bits; the test
// reranker's scores (0.03 to 0.1) come out within 2.7e-4 of torch's.
// 0.01 leaves a 35-fold margin for other weights and still fails a score
// computed from the wrong tensors, which misses by the score's own size.
const bf16MaxScoreError = 0.01

// TestEveryKernelSetMatchesTorch runs the golden encoder and every family
// and head end to end on each kernel set this CPU and build can run,
// against torch's references: float32 sets within 1e-4 (the references'
// own test bound; the engine measures a few 1e-7), bfloat16 at a cosine of
// bf16MinCosine. A set this machine cannot run is skipped by name, so the
// run's -v output says what was and was not tested here (make test prints
// it).
func TestEveryKernelSetMatchesTorch(t *testing.T) {
	inUse := cpufallback.Kernels() // STEPSERVE_CPU_KERNELS's choice, or the best
	defer func() { require.NoError(t, cpufallback.SetKernels(inUse)) }()
	for _, set := range kernelSets {
		t.Run(set, func(t *testing.T) {
			name, bf16 := strings.CutSuffix(set, "+bf16")
			if !slices.Contains(cpufallback.KernelNames(), name) {
				t.Skipf("kernel set %s: this CPU or build cannot run it (it runs %s)", set, strings.Join(cpufallback.KernelNames(), ", "))
			}
			require.NoError(t, cpufallback.SetKernels(name))
			require.Equal(t, name, cpufallback.Kernels())
			if bf16 && !cpufallback.BFloat16() {
				t.Skipf("kernel set %s: this CPU has no AVX512_BF16 (or this build no bfloat16 products)", set)
			}
			t.Logf("kernel set %s, BLAS %s", set, cpufallback.BLAS())

			m, ref := loadReference(t)
			m.Encoder.Config.Pooling = "mean"
			if bf16 {
				m.Config.DeviceDtype, m.Config.Engine = "bfloat16", "cpu"
			}
			grid, err := bucketing.NewGrid([]int{1, 4}, []int{64})
			require.NoError(t, err)
			embeddings := goldenEmbeddings(t, runnerFor(t, m, grid), m, ref)
			worst, minCos := 0.0, 1.0
			for i, c := range ref.Cases {
				got := embeddings[i]
				worst = math.Max(worst, maxAbsDiff(got, c.Mean))
				minCos = math.Min(minCos, cosine(got, c.Mean))
				if bf16 {
					assert.GreaterOrEqual(t, cosine(got, c.Mean), bf16MinCosine, "sequence %d", i)
				} else {
					assert.Less(t, maxAbsDiff(got, c.Mean), 1e-4, "sequence %d", i)
				}
			}
			t.Logf("golden encoder: max abs error vs torch %.2e, cosine 1 - %.1e at least", worst, 1-minCos)
			for _, family := range familyCases {
				m, ref := loadFamily(t, family)
				if bf16 {
					m.Config.DeviceDtype, m.Config.Engine = "bfloat16", "cpu"
				}
				grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, m.Config.Buckets.Seq)
				require.NoError(t, err)
				runner := runnerFor(t, m, grid)
				width, pad := m.Config.Encoder.OutputWidth(), int64(m.Config.Encoder.PadID())
				worst, minCos := 0.0, 1.0
				for i, c := range ref.Cases {
					alone := padRequest(c.InputIDs, c.TokenTypeIDs, len(c.InputIDs), pad, width)
					require.NoError(t, runner.Run(context.Background(), []*steps.Request{alone}))
					got := embedding(alone)
					d := maxAbsDiff(got, c.Alone)
					worst = math.Max(worst, d)
					if width > 1 {
						minCos = math.Min(minCos, cosine(got, c.Alone))
					}
					switch {
					case !bf16:
						assert.Less(t, d, 1e-4, "%s: sequence %d", family, i)
					case width > 1:
						assert.GreaterOrEqual(t, cosine(got, c.Alone), bf16MinCosine, "%s: sequence %d", family, i)
					default:
						assert.Less(t, d, bf16MaxScoreError, "%s: sequence %d, its one score", family, i)
					}
				}
				t.Logf("%s: max abs error vs torch %.2e, cosine 1 - %.1e at least", family, worst, 1-minCos)
			}
			decoderAgrees(t, bf16)
		})
	}
}

// decoderAgrees generates with a Llama decoder (head size 32: the native
// decode attention where the set has it) one prompt alone, then three
// at once (decode products of one and of three rows), against torch's
// greedy tokens: every token in float32; in bfloat16 the first four
// (its rounding may later tip a near-tie the other way).
func decoderAgrees(t *testing.T, bf16 bool) {
	yaml := "engine: cpu\ngeneration:\n  max_model_len: 256\n  max_batch_tokens: 64\n"
	if bf16 {
		yaml = "device_dtype: bfloat16\n" + yaml
	}
	dir := enginetest.WriteDecoder(t, enginetest.DecoderShapes["llama"], 7, yaml)
	ps := enginetest.Prompts(5, 70, 3)
	const n = 24
	want := enginetest.TorchGreedy(t, dir, ps, n, "float32")
	m, err := models.Load(dir)
	require.NoError(t, err)
	dec, err := cpufallback.Engine{}.LoadDecoder(context.Background(), m)
	require.NoError(t, err)
	defer dec.Close()
	loop := enginetest.StartLoop(t, dec, m)
	got := append(enginetest.Generate(t, loop, ps[:1], n, nil), enginetest.Generate(t, loop, ps[1:], n, nil)...)
	for i := range ps {
		if bf16 {
			assert.Equal(t, want[i][:4], got[i][:4], "prompt %d, bfloat16", i)
		} else {
			assert.Equal(t, want[i], got[i], "prompt %d", i)
		}
	}
}
