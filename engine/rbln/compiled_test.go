package rbln

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/internal/randweights"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// torch2 is the python of the torch 2.x root (make torch2-root), in which
// steps compile with inductor for real; make test sets
// TORCH2_PYTHON to it. Without it the test skips, saying so.
func torch2(t testing.TB) string {
	t.Helper()
	p := os.Getenv("TORCH2_PYTHON")
	if p == "" {
		t.Skip("TORCH2_PYTHON is unset: make test runs the compiled-engine tests in the torch 2.x root (make torch2-root)")
	}
	return p
}

// programsOf is a loaded program's reports, one per bucket.
func programsOf(t *testing.T, p engine.Program) []engine.ProgramReport {
	t.Helper()
	r, ok := p.(engine.ProgramReporter)
	require.True(t, ok, "%T reports no programs", p)
	return r.Programs(context.Background())
}

// torchModule is an architecture torch model whose module is forward
// (the body of a torch.nn.Module's forward(self, x) over x [batch, 64]),
// in a directory named name, with one bucket of 2 rows.
func torchModule(t *testing.T, name, init, forward string) *models.Model {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	yaml := `architecture: torch
torch:
  module: model.py
  factory: build
inputs:
  - {name: x, datatype: FP32, shape: [-1, 64]}
outputs:
  - {name: y, datatype: FP32, shape: [-1, 64]}
buckets:
  batch: [2]
engine: torch
`
	src := "import torch\n\n\nclass M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n" +
		indent(init, 8) + "\n    def forward(self, x):\n" + indent(forward, 8) + "\n\ndef build(config):\n    return M()\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.yaml"), []byte(yaml), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.py"), []byte(src), 0o644))
	m, err := models.Load(dir)
	require.NoError(t, err)
	return m
}

func indent(s string, n int) string {
	pad := strings.Repeat(" ", n)
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i, l := range lines {
		lines[i] = pad + l
	}
	return strings.Join(lines, "\n")
}

// rowsRequest is rows of 64 float32 inputs and outputs.
func rowsRequest(rows int, v float32) *steps.Request {
	r := digitsRequest(rows, v)
	r.Outputs[0] = make([]byte, rows*64*4)
	return r
}

// TestCompiledDigitsCNNAgreesWithEager: digits-cnn on the torch engine
// compiled with inductor in the torch 2.x root: one graph per bucket, no
// break, no recompile over steps of every row count, outputs as the
// eager engine's on the same torch; the programs' gauges say the same.
func TestCompiledDigitsCNNAgreesWithEager(t *testing.T) {
	python := torch2(t)
	m, err := models.Load("../../model_repository/digits-cnn")
	require.NoError(t, err)
	grid, err := bucketing.NewGrid([]int{1, 32}, nil)
	require.NoError(t, err)
	compiled, reg := newEngine(t, Options{Python: python, TorchCompile: "inductor", StrictWarmup: true})
	eager, _ := newEngine(t, Options{Python: python, TorchCompile: "off", StrictWarmup: true})
	prog, onCompiled, err := loadAndWarm(t, compiled, m, grid, false)
	require.NoError(t, err)
	eagerProg, onEager, err := loadAndWarm(t, eager, m, grid, false)
	require.NoError(t, err)

	worst := 0.0
	for i, rows := range []int{1, 2, 7, 16, 31, 32, 1, 32} {
		a, b := digitsRequest(rows, float32(i)), digitsRequest(rows, float32(i))
		require.NoError(t, onCompiled.Run(context.Background(), []*steps.Request{a}))
		require.NoError(t, onEager.Run(context.Background(), []*steps.Request{b}))
		fa, fb := floats(a.Outputs[0]), floats(b.Outputs[0])
		for j := range fa {
			worst = math.Max(worst, math.Abs(fa[j]-fb[j]))
		}
	}
	t.Logf("digits-cnn, inductor vs eager on torch 2.x: max abs diff %.3g", worst)
	assert.Less(t, worst, 1e-5)

	for _, p := range programsOf(t, prog) {
		assert.Equal(t, "inductor", p.Compiler, p.Bucket)
		assert.True(t, p.Built, p.Bucket)
		assert.Equal(t, engine.Count(1), p.Graphs, "%s: one whole graph", p.Bucket)
		assert.Equal(t, engine.Count(0), p.GraphBreaks, p.Bucket)
		assert.Equal(t, engine.Count(0), p.Recompiles, p.Bucket)
		require.NotNil(t, p.CompileSeconds, p.Bucket)
		require.NotNil(t, p.Audit, p.Bucket)
		assert.Zero(t, p.Audit.ByRule["created_in_step"], "%s: the step makes no tensor of its own: %+v", p.Bucket, p.Audit.Findings)
		hit := "unknown"
		if p.CacheHit != nil {
			hit = fmt.Sprint(*p.CacheHit)
		}
		t.Logf("%s: compiled in %.1f s (inductor's cache hit: %s); audit %v", p.Bucket, *p.CompileSeconds, hit, p.Audit.ByRule)
	}
	for _, p := range programsOf(t, eagerProg) {
		assert.Equal(t, "none", p.Compiler)
		assert.Equal(t, engine.Count(0), p.Graphs, "eager: no graph")
		assert.Contains(t, p.Note, "rbln.torch_compile is off")
	}
	v, ok := gaugeValue(reg, "stepserve_program_graphs", map[string]string{"model": "digits-cnn", "bucket": "b32", "compiler": "inductor", "engine": "torch"})
	assert.True(t, ok && v == 1, "stepserve_program_graphs of b32: %v (%v)", v, ok)
}

// gaugeValue is the value of the gauge name whose labels include labels.
func gaugeValue(reg *prometheus.Registry, name string, labels map[string]string) (float64, bool) {
	fams, err := reg.Gather()
	if err != nil {
		return 0, false
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue metrics
				}
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestGraphBreakRefusedOrServed: a module that reads a value on the host
// breaks its graph. With strict warm-up the load is refused, naming the
// line; without, it is served and every step counts the fallback.
func TestGraphBreakRefusedOrServed(t *testing.T) {
	python := torch2(t)
	m := torchModule(t, "hostread", "pass", "y = x * 2\nif float(y.max()) > 1:\n    y = y + 1\nreturn y")
	grid, err := bucketing.NewGrid([]int{2}, nil)
	require.NoError(t, err)

	strict, _ := newEngine(t, Options{Python: python, TorchCompile: "inductor", StrictWarmup: true})
	_, _, err = loadAndWarm(t, strict, m, grid, true)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the step graph breaks at hostread/model.py:10 (if float(y.max()) > 1:)")

	lenient, _ := newEngine(t, Options{Python: python, TorchCompile: "inductor", StrictWarmup: false})
	prog, r, err := loadAndWarm(t, lenient, m, grid, false)
	require.NoError(t, err)
	x, err := prog.Step(context.Background(), 0)
	require.NoError(t, err)
	assert.Equal(t, engine.Count(1), x.CPUFallbacks, "the break falls back to the host: %v", x.Reasons)
	v := steps.Check(&x)
	assert.Equal(t, int64(1), v.Fired[steps.CPUFallback])
	assert.Contains(t, strings.Join(x.Reasons, "; "), "hostread/model.py:10")
	req := rowsRequest(2, 1)
	require.NoError(t, r.Run(context.Background(), []*steps.Request{req}))
	p := programsOf(t, prog)[0]
	assert.Equal(t, engine.Count(1), p.GraphBreaks)
	require.Len(t, p.Breaks, 1)
	assert.Equal(t, "hostread/model.py:10", p.Breaks[0].Line)
	assert.Contains(t, p.Breaks[0].Reason, "item")
	require.NotNil(t, p.Audit)
	assert.Equal(t, 1, p.Audit.ByRule["host_read"])
}

// TestRecompileIsCounted: a module whose compiled guard stops holding
// (it bakes in a Python attribute it changes) recompiles after warm-up;
// the step reports it with Dynamo's reason and the program counts it.
func TestRecompileIsCounted(t *testing.T) {
	python := torch2(t)
	m := torchModule(t, "counting", "self.calls = 0", "self.calls += 1\nreturn x * self.calls")
	grid, err := bucketing.NewGrid([]int{2}, nil)
	require.NoError(t, err)
	// A stall timeout shorter than any recompile: the step that recompiles
	// says it builds a graph, and is waited for as a compile is.
	// Inductor's cache is a fresh one, so that the recompile compiles.
	e, reg := newEngine(t, Options{Python: python, TorchCompile: "inductor", StrictWarmup: false, StallTimeout: time.Second,
		Env: map[string]string{"TORCHINDUCTOR_CACHE_DIR": t.TempDir()}})
	prog, _, err := loadAndWarm(t, e, m, grid, false)
	require.NoError(t, err)
	x, err := prog.Step(context.Background(), 0)
	require.NoError(t, err)
	assert.Equal(t, engine.Count(1), x.Recompiles)
	v := steps.Check(&x)
	assert.Equal(t, int64(1), v.Fired[steps.Recompile])
	assert.Contains(t, strings.Join(x.Reasons, "; "), "calls", "Dynamo's guard failure names the attribute")
	p := programsOf(t, prog)[0]
	assert.GreaterOrEqual(t, int64(p.Recompiles), int64(2), "warm-up's second run and this step")
	assert.NotEmpty(t, p.RecompileReasons)
	assert.Eventually(t, func() bool {
		v, ok := gaugeValue(reg, "stepserve_program_recompiles", map[string]string{"model": "counting"})
		return ok && v >= 2
	}, 5*time.Second, 100*time.Millisecond, "the recompiles reach the gauge")
}

// TestCompileCacheServesASecondStart: inductor's caches under
// rbln.compile_cache_dir make a second start of the same model compile
// nothing new: every bucket a cache hit. (The load times of both starts
// are logged; tests assert no times.)
func TestCompileCacheServesASecondStart(t *testing.T) {
	python := torch2(t)
	// A small module of its own, quick to compile, as the cache is cold.
	m := torchModule(t, "cached", "self.scale = torch.nn.Parameter(torch.full((64,), 0.5))", "return torch.tanh(x * self.scale) + x")
	m.Config.Buckets.Batch = []int{1, 4}
	grid, err := bucketing.NewGrid([]int{1, 4}, nil)
	require.NoError(t, err)
	cache := t.TempDir()
	for start, want := range []bool{false, true} {
		e, _ := newEngine(t, Options{Python: python, TorchCompile: "inductor", StrictWarmup: true, CompileCacheDir: cache})
		began := time.Now()
		prog, _, err := loadAndWarm(t, e, m, grid, true)
		require.NoError(t, err)
		took := time.Since(began)
		for _, p := range programsOf(t, prog) {
			require.NotNil(t, p.CacheHit, "%s: inductor says whether its cache served it", p.Bucket)
			assert.Equal(t, want, *p.CacheHit, "start %d, %s", start+1, p.Bucket)
			assert.Equal(t, engine.Count(1), p.Graphs)
		}
		t.Logf("start %d: loaded and warmed (2 buckets) in %v", start+1, took.Round(10*time.Millisecond))
		require.NoError(t, prog.Close())
		require.NoError(t, e.Close())
	}
	entries, err := os.ReadDir(filepath.Join(cache, "inductor"))
	require.NoError(t, err, "inductor's cache is under rbln.compile_cache_dir")
	assert.NotEmpty(t, entries)
}

// TestAuditOfShippedModels compiles the smallest bucket of every shipped
// model the torch engine runs as steps (the language model's steps are
// audited by the worker's tests) with inductor, and logs what the step
// audit finds in each, by rule, operator and line. Each compiles whole, and
// stepserve's own step code makes no tensor inside the step. make
// test-long runs it (it compiles five models).
func TestAuditOfShippedModels(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles every shipped model: make test-long")
	}
	python := torch2(t)
	e, _ := newEngine(t, Options{Python: python, TorchCompile: "inductor", StrictWarmup: true})
	for _, name := range []string{"digits", "digits-cnn", "tiny-encoder", "tiny-xlmr", "tiny-reranker"} {
		t.Run(name, func(t *testing.T) {
			m, err := models.Load("../../model_repository/" + name)
			require.NoError(t, err)
			m.Config.Engine = "torch"
			var seq []int
			if len(m.Config.Buckets.Seq) > 0 {
				seq = m.Config.Buckets.Seq[:1]
			}
			grid, err := bucketing.NewGrid(m.Config.Buckets.Batch[:1], seq)
			require.NoError(t, err)
			prog, _, err := loadAndWarm(t, e, m, grid, false)
			require.NoError(t, err)
			p := programsOf(t, prog)[0]
			assert.Equal(t, "inductor", p.Compiler)
			assert.Equal(t, engine.Count(1), p.Graphs)
			assert.Equal(t, engine.Count(0), p.GraphBreaks)
			require.NotNil(t, p.Audit)
			assert.Empty(t, p.Audit.Error)
			assert.Zero(t, p.Audit.ByRule["created_in_step"], "%+v", p.Audit.Findings)
			t.Logf("%s %s: audit %v", name, p.Bucket, p.Audit.ByRule)
			for _, f := range p.Audit.Findings {
				t.Logf("  %s (item %d): %s %s at %s: %s", f.Rule, f.Item, f.Op, f.Dtype, f.Line, f.Code)
			}
		})
	}
}

// TestProgramMetricsWithTwoProgramsOfOneModel: two programs of one model
// on one worker (per_device replicas; the old and new versions through a
// reload) export one series per bucket, never the same series twice,
// which would fail the whole scrape, and never none because the newest
// has not built the bucket yet (a replica builds it on first use).
func TestProgramMetricsWithTwoProgramsOfOneModel(t *testing.T) {
	requireTorch(t)
	e, reg := newEngine(t, Options{})
	m := loadDigits(t)
	m.Config.Instances.PerDevice = 2
	grid, err := bucketing.NewGrid([]int{1}, nil)
	require.NoError(t, err)
	prog, _, err := loadAndWarm(t, e, m, grid, false)
	require.NoError(t, err)
	require.Len(t, engine.ReplicasOf(prog), 2)
	var reports []engine.ProgramReport
	require.Eventually(t, func() bool {
		// Each call reads the workers' reports again (a read may time out
		// on a loaded machine).
		reports = programsOf(t, prog)
		return len(reports) == 2 && (reports[0].Built || reports[1].Built)
	}, 30*time.Second, 100*time.Millisecond, "a report per replica's program, one built at least")
	assert.Equal(t, "none", reports[0].Compiler, "the host's torch 1.13 compiles nothing")
	n, err := testutil.GatherAndCount(reg, "stepserve_program_graphs")
	require.NoError(t, err, "the scrape holds")
	assert.Equal(t, 1, n, "one series for the bucket")
}

// compiledDecoderFamilies are the decoder families the compiled tests
// run: Llama (GQA, untied head), Mistral (a sliding window shorter than
// the prompts, tied) and Qwen2 (q/k/v biases, llama3 RoPE scaling, four
// query heads a key/value head). Llama's decode steps run in two context
// partitions, so that its sequences cross from one to the next.
var compiledDecoderFamilies = []struct {
	name    string
	shape   randweights.Decoder
	context string
}{
	{"llama", enginetest.DecoderShapes["llama"], "[64]"},
	{"mistral", randweights.Decoder{Arch: "MistralForCausalLM", Vocab: 512, Hidden: 64, Layers: 2, Heads: 4, KVHeads: 1, Inter: 128,
		MaxPosition: 2048, RopeTheta: 10000, Tied: true, SlidingWindow: 24, BOS: 0, EOS: 2}, "[128]"},
	{"qwen2", enginetest.DecoderShapes["qwen2"], "[128]"},
}

// TestCompiledDecoderAgreesWithEagerAndCPU: every decoder family on the
// torch engine compiled with inductor in the torch 2.x root, strict
// warm-up: every prefill and decode bucket one graph, no break, no
// recompile and nothing found by the step audit after batched, chunked,
// preempted and prefix-sharing generations; greedy and seeded tokens, and
// greedy ones under token masks and seeded ones under penalties and a
// logit bias (the decode buckets' masked twins), the same as the eager
// torch engine's and the CPU engine's.
func TestCompiledDecoderAgreesWithEagerAndCPU(t *testing.T) {
	python := torch2(t)
	const n = 64
	prompts := enginetest.Prompts(1, 5, 17, 40)
	sampling := make([]generation.Sampling, len(prompts))
	for i := range sampling {
		sampling[i] = generation.Sampling{Temperature: 0.8, TopK: 40 * (i % 2), TopP: []float32{1, 0.9}[i/2%2], Seed: uint64(100 + i), Logprobs: 2}
	}
	for _, fam := range compiledDecoderFamilies {
		t.Run(fam.name, func(t *testing.T) {
			// A tight cache: prompts are chunked, rows pad, and sequences
			// are preempted and recomputed.
			dir := enginetest.WriteDecoder(t, fam.shape, 11, "engine: torch\nbuckets:\n  batch: [4]\n  seq: [32]\n  context: "+fam.context+
				"\ngeneration:\n  max_model_len: 128\n  max_num_seqs: 4\n  max_batch_tokens: 48\n  block_size: 16\n  kv_cache_blocks: 20\n")
			m, err := models.Load(dir)
			require.NoError(t, err)
			compiled, _ := newEngine(t, Options{Python: python, TorchCompile: "inductor", StrictWarmup: true, StallTimeout: time.Minute})
			eager, _ := newEngine(t, Options{Python: python, TorchCompile: "off", StrictWarmup: true})
			var got [3][4][][]int32 // engine, greedy or seeded or greedy under token masks or seeded under penalties
			penalized := slices.Clone(sampling)
			for i := range penalized {
				penalized[i].Penalties = generation.Penalties{Repetition: 1.3, Frequency: 0.2 * float32(i%2), Presence: 0.3,
					Bias: []generation.LogitBias{{Token: int32(5 + i), Bias: 2}}}
			}
			strides := func(i int) generation.Constraint {
				return &enginetest.Stride{Vocab: m.Decoder.Config.Vocab, Every: 3 + i, Offset: 7 * i}
			}
			for i, load := range []func() (generation.Model, error){
				func() (generation.Model, error) { return cpufallback.Engine{}.LoadDecoder(context.Background(), m) },
				func() (generation.Model, error) { return eager.LoadDecoder(context.Background(), m) },
				func() (generation.Model, error) { return compiled.LoadDecoder(context.Background(), m) },
			} {
				dec, err := load()
				require.NoError(t, err)
				t.Cleanup(func() { dec.(engine.Decoder).Close() })
				loop := enginetest.StartLoop(t, dec, m)
				got[i][0] = enginetest.Generate(t, loop, prompts, n, nil)
				got[i][1] = enginetest.Generate(t, loop, prompts, 24, sampling)
				got[i][2] = enginetest.GenerateUnder(t, loop, prompts, 16, nil, strides)
				got[i][3] = enginetest.Generate(t, loop, prompts, 16, penalized)
				if i == 2 {
					reports := dec.(engine.ProgramReporter).Programs(context.Background())
					require.Len(t, reports, 2+2*len(m.Config.Buckets.Context), "a prefill and its scoring twin, the decodes and their masked twins")
					enginetest.CompiledWhole(t, reports)
				}
			}
			assert.Equal(t, got[0][0], got[1][0], "greedy: CPU engine and eager torch")
			assert.Equal(t, got[1][0], got[2][0], "greedy: eager and compiled torch")
			assert.Equal(t, got[0][1], got[1][1], "seeded: CPU engine and eager torch")
			assert.Equal(t, got[1][1], got[2][1], "seeded: eager and compiled torch")
			assert.Equal(t, got[0][2], got[1][2], "greedy under masks: CPU engine and eager torch")
			assert.Equal(t, got[1][2], got[2][2], "greedy under masks: eager and compiled torch")
			assert.Equal(t, got[0][3], got[1][3], "seeded under penalties: CPU engine and eager torch")
			assert.Equal(t, got[1][3], got[2][3], "seeded under penalties: eager and compiled torch")
		})
	}
}
