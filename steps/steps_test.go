package steps

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/models"
)

// doubler is a test double of engine.Program for a model with one FP32
// input and one FP32 output of the same width: each step writes twice the
// input rows, and records what the input staging held.
type doubler struct {
	layouts []engine.Layout
	staging [][2][]byte
	seen    []stepRecord
	explain engine.Explain
	err     error
}

type stepRecord struct {
	bucket int
	input  []float32
}

func newDoubler(cfg *models.Config, grid *bucketing.Grid) *doubler {
	d := &doubler{explain: engine.Explain{Measured: true, Clean: true, H2D: 1, D2H: 1}}
	for _, s := range grid.Shapes() {
		l := engine.NewLayout(cfg, s)
		d.layouts = append(d.layouts, l)
		in := make([]byte, l.InBytes)
		for i := range in {
			in[i] = 0xAB // garbage a previous step might have left
		}
		d.staging = append(d.staging, [2][]byte{in, make([]byte, l.OutBytes)})
	}
	return d
}

func (d *doubler) Compile(context.Context, int) error { return nil }
func (d *doubler) Close() error                       { return nil }
func (d *doubler) Healthy() bool                      { return true }
func (d *doubler) Staging(b int) ([]byte, []byte)     { return d.staging[b][0], d.staging[b][1] }
func (d *doubler) Step(_ context.Context, b int) (engine.Explain, error) {
	in, out := d.staging[b][0], d.staging[b][1]
	vals := decode(in[:d.layouts[b].Inputs[0].Bytes])
	d.seen = append(d.seen, stepRecord{bucket: b, input: vals})
	for i, v := range vals {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(2*v))
	}
	return d.explain, d.err
}

func decode(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func encode(v ...float32) []byte {
	var b []byte
	for _, f := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return b
}

func testModel() *models.Model {
	return &models.Model{Name: "m", Config: &models.Config{
		Inputs:  []models.TensorSpec{{Name: "x", Datatype: models.FP32, Shape: []int{-1, 2}}},
		Outputs: []models.TensorSpec{{Name: "y", Datatype: models.FP32, Shape: []int{-1, 2}}},
	}}
}

func newRunner(t *testing.T, batch []int) (*Runner, *doubler, *[]Observation) {
	m := testModel()
	grid, err := bucketing.NewGrid(batch, nil)
	require.NoError(t, err)
	d := newDoubler(m.Config, grid)
	var obs []Observation
	r, err := New(Options{Model: m, Program: d, Engine: "fake", Grid: grid, StrictWarmup: true, Observe: func(o Observation) { obs = append(obs, o) }})
	require.NoError(t, err)
	return r, d, &obs
}

func request(rows int, first float32) *Request {
	var vals []float32
	for i := range 2 * rows {
		vals = append(vals, first+float32(i))
	}
	return &Request{Rows: rows, Inputs: [][]byte{encode(vals...)}, Outputs: [][]byte{make([]byte, rows*8)}}
}

func TestRunPacksPadsAndUnpacks(t *testing.T) {
	r, d, obs := newRunner(t, []int{1, 4, 8})
	a, b := request(1, 10), request(2, 100)
	require.NoError(t, r.Run(context.Background(), []*Request{a, b}))

	require.Len(t, d.seen, 1)
	assert.Equal(t, 1, d.seen[0].bucket, "3 rows go to the 4 bucket")
	assert.Equal(t, []float32{10, 11, 100, 101, 102, 103, 0, 0}, d.seen[0].input, "padding row is zeroed")
	assert.Equal(t, []float32{20, 22}, decode(a.Outputs[0]))
	assert.Equal(t, []float32{200, 202, 204, 206}, decode(b.Outputs[0]))

	require.Len(t, *obs, 1)
	assert.Equal(t, 3, (*obs)[0].Rows)
	assert.Equal(t, bucketing.Shape{Batch: 4}, (*obs)[0].Bucket)
	assert.True(t, (*obs)[0].Verdict.Clean)
}

func TestRunSplitsALargeRequestAcrossSteps(t *testing.T) {
	r, d, _ := newRunner(t, []int{1, 2, 4})
	a, b := request(3, 0), request(4, 1000)
	require.NoError(t, r.Run(context.Background(), []*Request{a, b}))

	// 7 rows: a full 4 bucket (a's 3 rows and b's first), then b's other 3
	// rows padded into the 4 bucket.
	require.Len(t, d.seen, 2)
	assert.Equal(t, []float32{0, 1, 2, 3, 4, 5, 1000, 1001}, d.seen[0].input)
	assert.Equal(t, []float32{1002, 1003, 1004, 1005, 1006, 1007, 0, 0}, d.seen[1].input)
	assert.Equal(t, []float32{0, 2, 4, 6, 8, 10}, decode(a.Outputs[0]))
	assert.Equal(t, []float32{2000, 2002, 2004, 2006, 2008, 2010, 2012, 2014}, decode(b.Outputs[0]))
}

// A request run a part per step, with another request sharing a step,
// gets the same outputs as run whole, and the parts share its buffers.
func TestRunALargeRequestAPartPerStep(t *testing.T) {
	r, d, _ := newRunner(t, []int{1, 2, 4})
	q, other := request(7, 0), request(1, 1000)
	q.Elements = 14
	var part *Request
	for _, rows := range [][2]int{{0, 4}, {4, 5}} {
		part = q.Part(rows[0], rows[1], part)
		require.NoError(t, r.Run(context.Background(), []*Request{part}))
	}
	part = q.Part(5, 7, part)
	assert.Equal(t, 4, part.Elements, "its share of the elements")
	require.NoError(t, r.Run(context.Background(), []*Request{other, part}))

	require.Len(t, d.seen, 3)
	assert.Equal(t, []float32{1000, 1001, 10, 11, 12, 13, 0, 0}, d.seen[2].input, "the last part shares a step")
	assert.Equal(t, []float32{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26}, decode(q.Outputs[0]))
	assert.Equal(t, []float32{2000, 2002}, decode(other.Outputs[0]))

	first := q.Part(0, 1, nil)
	_ = append(first.Outputs[0], 0xFF)
	assert.Equal(t, encode(4), q.Outputs[0][8:12], "a part cannot grow into the rows after it")
}

func TestRunRejectsMismatchedBuffers(t *testing.T) {
	r, _, _ := newRunner(t, []int{1})
	q := request(2, 0)
	q.Inputs[0] = q.Inputs[0][:12]
	err := r.Run(context.Background(), []*Request{q})
	assert.True(t, errors.Is(err, ErrShape))
	assert.ErrorContains(t, err, `input "x" holds 12 bytes, want 16`)
}

func TestRunReportsEngineErrors(t *testing.T) {
	r, d, _ := newRunner(t, []int{2})
	d.err = errors.New("device lost")
	err := r.Run(context.Background(), []*Request{request(1, 0)})
	assert.ErrorContains(t, err, "steps: model m bucket b2: device lost")
}

func TestRunObservesOverheadSteps(t *testing.T) {
	r, d, obs := newRunner(t, []int{2})
	d.explain = engine.Explain{Measured: true, Clean: true, H2D: 3, D2H: 1, CPUFallbacks: 2}
	require.NoError(t, r.Run(context.Background(), []*Request{request(1, 0)}))
	o := (*obs)[0]
	assert.False(t, o.Verdict.Clean)
	assert.False(t, o.Explain.Clean)
	assert.Equal(t, int64(2), o.Verdict.Fired[ExtraH2D])
	assert.Equal(t, int64(2), o.Verdict.Fired[CPUFallback])
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name  string
		in    engine.Explain
		clean bool
		fired map[Signal]int64
	}{
		{"clean", engine.Explain{Measured: true, Clean: true, H2D: 1, D2H: 1}, true, nil},
		{"unknown counters fire nothing", engine.Explain{Measured: true, Clean: true, H2D: 1, D2H: 1, CPUFallbacks: engine.Unknown, Recompiles: engine.Unknown, HostBounces: engine.Unknown, V2VSlow: engine.Unknown}, true, nil},
		{"extra copies make a clean verdict dirty", engine.Explain{Measured: true, Clean: true, H2D: 2, D2H: 4}, false, map[Signal]int64{ExtraH2D: 1, ExtraD2H: 3}},
		{"no copy in is not clean", engine.Explain{Measured: true, Clean: true, H2D: 0, D2H: 1}, false, map[Signal]int64{MissingH2D: 1}},
		{"no copy at all is not clean", engine.Explain{Measured: true, Clean: true}, false, map[Signal]int64{MissingH2D: 1, MissingD2H: 1}},
		{"a slow device copy", engine.Explain{Measured: true, Clean: true, H2D: 1, D2H: 1, V2V: 3, V2VSlow: 2}, false, map[Signal]int64{V2VSlow: 2}},
		{"unknown copies with a signal are overhead", engine.Explain{Measured: true, Clean: false, H2D: engine.Unknown, D2H: engine.Unknown, CPUFallbacks: 1}, false, map[Signal]int64{CPUFallback: 1}},
		{"recompile", engine.Explain{Measured: true, Clean: false, H2D: 1, D2H: 1, Recompiles: 1}, false, map[Signal]int64{Recompile: 1}},
		{"host bounce the engine missed", engine.Explain{Measured: true, Clean: true, H2D: 1, D2H: 1, HostBounces: 2}, false, map[Signal]int64{HostBounce: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := tt.in
			v := Check(&x)
			assert.Equal(t, tt.clean, v.Clean)
			assert.Equal(t, tt.clean, x.Clean)
			assert.False(t, v.Unmeasured)
			for _, s := range Signals() {
				assert.Equal(t, tt.fired[s], v.Fired[s], s.String())
			}
			if !tt.clean {
				assert.NotEmpty(t, x.Reasons)
			}
		})
	}
}

// TestCheckUnmeasured: a step nobody observed, or one whose copies nobody
// counted, is neither clean nor overhead, and says why.
func TestCheckUnmeasured(t *testing.T) {
	for _, tt := range []struct {
		name   string
		in     engine.Explain
		reason string
	}{
		{"not observed", engine.Explain{Clean: true, H2D: engine.Unknown, D2H: engine.Unknown}, "unmeasured"},
		{"copies not counted", engine.Explain{Measured: true, Clean: true, H2D: engine.Unknown, D2H: 1}, "unverified transfers: the engine could not count the step's copies (h2d unknown, d2h 1)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			x := tt.in
			v := Check(&x)
			assert.True(t, v.Unmeasured)
			assert.False(t, v.Clean)
			assert.False(t, x.Clean)
			assert.Equal(t, [numSignals]int64{}, v.Fired)
			require.NotEmpty(t, x.Reasons)
			assert.Contains(t, x.Reasons[len(x.Reasons)-1], tt.reason)
		})
	}
}

func TestSignalLabels(t *testing.T) {
	var names []string
	for _, s := range Signals() {
		names = append(names, s.String())
	}
	assert.Equal(t, []string{"cpu_fallback", "recompile", "host_bounce", "v2v_slow", "extra_h2d", "extra_d2h", "missing_h2d", "missing_d2h", "host_op"}, names)
}

func TestWarmupRunsEveryBucketTwice(t *testing.T) {
	r, d, _ := newRunner(t, []int{1, 4})
	compile, err := r.Warmup(context.Background())
	require.NoError(t, err)
	assert.Len(t, compile, 2)
	require.Len(t, d.seen, 4)
	assert.Equal(t, []int{0, 0, 1, 1}, []int{d.seen[0].bucket, d.seen[1].bucket, d.seen[2].bucket, d.seen[3].bucket})
	assert.Equal(t, []float32{0, 0}, d.seen[0].input, "warm-up runs on zeroed staging")

	d.explain.D2H = 2
	_, err = r.Warmup(context.Background())
	assert.ErrorContains(t, err, "not clean on its second run")
}

// slowDoubler is a doubler whose Compile and Step each take a fixed time.
type slowDoubler struct {
	*doubler
	compile, step time.Duration
}

func (d *slowDoubler) Compile(context.Context, int) error { time.Sleep(d.compile); return nil }
func (d *slowDoubler) Step(ctx context.Context, b int) (engine.Explain, error) {
	time.Sleep(d.step)
	return d.doubler.Step(ctx, b)
}

// TestWarmupCompileTimeIncludesTheFirstRun: torch.compile builds a graph
// on its first call, so a bucket's compile time is its Compile and its
// first run, not its second.
func TestWarmupCompileTimeIncludesTheFirstRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := testModel()
		grid, err := bucketing.NewGrid([]int{1, 4}, nil)
		require.NoError(t, err)
		d := &slowDoubler{doubler: newDoubler(m.Config, grid), compile: time.Second, step: 3 * time.Second}
		r, err := New(Options{Model: m, Program: d, Engine: "fake", Grid: grid})
		require.NoError(t, err)
		compile, err := r.Warmup(context.Background())
		require.NoError(t, err)
		assert.Equal(t, []time.Duration{4 * time.Second, 4 * time.Second}, compile)
		assert.Len(t, d.seen, 4, "two runs per bucket")
	})
}

func TestStatsPerBucket(t *testing.T) {
	r, d, _ := newRunner(t, []int{1, 4})
	a, b := request(1, 0), request(2, 0)
	a.Queued, b.Queued = 3*time.Millisecond, 5*time.Millisecond
	require.NoError(t, r.Run(context.Background(), []*Request{a, b})) // 3 rows in b4
	require.NoError(t, r.Run(context.Background(), []*Request{request(1, 0)}))
	d.explain.D2H = 2
	require.NoError(t, r.Run(context.Background(), []*Request{request(1, 0)}))

	st := r.Stats()
	require.Len(t, st, 2)
	assert.Equal(t, "b1", st[0].Bucket)
	assert.Equal(t, int64(2), st[0].Steps)
	assert.Equal(t, int64(1), st[0].Clean)
	assert.Equal(t, int64(1), st[0].Overhead)
	assert.Equal(t, 1.0, st[0].MeanBatchSize)
	assert.Zero(t, st[0].QueueSeconds.Count, "requests without a queue wait add none")
	assert.Equal(t, 2, st[0].StepSeconds.Count)

	assert.Equal(t, int64(1), st[1].Steps)
	assert.Equal(t, 3.0, st[1].MeanBatchSize)
	assert.InDelta(t, 0.25, st[1].MeanPadding, 1e-12)
	assert.Equal(t, 2, st[1].QueueSeconds.Count)
	assert.InDelta(t, 0.005, st[1].QueueSeconds.P99, 1e-9)
}

// poisoned is a doubler whose every step writes one non-finite value into
// the output staging, at element at when the bucket's output has it.
type poisoned struct {
	*doubler
	at    int
	value float32
}

func (p *poisoned) Step(ctx context.Context, b int) (engine.Explain, error) {
	x, err := p.doubler.Step(ctx, b)
	if _, out := p.Staging(b); 4*p.at < len(out) {
		binary.LittleEndian.PutUint32(out[4*p.at:], math.Float32bits(p.value))
	}
	return x, err
}

func TestWarmupFailsOnNonFiniteOutputs(t *testing.T) {
	for _, tc := range []struct {
		value float32
		want  string
	}{
		{float32(math.NaN()), `steps: model m: warm-up of bucket b4: output "y" has a non-finite value (NaN) at element 3`},
		{float32(math.Inf(-1)), `steps: model m: warm-up of bucket b4: output "y" has a non-finite value (-Inf) at element 3`},
	} {
		m := testModel()
		grid, err := bucketing.NewGrid([]int{1, 4}, nil)
		require.NoError(t, err)
		// Element 3 is past the b1 bucket's two: b1 warms up, b4 fails.
		p := &poisoned{doubler: newDoubler(m.Config, grid), at: 3, value: tc.value}
		r, err := New(Options{Model: m, Program: p, Engine: "fake", Grid: grid})
		require.NoError(t, err)
		_, err = r.Warmup(context.Background())
		assert.EqualError(t, err, tc.want)
		assert.Len(t, p.seen, 4, "both buckets ran twice")
	}
}

func TestNonFinite(t *testing.T) {
	le16 := func(v ...uint16) []byte {
		var b []byte
		for _, x := range v {
			b = binary.LittleEndian.AppendUint16(b, x)
		}
		return b
	}
	le64 := func(v ...float64) []byte {
		var b []byte
		for _, x := range v {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
		}
		return b
	}
	for _, tc := range []struct {
		name string
		dt   models.Datatype
		b    []byte
		at   int
		what string // "" when every value is finite
	}{
		{"fp32 finite", models.FP32, encode(0, -1, math.MaxFloat32, math.SmallestNonzeroFloat32), 0, ""},
		{"fp32 nan", models.FP32, encode(1, 2, float32(math.NaN())), 2, "NaN"},
		{"fp32 +inf", models.FP32, encode(float32(math.Inf(1)), 0), 0, "+Inf"},
		{"fp16 finite (max 65504, -2)", models.FP16, le16(0x7bff, 0xc000), 0, ""},
		{"fp16 -inf", models.FP16, le16(0, 0xfc00), 1, "-Inf"},
		{"fp16 nan", models.FP16, le16(0x7e00), 0, "NaN"},
		{"bf16 finite (1.0)", models.BF16, le16(0x3f80), 0, ""},
		{"bf16 +inf", models.BF16, le16(0x3f80, 0x3f80, 0x7f80), 2, "+Inf"},
		{"bf16 nan", models.BF16, le16(0x7fc0), 0, "NaN"},
		{"fp64 finite", models.FP64, le64(1e300), 0, ""},
		{"fp64 nan", models.FP64, le64(0, math.NaN()), 1, "NaN"},
		{"int32 has no NaN", models.INT32, encode(float32(math.NaN())), 0, ""},
	} {
		at, what, ok := nonFinite(tc.dt, tc.b)
		assert.Equal(t, tc.what != "", ok, tc.name)
		assert.Equal(t, tc.what, what, tc.name)
		assert.Equal(t, tc.at, at, tc.name)
	}
}

// slow is a doubler whose steps take a while.
type slow struct{ *doubler }

func (s slow) Step(ctx context.Context, b int) (engine.Explain, error) {
	time.Sleep(2 * time.Millisecond)
	return s.doubler.Step(ctx, b)
}

// Every successful step counts under its batch size (the rows it ran,
// not its bucket), and adds its time to each request it ran rows of; a
// request run a part per step gets every part's.
func TestExecutionsAndComputePerRequest(t *testing.T) {
	m := testModel()
	grid, err := bucketing.NewGrid([]int{1, 2, 4}, nil)
	require.NoError(t, err)
	d := newDoubler(m.Config, grid)
	r, err := New(Options{Model: m, Program: slow{d}, Engine: "fake", Grid: grid})
	require.NoError(t, err)

	a, b := request(1, 0), request(2, 0)
	require.NoError(t, r.Run(context.Background(), []*Request{a, b})) // 3 rows in b4
	q := request(6, 0)
	var part *Request
	for _, rows := range [][2]int{{0, 4}, {4, 6}} {
		part = q.Part(rows[0], rows[1], part)
		require.NoError(t, r.Run(context.Background(), []*Request{part}))
	}
	d.err = errors.New("device lost")
	require.Error(t, r.Run(context.Background(), []*Request{request(1, 0)}))

	ex := r.Executions()
	require.Len(t, ex, 3, "sizes 2, 3 and 4; the failed step counts nowhere")
	for i, want := range []struct {
		size  int
		count int64
	}{{2, 1}, {3, 1}, {4, 1}} {
		assert.Equal(t, want.size, ex[i].BatchSize)
		assert.Equal(t, want.count, ex[i].Count)
		assert.GreaterOrEqual(t, ex[i].Infer, 2*time.Millisecond)
		assert.Positive(t, ex[i].Input)
		assert.Positive(t, ex[i].Output)
	}

	assert.Equal(t, a.Compute, b.Compute, "a step's time is each of its requests'")
	assert.Equal(t, 1, a.Compute.Steps)
	assert.Equal(t, ex[1].Infer, a.Compute.Infer)
	assert.Equal(t, 2, q.Compute.Steps, "both parts count for the whole request")
	assert.Equal(t, ex[0].Infer+ex[2].Infer, q.Compute.Infer)
	assert.Equal(t, ex[0].Input+ex[2].Input, q.Compute.Input)
	assert.Zero(t, part.Compute, "the part adds to its request, not itself")
}
