package rbln

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"log/slog"
	"math"
	"os"
	"os/exec"
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
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

const python = "/usr/bin/python3"

// requireTorch fails (not skips) without Debian's python3-torch: make test
// installs it, and these tests are how the worker is tested for real.
func requireTorch(t testing.TB) {
	t.Helper()
	if out, err := exec.Command(python, "-c", "import torch").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import torch (install python3-torch: make deps): %v\n%s", python, err, out)
	}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// newEngine makes an engine for a test: the torch engine (workers on
// torch's CPU, which is what this machine has) unless opts asks for rbln.
func newEngine(t *testing.T, opts Options) (*Engine, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	if opts.Device == "" {
		opts.Device = DeviceCPU
	}
	if opts.Python == "" {
		opts.Python = python
	}
	opts.Logger = testLogger(t)
	opts.Registerer = reg
	if opts.StallTimeout == 0 {
		opts.StallTimeout = 5 * time.Second
	}
	opts.PingInterval = 200 * time.Millisecond
	e, err := New(opts)
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	return e, reg
}

func fakeRBLN() string {
	p, _ := filepath.Abs("worker/testdata/fake_torch_rbln")
	return p
}

func loadDigits(t testing.TB) *models.Model {
	m, err := models.Load("../../model_repository/digits")
	require.NoError(t, err)
	return m
}

func runners(t *testing.T, m *models.Model, e engine.Engine) *steps.Runner {
	grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, nil)
	require.NoError(t, err)
	return warmRunner(t, m, e, grid)
}

func digitsRequest(rows int, seed float32) *steps.Request {
	in := make([]byte, rows*64*4)
	for i := range rows * 64 {
		v := float32(math.Mod(float64(seed)+float64(i)*7.3, 17))
		binary.LittleEndian.PutUint32(in[4*i:], math.Float32bits(v))
	}
	return &steps.Request{Rows: rows, Inputs: [][]byte{in}, Outputs: [][]byte{make([]byte, rows*40)}}
}

func floats(b []byte) []float64 {
	out := make([]float64, len(b)/4)
	for i := range out {
		out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return out
}

// TestWorkerMatchesTheCPUEngine runs the digits model in a real worker
// (torch on the CPU) and on the Go CPU engine.
func TestWorkerMatchesTheCPUEngine(t *testing.T) {
	requireTorch(t)
	e, reg := newEngine(t, Options{})
	m := loadDigits(t)
	onWorker := runners(t, m, e)
	onCPU := runners(t, m, cpufallback.Engine{})
	for _, rows := range []int{1, 3, 17, 40} {
		a, b := digitsRequest(rows, float32(rows)), digitsRequest(rows, float32(rows))
		require.NoError(t, onWorker.Run(context.Background(), []*steps.Request{a}))
		require.NoError(t, onCPU.Run(context.Background(), []*steps.Request{b}))
		fa, fb := floats(a.Outputs[0]), floats(b.Outputs[0])
		worst := 0.0
		for i := range fa {
			worst = math.Max(worst, math.Abs(fa[i]-fb[i]))
		}
		assert.Less(t, worst, 1e-4, "%d rows", rows)
	}
	assert.Equal(t, 1.0, testutil.ToFloat64(e.metrics.workerUp.WithLabelValues("cpu")))
	n, _ := testutil.GatherAndCount(reg, "stepserve_device_memory_bytes")
	assert.Zero(t, n, "torch's CPU has no per-chiplet memory: no series, not zeros")
	assert.Equal(t, "torch", e.Name())
}

func TestStepsWithoutExplainAreUnmeasured(t *testing.T) {
	requireTorch(t)
	e, _ := newEngine(t, Options{})
	m := loadDigits(t)
	grid, _ := bucketing.NewGrid([]int{1}, nil)
	prog, err := e.Load(context.Background(), m, grid.Shapes())
	require.NoError(t, err)
	require.NoError(t, prog.Compile(context.Background(), 0))
	x, err := prog.Step(context.Background(), 0)
	require.NoError(t, err)
	assert.False(t, x.Measured)
	assert.Equal(t, engine.Unknown, x.H2D, "unknown, never zero")
	assert.Equal(t, engine.Unknown, x.CPUFallbacks)
	assert.Contains(t, x.Reasons[0], "torch.rbln.explain is unavailable")
}

func scenario(t *testing.T, path string, s map[string]any) {
	b, err := json.Marshal(s)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

// TestExplainScenarios scripts torch.rbln with the test double and checks
// the normalized report and the step verdict for each kind of signal, with
// the key sets of newer and older torch-rbln releases.
func TestExplainScenarios(t *testing.T) {
	requireTorch(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "scenario.json")
	e, reg := newEngine(t, Options{Env: map[string]string{"PYTHONPATH": fakeRBLN(), "STEPSERVE_FAKE_RBLN_SCENARIO": path}})
	clean := map[string]any{
		"verdict": map[string]any{"clean": true, "reasons": []string{}},
		"dump": map[string]any{
			"hidden_host_bounce": map[string]any{"by_site": map[string]any{}, "total_count": 0, "total_bytes": 0},
			"dispatch":           map[string]any{"total": 3, "cpu_fallback": 0, "recompile_miss": 0, "warm_hit": 3},
			"wall_ns":            12345,
			"runtime":            map[string]any{"by_primitive": map[string]any{"h2v": map[string]any{"calls": 1, "ns": 700}, "v2h": map[string]any{"calls": 1, "ns": 900}}},
			"runtime_residency":  map[string]any{"available": true, "total_count": 0},
		},
		"report": "[overhead: 1 signal] fake report",
	}
	scenario(t, path, clean)
	m := loadDigits(t)
	grid, _ := bucketing.NewGrid([]int{1}, nil)
	prog, err := e.Load(context.Background(), m, grid.Shapes())
	require.NoError(t, err)
	require.NoError(t, prog.Compile(context.Background(), 0))

	with := func(mut func(d map[string]any, v map[string]any)) map[string]any {
		b, _ := json.Marshal(clean)
		var s map[string]any
		json.Unmarshal(b, &s)
		mut(s["dump"].(map[string]any), s["verdict"].(map[string]any))
		return s
	}
	for _, tc := range []struct {
		name  string
		s     map[string]any
		check func(t *testing.T, x engine.Explain, v steps.Verdict)
	}{
		{"clean", clean, func(t *testing.T, x engine.Explain, v steps.Verdict) {
			assert.True(t, v.Clean)
			assert.Equal(t, engine.Count(1), x.H2D)
			assert.Equal(t, engine.Count(12345), x.WallNS)
			assert.Equal(t, [2]engine.Count{700, 900}, [2]engine.Count{x.H2DNS, x.D2HNS})
			assert.Equal(t, engine.Count(0), x.V2VSlow)
			assert.Equal(t, engine.Unknown, x.V2V, "a primitive the runtime's table leaves out is unknown")
			assert.Empty(t, x.Report, "report text is kept only for steps that are not clean")
		}},
		{"cpu fallback", with(func(d, v map[string]any) {
			v["clean"], v["reasons"] = false, []string{"cpu_fallback: aten::nonzero"}
			d["dispatch"].(map[string]any)["cpu_fallback"] = 2
			d["cpu_fallback_by_op"] = map[string]any{"aten::nonzero": 2}
		}), func(t *testing.T, x engine.Explain, v steps.Verdict) {
			assert.False(t, v.Clean)
			assert.Equal(t, int64(2), v.Fired[steps.CPUFallback])
			assert.Equal(t, map[string]int64{"aten::nonzero": 2}, x.CPUFallbackByOp)
			assert.Equal(t, "[overhead: 1 signal] fake report", x.Report, "the report text of a step that is not clean is kept")
		}},
		{"recompile", with(func(d, v map[string]any) {
			v["clean"] = false
			d["dispatch"].(map[string]any)["recompile_miss"] = 1
		}), func(t *testing.T, x engine.Explain, v steps.Verdict) {
			assert.Equal(t, int64(1), v.Fired[steps.Recompile])
		}},
		{"host bounce, older keys", with(func(d, v map[string]any) {
			v["clean"] = false
			d["hidden_host_bounce"] = map[string]any{"by_site": map[string]any{"x.py:3": 1}, "total_count": 1, "total_bytes": 512}
			d["rebel_runtime"] = d["runtime"]
			delete(d, "runtime")
			delete(d, "wall_ns")
		}), func(t *testing.T, x engine.Explain, v steps.Verdict) {
			assert.Equal(t, int64(1), v.Fired[steps.HostBounce])
			assert.Equal(t, engine.Count(512), x.HostBounceBytes)
			assert.Equal(t, engine.Count(1), x.H2D, "rebel_runtime is read too")
			assert.Equal(t, engine.Unknown, x.WallNS)
		}},
		{"extra transfers the verdict missed", with(func(d, v map[string]any) {
			d["runtime"].(map[string]any)["by_primitive"].(map[string]any)["h2v_multi"] = map[string]any{"calls": 2}
		}), func(t *testing.T, x engine.Explain, v steps.Verdict) {
			assert.False(t, v.Clean)
			assert.Equal(t, int64(2), v.Fired[steps.ExtraH2D])
		}},
		{"no copy out", with(func(d, v map[string]any) {
			d["runtime"].(map[string]any)["by_primitive"].(map[string]any)["v2h"] = map[string]any{"calls": 0}
		}), func(t *testing.T, x engine.Explain, v steps.Verdict) {
			assert.False(t, v.Clean, "zero copies out is not the one a clean step makes")
			assert.Equal(t, int64(1), v.Fired[steps.MissingD2H])
		}},
		{"a host step, no copy either way (the real torch_rbln on the torch engine)", with(func(d, v map[string]any) {
			v["clean"], v["reasons"] = false, []string{"missing h2d: 0 host-to-device copies", "missing d2h: 0 device-to-host copies"}
			bp := d["runtime"].(map[string]any)["by_primitive"].(map[string]any)
			bp["h2v"], bp["v2h"] = map[string]any{"calls": 0, "ns": 0}, map[string]any{"calls": 0, "ns": 0}
		}), func(t *testing.T, x engine.Explain, v steps.Verdict) {
			assert.True(t, v.Unmeasured, "unmeasured for device transfers, not failed: %v", x.Reasons)
			assert.Empty(t, v.Fired, "no missing_* signal on the host")
			assert.Equal(t, [2]engine.Count{engine.Unknown, engine.Unknown}, [2]engine.Count{x.H2D, x.D2H})
			assert.Contains(t, strings.Join(x.Notes, "; "), "host step")
		}},
		{"slow device copies", with(func(d, v map[string]any) {
			v["clean"], v["reasons"] = false, []string{"runtime hidden d2h [src_not_on_device]: 2x"}
			v["notes"] = []any{map[string]any{"signal": "runtime/v2v_slow:src_not_on_device", "fix": "establish device residency"}}
			d["runtime_residency"] = map[string]any{"available": true, "total_count": 2}
			d["cpu_fallback_reasons"] = map[string]any{"dtype-not-fp16": 1}
		}), func(t *testing.T, x engine.Explain, v steps.Verdict) {
			assert.Equal(t, int64(2), v.Fired[steps.V2VSlow])
			assert.Equal(t, []string{"runtime/v2v_slow:src_not_on_device: establish device residency"}, x.Notes)
			assert.Equal(t, map[string]int64{"dtype-not-fp16": 1}, x.CPUFallbackReasons)
		}},
		{"unknown fields", map[string]any{"verdict": map[string]any{"clean": true}, "dump": map[string]any{"dispatch": "?"}}, func(t *testing.T, x engine.Explain, v steps.Verdict) {
			assert.True(t, x.Measured)
			assert.Equal(t, engine.Unknown, x.H2D)
			assert.Equal(t, engine.Unknown, x.CPUFallbacks)
			assert.False(t, v.Clean, "nothing known fired, but nobody counted the copies either")
			assert.True(t, v.Unmeasured)
		}},
		{"explain raises", map[string]any{"raise_on_enter": true}, func(t *testing.T, x engine.Explain, v steps.Verdict) {
			assert.True(t, v.Unmeasured)
			assert.Contains(t, x.Reasons[0], "RuntimeError")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scenario(t, path, tc.s)
			// A bucket's first step after its compile goes as a message;
			// the next ones ring the doorbell and report in binary. Both
			// must say the same.
			require.NoError(t, prog.Compile(context.Background(), 0))
			viaMessage, err := prog.Step(context.Background(), 0)
			require.NoError(t, err)
			body := prog.(*program).bodyNS.Load()
			x, err := prog.Step(context.Background(), 0)
			require.NoError(t, err)
			assert.Greater(t, prog.(*program).bodyNS.Load(), body, "the second step went over the doorbell")
			// Each says the time of its own body: measured, and not the same.
			assert.Positive(t, int64(viaMessage.DeviceNS), "the message's step body was timed")
			assert.Positive(t, int64(x.DeviceNS), "the doorbell's step body was timed")
			viaMessage.DeviceNS, x.DeviceNS = 0, 0
			// The step after a bucket's first non-clean one is stacked
			// (TestFirstNonCleanStepIsStacked): its call sites and note
			// aside, it says the same.
			if i := slices.IndexFunc(x.Notes, func(n string) bool { return strings.Contains(n, "with_stack=True") }); i >= 0 {
				x.Notes = slices.Delete(x.Notes, i, i+1)
				if len(x.Notes) == 0 {
					x.Notes = nil
				}
				x.Report = strings.TrimSuffix(x.Report, "\n  at model.py:12 (fake stack)")
			}
			want, _ := json.Marshal(viaMessage)
			got, _ := json.Marshal(x)
			x.DeviceNS = engine.Count(prog.(*program).bodyNS.Load() - body)
			assert.JSONEq(t, string(want), string(got), "the binary report says what the message said")
			v := steps.Check(&x)
			tc.check(t, x, v)
		})
	}
	n, _ := testutil.GatherAndCount(reg, "stepserve_device_memory_bytes")
	assert.Zero(t, n, "a worker on the host CPU reads no NPU's memory, even where torch.rbln could")
}

// BenchmarkStepRoundTrip measures one step of a trivial model (a 64 -> 64
// linear layer, one row) through the worker (Go -> doorbell -> worker ->
// shared memory -> Go), with the explain test double on (every step is
// measured and clean), and on the CPU engine, in the same run. The torch
// engine's host-µs/step is the round trip less the time the worker spent
// inside the step body (copy in, graph, copy out): what stepserve adds to
// a step.
func BenchmarkStepRoundTrip(b *testing.B) {
	dir := b.TempDir()
	w := make([]float32, 64*64)
	for i := range 64 {
		w[i*64+i] = 1
	}
	f, err := os.Create(filepath.Join(dir, "weights.safetensors"))
	require.NoError(b, err)
	require.NoError(b, models.WriteSafetensors(f, []*models.Tensor{
		{Name: "layers.0.weight", Shape: []int{64, 64}, Data: w},
		{Name: "layers.0.bias", Shape: []int{64}, Data: make([]float32, 64)},
	}, nil))
	f.Close()
	require.NoError(b, os.WriteFile(filepath.Join(dir, "model.yaml"), []byte(`
architecture: mlp
mlp: {sizes: [64, 64]}
inputs: [{name: x, datatype: FP32, shape: [-1, 64]}]
outputs: [{name: y, datatype: FP32, shape: [-1, 64]}]
buckets: {batch: [1]}
`), 0o644))
	m, err := models.Load(dir)
	require.NoError(b, err)
	e, err := New(Options{Device: DeviceCPU, Python: python, Env: map[string]string{"PYTHONPATH": fakeRBLN()}})
	require.NoError(b, err)
	defer e.Close()
	for _, eng := range []engine.Engine{e, cpufallback.Engine{}} {
		prog, err := eng.Load(context.Background(), m, []bucketing.Shape{{Batch: 1}})
		require.NoError(b, err)
		require.NoError(b, prog.Compile(context.Background(), 0))
		for range 2 { // warm-up: the first run builds the graph
			_, err := prog.Step(context.Background(), 0)
			require.NoError(b, err)
		}
		b.Run(eng.Name(), func(b *testing.B) {
			p, _ := prog.(*program)
			var body0 int64
			if p != nil {
				body0 = p.bodyNS.Load()
			}
			// Each step's round trip less its body, for the median.
			var host []float64
			for b.Loop() {
				start := time.Now()
				x, err := prog.Step(context.Background(), 0)
				if err != nil {
					b.Fatal(err)
				}
				if p != nil {
					body := p.bodyNS.Load()
					host = append(host, float64(time.Since(start).Nanoseconds()-(body-body0))/1e3)
					body0 = body
					if !x.Clean {
						b.Fatalf("step not clean under the explain double: %+v", x)
					}
				}
			}
			if len(host) > 0 {
				slices.Sort(host)
				b.ReportMetric(host[len(host)/2], "host-µs/step")
				b.ReportMetric(host[len(host)*9/10], "host-p90-µs/step")
			}
		})
		if p, ok := prog.(*program); ok {
			// The same step sent as a JSON message, as every step was
			// before the doorbell (a bucket's first still is): the
			// baseline, in the same run.
			b.Run(eng.Name()+"-message", func(b *testing.B) {
				var trips []float64
				for b.Loop() {
					p.mu.Lock()
					p.ran[0] = false
					p.mu.Unlock()
					start := time.Now()
					if _, err := prog.Step(context.Background(), 0); err != nil {
						b.Fatal(err)
					}
					trips = append(trips, float64(time.Since(start).Nanoseconds())/1e3)
				}
				slices.Sort(trips)
				b.ReportMetric(trips[len(trips)/2], "round-trip-µs")
			})
		}
		prog.Close()
	}
}

// TestReloadKeepsBothVersionsApart: while a model reloads, its old and new
// programs live on the same worker; each steps on its own buffers, and
// closing the old one leaves the new one serving.
func TestReloadKeepsBothVersionsApart(t *testing.T) {
	requireTorch(t)
	e, _ := newEngine(t, Options{})
	m := loadDigits(t)
	grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, nil)
	require.NoError(t, err)
	load := func() (engine.Program, *steps.Runner) {
		prog, err := e.Load(context.Background(), m, grid.Shapes())
		require.NoError(t, err)
		r, err := steps.New(steps.Options{Model: m, Program: prog, Grid: grid, Engine: e.Name()})
		require.NoError(t, err)
		_, err = r.Warmup(context.Background())
		require.NoError(t, err)
		return prog, r
	}
	oldProg, old := load()
	want := digitsRequest(2, 3)
	require.NoError(t, old.Run(context.Background(), []*steps.Request{want}))

	newProg, fresh := load()
	defer newProg.Close()
	got := digitsRequest(2, 3)
	require.NoError(t, old.Run(context.Background(), []*steps.Request{got}), "the old version still serves after the new one loaded")
	assert.InDeltaSlice(t, floats(want.Outputs[0]), floats(got.Outputs[0]), 1e-6)

	require.NoError(t, oldProg.Close())
	got = digitsRequest(2, 3)
	require.NoError(t, fresh.Run(context.Background(), []*steps.Request{got}), "closing the old version leaves the new one loaded")
	assert.InDeltaSlice(t, floats(want.Outputs[0]), floats(got.Outputs[0]), 1e-6)
	assert.True(t, newProg.Healthy())
}

// TestFirstNonCleanStepIsStacked: after a bucket's first step that is not
// clean, its next step opens its explain region with_stack=True, once, so
// that /explain shows the call sites; the dispatch detail reaches the
// report (issue 33, item 8).
func TestFirstNonCleanStepIsStacked(t *testing.T) {
	requireTorch(t)
	dir := t.TempDir()
	path, log := filepath.Join(dir, "scenario.json"), filepath.Join(dir, "regions")
	scenario(t, path, map[string]any{
		"verdict": map[string]any{"clean": false, "reasons": []string{"cpu_fallback: aten::nonzero"}},
		"dump": map[string]any{"dispatch": map[string]any{"total": 4, "warm_hit": 3, "cpu_fallback": 1, "cpu_fallback_ns": 5000, "recompile_miss": 0},
			"runtime": map[string]any{"total_ns": 9000, "by_primitive": map[string]any{"h2v": map[string]any{"calls": 1, "ns": 1}, "v2h": map[string]any{"calls": 1, "ns": 1},
				"v2v": map[string]any{"calls": 2, "ns": 300}}}},
		"report": "[overhead] fake"})
	e, _ := newEngine(t, Options{Env: map[string]string{"PYTHONPATH": fakeRBLN(), "STEPSERVE_FAKE_RBLN_SCENARIO": path, "STEPSERVE_FAKE_RBLN_REGIONS": log}})
	m := loadDigits(t)
	grid, _ := bucketing.NewGrid([]int{1}, nil)
	prog, err := e.Load(context.Background(), m, grid.Shapes())
	require.NoError(t, err)
	t.Cleanup(func() { prog.Close() })
	require.NoError(t, prog.Compile(context.Background(), 0))
	var xs []engine.Explain
	for range 4 {
		x, err := prog.Step(context.Background(), 0)
		require.NoError(t, err)
		xs = append(xs, x)
	}
	b, err := os.ReadFile(log)
	require.NoError(t, err)
	assert.Equal(t, "region\nregion with_stack\nregion\nregion\n", string(b), "the step after the first non-clean one, once")
	assert.Contains(t, xs[1].Report, "(fake stack)")
	assert.Contains(t, strings.Join(xs[1].Notes, "; "), "with_stack=True")
	assert.NotContains(t, xs[2].Report, "(fake stack)")
	for i, x := range xs {
		require.NotNil(t, x.Dispatch, "step %d", i)
		assert.Equal(t, engine.Dispatch{Total: 4, WarmHits: 3, CPUFallbackNS: 5000, RuntimeNS: 9000, V2VNS: 300}, *x.Dispatch, "step %d (message and doorbell alike)", i)
	}
}
