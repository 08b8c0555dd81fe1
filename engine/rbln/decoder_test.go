package rbln

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// The worker's decoder on the torch engine (a real worker on torch's
// CPU): its greedy tokens equal the hand-written torch Llama's
// (engine/cpufallback/testdata/llama_ref.py, recomputing every prefix)
// alone, batched and after preemption; in bfloat16, the first 16 do.

func TestWorkerDecoderMatchesTorch(t *testing.T) {
	requireTorch(t)
	const n = 64
	prompts := enginetest.Prompts(1, 5, 17, 40, 70)
	for name, shape := range enginetest.DecoderShapes {
		t.Run(name, func(t *testing.T) {
			// Small buckets and a tight cache: prompts are prefilled in
			// chunks split over several steps, rows pad, and sequences
			// are preempted and recomputed.
			dir := enginetest.WriteDecoder(t, shape, 11, "engine: torch\nbuckets:\n  batch: [1, 2, 4]\n  seq: [32]\ngeneration:\n  max_model_len: 160\n  max_num_seqs: 4\n  max_batch_tokens: 48\n  block_size: 8\n  kv_cache_blocks: 40\n")
			want := enginetest.TorchGreedy(t, dir, prompts, n, "float32")
			m, err := models.Load(dir)
			require.NoError(t, err)
			e, _ := newEngine(t, Options{})
			dec, err := e.LoadDecoder(context.Background(), m)
			require.NoError(t, err)
			defer dec.Close()
			loop := enginetest.StartLoop(t, dec, m)
			assert.Equal(t, want[:1], enginetest.Generate(t, loop, prompts[:1], n, nil), "alone")
			assert.Equal(t, want, enginetest.Generate(t, loop, prompts, n, nil), "batched, chunked, preempted, prefixes shared")

			// Seeded sampling: the same tokens alone and batched, and the
			// same draws as the CPU engine's where the two agree on the
			// distribution (the same counter-based generator).
			sampling := make([]generation.Sampling, len(prompts))
			for i := range sampling {
				sampling[i] = generation.Sampling{Temperature: 0.7, TopK: 40 * (i % 2), TopP: 0.9, Seed: uint64(7 + i), Logprobs: 3}
			}
			batched := enginetest.Generate(t, loop, prompts, 24, sampling)
			alone := enginetest.Generate(t, loop, prompts[2:3], 24, sampling[2:3])
			assert.Equal(t, batched[2], alone[0], "a seeded sequence alone and batched")
			cpu, err := cpufallback.Engine{}.LoadDecoder(context.Background(), m)
			require.NoError(t, err)
			defer cpu.Close()
			onCPU := enginetest.Generate(t, enginetest.StartLoop(t, cpu, m), prompts, 24, sampling)
			same := 0
			for i := range prompts {
				if assert.Len(t, onCPU[i], 24) && onCPU[i][0] == batched[i][0] {
					same++
				}
			}
			assert.GreaterOrEqual(t, same, len(prompts)-1, "the first sampled token, CPU engine and worker: %v vs %v", onCPU, batched)
		})
	}
}

func TestWorkerDecoderBFloat16(t *testing.T) {
	requireTorch(t)
	const n = 16
	prompts := enginetest.Prompts(1, 5, 17)
	dir := enginetest.WriteDecoder(t, enginetest.DecoderShapes["llama"], 11, "engine: torch\ndevice_dtype: bfloat16\ngeneration:\n  max_model_len: 128\n  max_num_seqs: 4\n  max_batch_tokens: 64\n")
	want := enginetest.TorchGreedy(t, dir, prompts, n, "bfloat16")
	m, err := models.Load(dir)
	require.NoError(t, err)
	e, _ := newEngine(t, Options{Env: map[string]string{cpuDtypeEnv: "device"}})
	dec, err := e.LoadDecoder(context.Background(), m)
	require.NoError(t, err)
	defer dec.Close()
	got := enginetest.Generate(t, enginetest.StartLoop(t, dec, m), prompts, n, nil)
	// The worker's cached steps and the reference's recomputed prefixes
	// round differently in bfloat16, and torch picks its bfloat16 kernels
	// by cpuid (oneDNN's AVX512-BF16 or ATen's own), so a near tie late in
	// a random model's text may settle either way on another CPU: the
	// first half of each continuation must agree.
	for i := range prompts {
		require.Len(t, got[i], n)
		assert.Equal(t, want[i][:n/2], got[i][:n/2], "prompt %d: the leading tokens (all: %v against %v)", i, got[i], want[i])
	}
}

// workerDecoder loads a small Llama on the torch engine under the explain
// double (torch_rbln's test double: every region clean with one copy each
// way, and each region entered written to regions) and records every
// device step's verdict.
func workerDecoder(t testing.TB, yaml string) (*decoder, *models.Model, *stepLog) {
	dir := enginetest.WriteDecoder(t, enginetest.DecoderShapes["llama"], 11, "engine: torch\n"+yaml)
	m, err := models.Load(dir)
	require.NoError(t, err)
	log := &stepLog{regions: filepath.Join(t.TempDir(), "regions")}
	e, err := New(Options{Device: DeviceCPU, Python: python, Env: map[string]string{"PYTHONPATH": fakeRBLN(), "STEPSERVE_FAKE_RBLN_REGIONS": log.regions}})
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	dec, err := e.LoadDecoder(context.Background(), m)
	require.NoError(t, err)
	t.Cleanup(func() { dec.Close() })
	d := dec.(*decoder)
	d.ObserveSteps(func(bucket, rows int, padding float64, took time.Duration, x engine.Explain) {
		log.mu.Lock()
		defer log.mu.Unlock()
		log.steps = append(log.steps, x)
		log.rows = append(log.rows, rows)
		log.buckets = append(log.buckets, bucket)
	})
	return d, m, log
}

type stepLog struct {
	mu      sync.Mutex
	steps   []engine.Explain
	rows    []int
	buckets []int
	regions string
}

// Every device step of a generation on the worker, prefill chunks and
// decodes, alone and batched, runs inside its own explain region, and the
// region's verdict and counters reach the step observer as the worker read
// them. (The double scripts one copy each way; on an NPU the same path
// carries torch-rbln's own counts.)
func TestWorkerDecoderStepsAreExplained(t *testing.T) {
	requireTorch(t)
	d, m, log := workerDecoder(t, "buckets:\n  batch: [1, 2, 4]\n  seq: [32]\ngeneration:\n  max_model_len: 160\n  max_num_seqs: 4\n  max_batch_tokens: 48\n")
	before, err := os.ReadFile(log.regions)
	require.NoError(t, err, "loading warmed the buckets inside regions")
	loop := enginetest.StartLoop(t, d, m)
	enginetest.Generate(t, loop, enginetest.Prompts(5, 40, 3, 70), 12, nil)
	after, err := os.ReadFile(log.regions)
	require.NoError(t, err)
	log.mu.Lock()
	defer log.mu.Unlock()
	require.NotEmpty(t, log.steps)
	assert.Equal(t, len(log.steps), bytes.Count(after, []byte("\n"))-bytes.Count(before, []byte("\n")), "one region a step")
	batched := 0
	for i, x := range log.steps {
		assert.True(t, x.Measured && x.Clean, "step %d: %+v", i, x)
		assert.Equal(t, engine.Count(1), x.H2D, "step %d: host-to-device copies", i)
		assert.Equal(t, engine.Count(1), x.D2H, "step %d: device-to-host copies", i)
		if log.rows[i] > 1 {
			batched++
		}
	}
	assert.Positive(t, batched, "some steps carried several sequences")
}

// A sequence's decode steps run in the least context partition that
// holds it, moving up the ladder as it grows; sequences that need little
// share a step of the small partition, and a batch's partition is its
// longest sequence's.
func TestDecodeStepsFollowTheContextPartitions(t *testing.T) {
	requireTorch(t)
	d, m, log := workerDecoder(t, "buckets:\n  batch: [1, 2]\n  seq: [32]\n  context: [32, 64]\ngeneration:\n  max_model_len: 96\n  max_num_seqs: 2\n  max_batch_tokens: 32\n  block_size: 16\n")
	loop := enginetest.StartLoop(t, d, m)
	used := func() []string {
		log.mu.Lock()
		defer log.mu.Unlock()
		var out []string
		for _, b := range log.buckets {
			if s := d.p.shapes[b]; s.Seq == 1 && (len(out) == 0 || out[len(out)-1] != s.Label()) {
				out = append(out, s.Label())
			}
		}
		log.buckets = log.buckets[:0]
		return out
	}
	used()
	// Alone: a 20-token prompt and 70 new tokens decode at contexts 21 to
	// 89.
	enginetest.Generate(t, loop, enginetest.Prompts(20), 70, nil)
	assert.Equal(t, []string{"b1xs1xc32", "b1xs1xc64", "b1xs1xc96"}, used())
	// Together with a 50-token prompt: the short one decodes alone in the
	// small partition while the long one prefills, then the pair in the
	// partition of the longer, never the short one's.
	enginetest.Generate(t, loop, enginetest.Prompts(5, 50), 8, nil)
	together := used()
	assert.Contains(t, together, "b2xs1xc64")
	assert.NotContains(t, together, "b2xs1xc32")
	assert.Equal(t, "b1xs1xc32", together[0], together)

	// The advisor recorded every decode step (the 70-token run's 69 and
	// the pair's), and keeps max_model_len's partition last.
	a, err := d.AdviseContexts(0)
	require.NoError(t, err)
	assert.Equal(t, []int{32, 64, 96}, a.CurrentContext)
	assert.Equal(t, 96, a.Context[len(a.Context)-1])
	assert.GreaterOrEqual(t, a.Steps, int64(69+7))
	assert.Equal(t, 2*2*len(a.Context), a.Programs, "2 batch sizes, each context's decode and its masked twin")
	assert.Equal(t, 2*2*3, a.CurrentPrograms)
	t.Logf("advice: %v -> %v, padding %.2f -> %.2f", a.CurrentContext, a.Context, a.PaddingNow, a.PaddingAdvised)
}

// BenchmarkWorkerDecodeStep times decode steps of a small Llama on the
// torch engine (a real worker, the explain double on) at 1 and 4
// sequences, and reports host-µs/step: the round trip less the time the
// worker spent in the step body, what stepserve adds to a device step
// (packing the rows, the doorbell, reading the sampled rows back).
func BenchmarkWorkerDecodeStep(b *testing.B) {
	requireTorch(b)
	d, _, log := workerDecoder(b, "buckets:\n  batch: [1, 4]\n  seq: [32]\ngeneration:\n  max_model_len: 256\n  max_num_seqs: 4\n  max_batch_tokens: 128\n")
	for _, seqs := range []int{1, 4} {
		g := d.gen
		s, err := generation.New(generation.Options{Blocks: g.KVCacheBlocks, BlockSize: g.BlockSize, MaxNumSeqs: seqs, MaxModelLen: 256, MaxBatchTokens: 128})
		require.NoError(b, err)
		for _, p := range enginetest.Prompts(20, 30, 40, 50)[:seqs] {
			require.NoError(b, s.Add(&generation.Sequence{Prompt: p, MaxTokens: 100, Sampling: generation.Sampling{Logprobs: -1}}))
		}
		var step *generation.Step
		for {
			step = s.Schedule()
			if step.Tokens() == len(step.Work) && len(step.Work) == seqs {
				break
			}
			out, err := d.Step(context.Background(), step)
			require.NoError(b, err)
			tokens := make([]int32, len(out))
			for i, o := range out {
				tokens[i] = o.Token
			}
			s.Advance(step, tokens)
		}
		for _, nap := range []bool{true, false} {
			napLongSteps = nap
			b.Run(fmt.Sprintf("seqs=%d/nap=%v", seqs, nap), func(b *testing.B) {
				var host []float64
				body0 := d.p.bodyNS.Load()
				for b.Loop() {
					start := time.Now()
					if _, err := d.Step(context.Background(), step); err != nil {
						b.Fatal(err)
					}
					body := d.p.bodyNS.Load()
					host = append(host, float64(time.Since(start).Nanoseconds()-(body-body0))/1e3)
					body0 = body
				}
				slices.Sort(host)
				b.ReportMetric(host[len(host)/2], "host-µs/step")
				b.ReportMetric(host[len(host)*9/10], "host-p90-µs/step")
				log.mu.Lock()
				for _, x := range log.steps[len(log.steps)-min(len(log.steps), 10):] {
					if !x.Clean || x.H2D != 1 || x.D2H != 1 {
						b.Fatalf("a decode step not clean with one copy each way: %+v", x)
					}
				}
				log.mu.Unlock()
			})
		}
		napLongSteps = true
	}
}

// A decoder's warm-up on the rbln engine (emulated) reports, for every
// bucket, what its compiled program runs on the host, invisible to
// explain(): the reports serving judges as an encoder's warm-up
// (serving's TestDecoderWarmupIsJudged refuses them under strict
// warm-up).
func TestDecoderWarmupReportsHostOps(t *testing.T) {
	requireTorch(t)
	dir := enginetest.WriteDecoder(t, enginetest.DecoderShapes["llama"], 11, "engine: rbln\ndevice_dtype: bfloat16\nbuckets:\n  batch: [1]\n  seq: [32]\ngeneration:\n  max_model_len: 64\n  max_num_seqs: 1\n  max_batch_tokens: 32\n")
	m, err := models.Load(dir)
	require.NoError(t, err)
	e := hostOpsEngine(t, map[string]string{"aten::sort": "not supported on the device"}, t.TempDir())
	dec, err := e.LoadDecoder(context.Background(), m)
	require.NoError(t, err)
	defer dec.Close()
	so := dec.(engine.StepObserver)
	require.Len(t, so.Warmups(), len(so.Shapes()))
	for i, x := range so.Warmups() {
		v := steps.Check(&x)
		assert.Equal(t, int64(1), v.Fired[steps.HostOp], "bucket %s", so.Shapes()[i].Label())
		assert.Contains(t, x.Reasons, "host_op: the compiled program runs 1 operator(s) on the host: aten::sort (not supported on the device)")
	}
}
