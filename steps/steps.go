// Package steps owns the step: it packs the rows of one or more requests
// into a bucket's staging buffer (padding zeroed), runs the engine's program
// for that bucket, unpacks each request's rows from the output staging, and
// checks the step's Explain report. It also owns warm-up: every bucket run
// twice, its outputs checked to be finite.
//
// A [Runner] runs one step at a time for its program, because the staging
// buffers and, on an NPU, the explain counters are shared. A model loaded
// several times has one Runner per replica ([Runner.Sibling]), each with
// its own staging and lock, that share the model's stats, explain history
// and metrics. It knows requests
// only as rows of packed bytes; it knows nothing of HTTP or JSON, nor of
// queues and batching policy (package batching decides which requests share
// a step), nor of how an engine computes.
package steps

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/models"
)

// Request is one inference request as the step sees it: Rows batch rows of
// every model input, packed, and room for as many rows of every output.
type Request struct {
	Rows int
	// Seq is the sequence length of every row, for sequence models (the
	// model's largest seq bucket at most); 0 otherwise.
	Seq int
	// Inputs holds one packed buffer per step input (models.Config's
	// StepInputs), in that order, each Rows*RowBytes(Seq) long.
	Inputs [][]byte
	// Outputs holds one buffer per model output, in the model's output
	// order, each Rows*RowBytes long. Run fills them.
	Outputs [][]byte
	// Elements is the number of tensor elements of the request's inputs, as
	// the client sent them; the batcher bounds a batch's total.
	Elements int
	// Queued is how long the request waited before its batch ran, when a
	// batcher queued it; the stats of the bucket its first row runs in
	// count it.
	Queued time.Duration
	// Compute is what the steps its rows ran in took, each whole (a
	// step's time is every request's in it, as Triton counts a batch's
	// compute for each of its requests). Run adds to it; a Part's steps
	// add to the request it is a part of.
	Compute Compute
	// Trace is the request's trace record when tracing sampled it (nil
	// otherwise): a step that runs its rows is traced, while the model's
	// trace_count lasts.
	Trace *trace.Request

	whole *Request // the request a Part is of; nil for a whole request
}

// Compute is the time of the steps a request ran in, as Triton's
// statistics divide it.
type Compute struct {
	Steps int
	// Input is packing the rows into the bucket's staging; Infer the
	// engine's step (its own copies to and from the device included);
	// Output unpacking the outputs from the staging.
	Input, Infer, Output time.Duration
}

// root is the request q is a part of, or q.
func (q *Request) root() *Request {
	if q.whole != nil {
		return q.whole
	}
	return q
}

// Part returns rows [from, to) of q as a request of their own that shares
// q's buffers: running it fills those rows of q's outputs. A batcher runs a
// request larger than a step this way, one part per step. Part reuses dst
// when it is not nil (for the next part of the same request); Elements is
// q's share for the rows, rounded up, and Queued is q's.
func (q *Request) Part(from, to int, dst *Request) *Request {
	if dst == nil {
		dst = &Request{Inputs: make([][]byte, len(q.Inputs)), Outputs: make([][]byte, len(q.Outputs))}
	}
	rows := to - from
	*dst = Request{Rows: rows, Seq: q.Seq, Inputs: dst.Inputs[:len(q.Inputs)], Outputs: dst.Outputs[:len(q.Outputs)],
		Elements: (q.Elements*rows + q.Rows - 1) / q.Rows, Queued: q.Queued, whole: q.root()}
	for i, b := range q.Inputs {
		n := len(b) / q.Rows
		dst.Inputs[i] = b[from*n : to*n : to*n]
	}
	for i, b := range q.Outputs {
		n := len(b) / q.Rows
		dst.Outputs[i] = b[from*n : to*n : to*n]
	}
	return dst
}

// Options configure a [Runner].
type Options struct {
	Model *models.Model
	// Program steps the model: a program, or one replica of one.
	Program engine.Stepper
	Engine  string // the engine's name, for logs and metrics
	// Device names the device the program steps on, for the per-device
	// step count; empty counts nothing there.
	Device string
	Grid   *bucketing.Grid
	Logger *slog.Logger // nil discards
	// Metrics records every step; nil records nothing.
	Metrics *Metrics
	// StrictWarmup refuses a warm-up whose second run of a bucket is not
	// clean; otherwise it is logged.
	StrictWarmup bool
	// ExplainHistory is how many non-clean reports to keep; 0 means 32.
	ExplainHistory int
	// Observe, when set, is called after every step with the step's
	// outcome; it must not block.
	Observe func(Observation)
}

// Observation is what a step did, for metrics and the explain endpoint.
type Observation struct {
	Bucket   bucketing.Shape
	Rows     int
	Explain  engine.Explain
	Verdict  Verdict
	Duration time.Duration
	// Padding is the fraction of the bucket's elements (rows x sequence
	// positions) that were padding.
	Padding float64
}

// Runner runs steps for one loaded model.
type Runner struct {
	opts    Options
	layouts []engine.Layout
	logger  *slog.Logger
	metrics *runnerMetrics
	explain *explainLog
	stats   *stats
	warned  []atomic.Bool // per bucket: its first non-clean step was logged

	mu sync.Mutex // one step at a time: the staging buffers are shared
}

// ErrShape is wrapped by errors about a request whose buffers do not match
// the model's signature; it is the caller's bug, not the client's, since the
// server validates requests first.
var ErrShape = errors.New("steps: request does not match the model signature")

// New returns a Runner for a loaded program.
func New(opts Options) (*Runner, error) {
	if opts.Model == nil || opts.Program == nil || opts.Grid == nil {
		return nil, errors.New("steps: Model, Program and Grid are required")
	}
	r := &Runner{opts: opts, logger: opts.Logger}
	if r.logger == nil {
		r.logger = slog.New(slog.DiscardHandler)
	}
	for _, s := range opts.Grid.Shapes() {
		r.layouts = append(r.layouts, engine.NewLayout(opts.Model.Config, s))
	}
	if opts.ExplainHistory == 0 {
		opts.ExplainHistory = 32
	}
	r.explain = &explainLog{size: opts.ExplainHistory}
	r.stats = &stats{buckets: make([]bucketStats, len(r.layouts)), execs: make([]execStats, opts.Grid.MaxBatch()+1),
		traffic: bucketing.NewTraffic(opts.Grid.MaxBatch(), opts.Grid.MaxSeq(), 0)}
	r.warned = make([]atomic.Bool, len(r.layouts))
	for _, l := range r.layouts {
		r.stats.labels = append(r.stats.labels, l.Bucket.Label())
	}
	r.metrics = opts.Metrics.forRunner(opts.Model.Name, opts.Engine, opts.Device, opts.Grid.Shapes())
	return r, nil
}

// Sibling returns a Runner for another replica of r's model, on device:
// its own program (staging buffers) and lock, so that its steps run beside
// r's, and r's stats, explain history and metrics, so that the model's
// figures count every replica's steps.
func (r *Runner) Sibling(p engine.Stepper, device string) *Runner {
	s := &Runner{opts: r.opts, layouts: r.layouts, logger: r.logger, explain: r.explain, stats: r.stats, warned: r.warned}
	s.opts.Program, s.opts.Device = p, device
	s.metrics = r.metrics.forDevice(r.opts.Metrics, r.opts.Model.Name, r.opts.Engine, device)
	return s
}

// Buckets is how many buckets the model has.
func (r *Runner) Buckets() int { return len(r.layouts) }

// Device is the device the runner's program steps on, as Options said.
func (r *Runner) Device() string { return r.opts.Device }

// Healthy reports whether the runner's program can step now.
func (r *Runner) Healthy() bool { return r.opts.Program.Healthy() }

// MaxBatch is the most rows one step holds.
func (r *Runner) MaxBatch() int { return r.opts.Grid.MaxBatch() }

// cursor walks the rows of a list of requests in order.
type cursor struct {
	req, row int
}

// Run runs reqs through as many steps as their rows need: one when they fit
// the largest bucket, more when they do not (a request may then span steps,
// and holds the runner for all of them: package batching hands it one
// step's rows at a time, and a large request a [Request.Part] per step).
// On error no output is complete and every request in reqs has failed.
func (r *Runner) Run(ctx context.Context, reqs []*Request) error {
	total := 0
	for _, q := range reqs {
		if err := r.checkRequest(q); err != nil {
			return err
		}
		total += q.Rows
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	at := cursor{}
	for total > 0 {
		rows := r.opts.Grid.Next(total)
		next, err := r.step(ctx, reqs, at, rows)
		if err != nil {
			return err
		}
		at = next
		total -= rows
	}
	return nil
}

func (r *Runner) checkRequest(q *Request) error {
	cfg := r.opts.Model.Config
	inputs := cfg.StepInputs()
	if q.Rows <= 0 || len(q.Inputs) != len(inputs) || len(q.Outputs) != len(cfg.Outputs) {
		return fmt.Errorf("%w: %d rows, %d inputs, %d outputs; want rows > 0, %d inputs, %d outputs",
			ErrShape, q.Rows, len(q.Inputs), len(q.Outputs), len(inputs), len(cfg.Outputs))
	}
	if maxSeq := r.opts.Grid.MaxSeq(); (maxSeq == 0) != (q.Seq == 0) || q.Seq < 0 || q.Seq > maxSeq {
		return fmt.Errorf("%w: sequence length %d; want 1..%d (0 for models without a sequence)", ErrShape, q.Seq, maxSeq)
	}
	for i, s := range inputs {
		if want := q.Rows * s.RowBytes(q.Seq); len(q.Inputs[i]) != want {
			return fmt.Errorf("%w: input %q holds %d bytes, want %d", ErrShape, s.Name, len(q.Inputs[i]), want)
		}
	}
	for i, s := range cfg.Outputs {
		if want := q.Rows * s.RowBytes(q.Seq); len(q.Outputs[i]) != want {
			return fmt.Errorf("%w: output %q has room for %d bytes, want %d", ErrShape, s.Name, len(q.Outputs[i]), want)
		}
	}
	return nil
}

// step packs rows rows starting at from into the smallest bucket that holds
// them (and, for sequence models, their longest sequence), runs it, and
// unpacks. It returns the cursor after the rows it ran.
func (r *Runner) step(ctx context.Context, reqs []*Request, from cursor, rows int) (cursor, error) {
	seq, used := 0, 0
	var traced *trace.Request
	end := walk(reqs, from, rows, func(q *Request, _, count int) {
		seq = max(seq, q.Seq)
		used += count * max(q.Seq, 1)
		if t := q.root().Trace; t != nil {
			traced = t
		}
	})
	bucket, ok := r.opts.Grid.Choose(rows, seq)
	if !ok {
		return end, fmt.Errorf("%w: no bucket holds %d rows of length %d", ErrShape, rows, seq)
	}
	layout := &r.layouts[bucket]
	in, out := r.opts.Program.Staging(bucket)
	packStart := time.Now()

	for t, tl := range layout.Inputs {
		dst := in[tl.Offset : tl.Offset+tl.Bytes]
		n := 0
		walk(reqs, from, rows, func(q *Request, row, count int) {
			src := q.Inputs[t]
			if srcRow := len(src) / q.Rows; srcRow == tl.RowBytes {
				n += copy(dst[n:], src[row*srcRow:(row+count)*srcRow])
			} else {
				// A shorter sequence: each row is padded to the bucket's
				// length with the input's pad value (zeros unless
				// model.yaml says otherwise: pad token 0, attention mask 0).
				for i := row; i < row+count; i++ {
					copy(dst[n:], src[i*srcRow:(i+1)*srcRow])
					pad(dst[n+srcRow:n+tl.RowBytes], tl.Pad)
					n += tl.RowBytes
				}
			}
			if t == 0 && row == 0 && q.Queued > 0 {
				r.stats.queued(bucket, q.Queued)
			}
		})
		clear(dst[n:]) // padding rows: never a previous step's data
	}

	st := traced.BeginStep() // nil unless a request of the step is traced
	start := time.Now()
	packed := start.Sub(packStart)
	x, err := r.runProgram(ctx, bucket, st)
	elapsed := time.Since(start)
	if err != nil {
		if st != nil {
			r.traceStep(st, reqs, from, rows, layout, packStart, start, start.Add(elapsed), nil, err)
		}
		return end, fmt.Errorf("steps: model %s bucket %s: %w", r.opts.Model.Name, layout.Bucket.Label(), err)
	}
	o := Observation{Bucket: layout.Bucket, Rows: rows, Explain: x, Verdict: Check(&x), Duration: elapsed}
	o.Explain = x
	o.Padding = bucketing.PaddingRatio(used, layout.Bucket)
	r.stats.traffic.Record(rows, seq, used, start)
	r.metrics.observe(bucket, &o)
	r.stats.observe(bucket, &o)
	if !o.Verdict.Clean && !o.Verdict.Unmeasured {
		r.explain.add(&o)
		// The metrics and /explain count every such step; the log says it
		// once per bucket at warning level, so that a bucket that is never
		// clean cannot flood it.
		level := slog.LevelDebug
		if r.warned[bucket].CompareAndSwap(false, true) {
			level = slog.LevelWarn
		}
		r.logger.Log(ctx, level, "step not clean", "model", r.opts.Model.Name, "bucket", layout.Bucket.Label(),
			"engine", r.opts.Engine, "device", r.opts.Device, "reasons", x.Reasons)
	}
	if r.opts.Observe != nil {
		r.opts.Observe(o)
	}

	unpackStart := time.Now()
	for t, tl := range layout.Outputs {
		src := out[tl.Offset : tl.Offset+tl.Bytes]
		n := 0
		walk(reqs, from, rows, func(q *Request, row, count int) {
			n += copy(q.Outputs[t][row*tl.RowBytes:(row+count)*tl.RowBytes], src[n:])
		})
	}
	c := Compute{Steps: 1, Input: packed, Infer: elapsed, Output: time.Since(unpackStart)}
	if st != nil {
		r.traceStep(st, reqs, from, rows, layout, packStart, start, start.Add(elapsed), &o, nil)
	}
	r.stats.executed(rows, c)
	walk(reqs, from, rows, func(q *Request, _, _ int) {
		w := q.root()
		w.Compute.Steps++
		w.Compute.Input += c.Input
		w.Compute.Infer += c.Infer
		w.Compute.Output += c.Output
	})
	return end, nil
}

// pad fills b with the element value repeated, or zeros when value is nil.
func pad(b, value []byte) {
	if value == nil {
		clear(b)
		return
	}
	for i := 0; i+len(value) <= len(b); i += len(value) {
		copy(b[i:], value)
	}
}

// walk visits rows rows of reqs from the cursor, one contiguous run of a
// request at a time, and returns the cursor after them.
func walk(reqs []*Request, at cursor, rows int, visit func(q *Request, row, count int)) cursor {
	for rows > 0 {
		q := reqs[at.req]
		count := min(rows, q.Rows-at.row)
		visit(q, at.row, count)
		rows -= count
		at.row += count
		if at.row == q.Rows {
			at = cursor{req: at.req + 1}
		}
	}
	return at
}

// Stats summarises every bucket's steps since load.
func (r *Runner) Stats() []BucketStats { return r.stats.snapshot() }

// Executions summarises the steps that succeeded since load by batch
// size (the rows a step ran, padding not counted), smallest first: only
// the sizes that ran. Sibling runners share them.
func (r *Runner) Executions() []Execution { return r.stats.executions() }

// Advise returns the bucket lists of at most maxBuckets programs that
// would have padded the model's recorded steps least (every replica's,
// decayed over time), beside what its current lists cost on them; see
// [bucketing.Advise].
//
// An answer is kept for adviceTTL per maxBuckets, and one advice is
// computed at a time in the process: it is open to any inference client,
// and a dashboard scrapes it.
func (r *Runner) Advise(maxBuckets int) (bucketing.Advice, error) {
	c := &r.stats.advice
	c.mu.Lock()
	e, ok := c.byK[maxBuckets]
	c.mu.Unlock()
	if ok && time.Since(e.at) < adviceTTL {
		return e.a, nil
	}
	adviceMu.Lock()
	a, err := bucketing.Advise(r.stats.traffic.Snapshot(), r.opts.Grid.Batch(), r.opts.Grid.Seq(), maxBuckets)
	adviceMu.Unlock()
	if err != nil {
		return a, err
	}
	c.mu.Lock()
	if c.byK == nil || len(c.byK) >= 8 {
		c.byK = map[int]cachedAdvice{}
	}
	c.byK[maxBuckets] = cachedAdvice{a: a, at: time.Now()}
	c.mu.Unlock()
	return a, nil
}

// adviceTTL is how long an advice is served again rather than computed.
const adviceTTL = 10 * time.Second

// adviceMu lets one advice be computed at a time, whatever the model.
var adviceMu sync.Mutex

// adviceCache is a model's recent advice, by max_buckets.
type adviceCache struct {
	mu  sync.Mutex
	byK map[int]cachedAdvice
}

type cachedAdvice struct {
	a  bucketing.Advice
	at time.Time
}

// Explains returns the last non-clean steps, newest first.
func (r *Runner) Explains() []Record { return r.explain.list() }

// Warmup compiles every bucket and runs it twice on zeroed staging, as the
// device needs (the first run on a new input buffer re-lays it out), and
// returns how long each bucket took to compile, its first run included
// (torch.compile builds a graph on its first call). These two runs are the
// only ones: a program's Compile runs nothing. It fails if a bucket's
// floating-point outputs after its second run hold a NaN or an infinity
// (zeros in must give finite values out: anything else is broken weights or
// a broken program), and, with StrictWarmup, if that run is not clean;
// without StrictWarmup a run that is not clean is logged.
func (r *Runner) Warmup(ctx context.Context) ([]time.Duration, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	compile := make([]time.Duration, len(r.layouts))
	if f, ok := r.opts.Program.(engine.Follower); ok && f.Follows() != nil {
		// Another lane of the same program: its graphs are warmed with
		// the first lane's, and running them again would be no warm-up.
		return compile, nil
	}
	for b, l := range r.layouts {
		start := time.Now()
		if err := r.opts.Program.Compile(ctx, b); err != nil {
			return nil, fmt.Errorf("steps: model %s: compile bucket %s: %w", r.opts.Model.Name, l.Bucket.Label(), err)
		}
		in, out := r.opts.Program.Staging(b)
		clear(in)
		var x engine.Explain
		for run := range 2 {
			var err error
			if x, err = r.opts.Program.Step(ctx, b); err != nil {
				return nil, fmt.Errorf("steps: model %s: warm-up of bucket %s: %w", r.opts.Model.Name, l.Bucket.Label(), err)
			}
			if run == 0 {
				compile[b] = time.Since(start)
			}
		}
		if r.metrics != nil {
			r.metrics.buckets[b].compile.Set(compile[b].Seconds())
		}
		for _, tl := range l.Outputs {
			if i, what, ok := nonFinite(tl.Datatype, out[tl.Offset:tl.Offset+tl.Bytes]); ok {
				return nil, fmt.Errorf("steps: model %s: warm-up of bucket %s: output %q has a non-finite value (%s) at element %d",
					r.opts.Model.Name, l.Bucket.Label(), tl.Name, what, i)
			}
		}
		if v := Check(&x); !v.Clean && !v.Unmeasured {
			err := fmt.Errorf("steps: model %s: warm-up of bucket %s is not clean on its second run: %v",
				r.opts.Model.Name, l.Bucket.Label(), x.Reasons)
			if r.opts.StrictWarmup {
				return nil, err
			}
			r.logger.Warn("warm-up not clean", "err", err)
		}
	}
	return compile, nil
}

// runProgram runs the program's step for bucket, profiled when st asks for
// it and the program can.
func (r *Runner) runProgram(ctx context.Context, bucket int, st *trace.Step) (engine.Explain, error) {
	if st != nil && st.Profile != nil {
		if p, ok := r.opts.Program.(engine.Profiler); ok {
			return p.StepProfile(ctx, bucket, st.Profile)
		}
	}
	return r.opts.Program.Step(ctx, bucket)
}

// traceStep fills in a traced step (o is nil when it failed with err),
// attaches the traced requests whose rows it ran, and adds it to its trace.
func (r *Runner) traceStep(st *trace.Step, reqs []*Request, from cursor, rows int, layout *engine.Layout,
	packStart, inferStart, inferEnd time.Time, o *Observation, err error) {
	st.Engine, st.Device, st.Bucket, st.Rows = r.opts.Engine, r.opts.Device, layout.Bucket.Label(), rows
	st.Start, st.InferStart, st.InferEnd, st.End = packStart, inferStart, inferEnd, time.Now()
	if st.Device == "" {
		st.Device = "0"
	}
	if o != nil {
		st.Padding = o.Padding
		switch {
		case o.Verdict.Unmeasured:
			st.Verdict = "unmeasured"
		case o.Verdict.Clean:
			st.Verdict = "clean"
		default:
			st.Verdict = "overhead"
		}
		if o.Explain.DeviceNS.Known() {
			st.DeviceNS = int64(o.Explain.DeviceNS)
		}
	} else {
		st.Verdict, st.Err = "failed", err.Error()
	}
	walk(reqs, from, rows, func(q *Request, _, _ int) {
		st.Requests++
		q.root().Trace.Attach(st)
	})
	st.Finish()
}
