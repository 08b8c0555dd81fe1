package rbln

import (
	"context"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/models"
)

// programs numbers the programs loaded, for their keys.
var programs atomic.Uint64

// program is one model loaded on one worker.
type program struct {
	w     *worker
	model *models.Model
	// key names the program to the worker and in staging file names: the
	// model's name and a load number, because while a model reloads its
	// old and new programs live side by side on the same worker.
	key     string
	slot    uint32 // the key's number: the doorbell names the program by it
	shapes  []bucketing.Shape
	layouts []engine.Layout
	// lanes are the program's staging sets: each has every bucket's
	// buffers in the host layout and in the device staging. The worker
	// steps one lane at a time (they share the bucket's graph and bound
	// device buffer), and while one steps, the next batch is packed into
	// another's buffers.
	lanes   []*lane
	nlanes  int // how many allocate makes (Options.Lanes; at least 1)
	bounds  []boundary
	floats  dtype         // the compute dtype: floats in device staging
	staging *staging      // every lane's and bucket's device staging, shared with the worker
	mapped  []stagingView // how the worker mapped each bucket's staging (its load reply); guarded by mu

	healthy atomic.Bool
	// reloadFailures counts the worker's lives in a row that failed to
	// reload this program.
	reloadFailures atomic.Int32

	mu       sync.Mutex // guards compiled, ran, closed and mapped
	compiled []bool     // buckets compiled, recompiled after a restart
	// ran marks the buckets stepped in the worker's current life: a
	// bucket's first step builds its graph (torch.compile is lazy) and goes
	// as a message, announced; the others ring the doorbell.
	ran    []bool
	closed bool
	// hostOps is what the worker found inspecting each bucket's program
	// when its graph was built (the host operators inside it); nil until
	// then, or where the worker could not inspect it.
	hostOps []*hostOpsReply

	// lives counts the worker's restarts this program was reloaded after:
	// what the worker held (a decoder's KV cache) went with each.
	lives atomic.Uint64

	// bodyNS adds up the time the worker spent inside the step bodies of
	// doorbell steps: the rest of a step's round trip is host overhead.
	bodyNS atomic.Int64

	// compiler builds the buckets' steps (the load reply's: inductor, rbln
	// or none), compileNote says why none does; reports are the worker's
	// last reports of the compiled programs, by bucket (compiled.go),
	// guarded by mu; refreshing is set while a read of them is under way.
	compiler    string
	compileNote string
	reports     []engine.ProgramReport
	refreshing  atomic.Bool
	stale       atomic.Bool // the last read of reports failed
	// reportSeq numbers the reads of reports as they are asked for;
	// reportsFrom is the number of the read reports came from.
	reportSeq   atomic.Uint64
	reportsFrom uint64
}

func newProgram(ctx context.Context, w *worker, m *models.Model, shapes []bucketing.Shape) (*program, error) {
	inputs := m.Config.StepInputs()
	for _, s := range inputs[1:] {
		if s.Datatype != inputs[0].Datatype && m.Config.Architecture != "torch" { // torch stages a byte row
			return nil, fmt.Errorf("rbln: model %s: step inputs of mixed datatypes (%s, %s) cannot share one device buffer", m.Name, inputs[0].Datatype, s.Datatype)
		}
	}
	floats, err := computeDtype(&w.e.opts, m.Config)
	if err != nil {
		return nil, fmt.Errorf("rbln: model %s: %w", m.Name, err)
	}
	n := programs.Add(1)
	p := &program{w: w, model: m, key: fmt.Sprintf("%s.%d", m.Name, n), slot: uint32(n), shapes: shapes, floats: floats,
		nlanes:   w.e.opts.Lanes,
		compiled: make([]bool, len(shapes)), ran: make([]bool, len(shapes)), hostOps: make([]*hostOpsReply, len(shapes))}
	if err := p.allocate(); err != nil {
		return nil, err
	}
	if err := p.load(ctx); err != nil {
		if ctx.Err() != nil {
			// The caller gave up. The worker skips the load if it has
			// not started it, or goes on loading: unload what it will
			// have loaded, after it (it runs device requests in order).
			go p.unload()
		}
		p.release()
		return nil, err
	}
	w.mu.Lock()
	w.programs[p] = true
	w.mu.Unlock()
	p.healthy.Store(true)
	return p, nil
}

// allocate lays out every bucket's buffers, in the host layout and in the
// device staging (floats in p.floats), and allocates them.
func (p *program) allocate() error {
	var sizes []int
	hostBytes := 0
	for _, s := range p.shapes {
		cfg := p.model.Config
		if s.Mask {
			cfg = maskedStepConfig(p.model, s)
		}
		l := engine.NewLayout(cfg, s)
		b, err := newBoundary(l, p.floats, p.model.Config.Architecture == "torch")
		if err != nil {
			return fmt.Errorf("rbln: model %s: %w", p.model.Name, err)
		}
		p.layouts, p.bounds = append(p.layouts, l), append(p.bounds, b)
		hostBytes += l.InBytes + l.OutBytes
	}
	lanes := max(p.nlanes, 1)
	for range lanes {
		for _, b := range p.bounds {
			sizes = append(sizes, b.in.bytes(b.batch), b.out.bytes(b.batch))
		}
	}
	// Every lane's host buffers in one allocation, each capped at its
	// length.
	host := make([]byte, lanes*hostBytes)
	regions, total := layoutStaging(sizes)
	for n := range lanes {
		ln := &lane{p: p, n: n}
		for i, l := range p.layouts {
			ln.hostIn, host = append(ln.hostIn, host[:l.InBytes:l.InBytes]), host[l.InBytes:]
			ln.hostOut, host = append(ln.hostOut, host[:l.OutBytes:l.OutBytes]), host[l.OutBytes:]
			r := regions[2*(n*len(p.layouts)+i):]
			ln.in, ln.out = append(ln.in, r[0]), append(ln.out, r[1])
		}
		p.lanes = append(p.lanes, ln)
	}
	var err error
	p.staging, err = newStaging("stepserve-"+p.key, total)
	return err
}

// loadRequest describes the model to the worker, with every bucket's
// device staging: where it lies in the memory sent with the request, and
// the graph boundary it holds.
func (p *program) loadRequest() *loadRequest {
	cfg := p.model.Config
	buckets := make([]bucketSpec, len(p.shapes))
	lane0 := p.lanes[0]
	for i, s := range p.shapes {
		b := &p.bounds[i]
		buckets[i] = bucketSpec{
			Batch: s.Batch, Seq: s.Seq, Ctx: s.Ctx, Mask: s.Mask,
			InOffset: lane0.in[i].offset, InBytes: b.in.bytes(b.batch),
			InDtype: b.in.dt.String(), InCols: b.in.cols, InRow: b.in.row,
			OutOffset: lane0.out[i].offset, OutBytes: b.out.bytes(b.batch),
			OutDtype: b.out.dt.String(), OutCols: b.out.cols, OutRow: b.out.row,
		}
		for _, ln := range p.lanes[1:] {
			buckets[i].Lanes = append(buckets[i].Lanes, laneSpec{InOffset: ln.in[i].offset, OutOffset: ln.out[i].offset})
		}
	}
	weights := absPath(p.model.Weights.Path)
	req := &loadRequest{
		Model:           p.key,
		Name:            p.model.Name,
		Version:         p.model.Version,
		Slot:            p.slot,
		Weights:         weights,
		Architecture:    cfg.Architecture,
		DeviceDtype:     cfg.DeviceDtype,
		ComputeDtype:    p.floats.String(),
		CompileCacheDir: p.w.e.opts.CompileCacheDir,
		TorchCompile:    p.w.e.opts.TorchCompile,
		StrictWarmup:    p.w.e.opts.StrictWarmup,
		TPFailover:      cfg.TPFailover,
		Buckets:         buckets,
		staging:         p.staging.f,
	}
	if paths := p.model.Weights.Paths; len(paths) > 1 {
		for _, f := range paths {
			req.WeightFiles = append(req.WeightFiles, absPath(f))
		}
	}
	if m := cfg.MLP; m != nil {
		req.MLP = &mlpSpec{Sizes: m.Sizes, Activation: m.Activation, OutputActivation: m.OutputActivation}
	}
	if t := cfg.Torch; t != nil {
		req.Torch = &torchSpec{Module: absPath(p.model.ModulePath()), Name: path.Join(p.model.Name, t.Module), Factory: t.Factory, Config: t.Config,
			Inputs: tensorSpecs(cfg.Inputs), Outputs: tensorSpecs(cfg.Outputs)}
		if t.Weights != "" {
			req.Torch.Weights = weights
		}
		if req.Torch.Config == nil {
			req.Torch.Config = map[string]any{}
		}
	}
	if p.model.Decoder != nil {
		req.Decoder = decoderSpecOf(p.model)
		req.SkipTensors = p.model.Skipped
	}
	if e := cfg.Encoder; e != nil {
		req.Encoder = &encoderSpec{
			VocabSize: e.VocabSize, Hidden: e.Hidden, Layers: e.Layers, Heads: e.Heads,
			Intermediate: e.Intermediate, MaxPosition: e.MaxPosition, TypeVocabSize: e.TypeVocabSize,
			LayerNormEps: e.LayerNormEps, Pooling: e.Pooling, Normalize: e.Normalize,
			Family: e.Family, HiddenAct: e.HiddenAct, PadTokenID: e.PadID(), Head: e.Head, NumLabels: e.NumLabels,
		}
		req.SkipTensors = p.model.Skipped
	}
	return req
}

// absPath is p made absolute: the worker runs in another directory.
func absPath(p string) string {
	if p == "" {
		return ""
	}
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

// tensorSpecs are a signature's tensors as the worker reads them: the
// shape after the batch, -1 for the variable dimension (the bucket's seq).
func tensorSpecs(specs []models.TensorSpec) []tensorSpec {
	out := make([]tensorSpec, len(specs))
	for i, s := range specs {
		out[i] = tensorSpec{Name: s.Name, Datatype: string(s.Datatype), Shape: s.Shape[1:]}
	}
	return out
}

func (p *program) load(ctx context.Context) error {
	var info loadReply
	if err := p.w.call(ctx, p.loadRequest(), &info); err != nil {
		return loadError(p.model.Name, err)
	}
	// The worker refuses a model it cannot place on its engine's device;
	// this holds a worker that did not to the same rule.
	if want := p.w.e.opts.Device; !strings.HasPrefix(info.Device, want) {
		go p.unload()
		return fmt.Errorf("rbln: loading model %s: the worker placed it on %q, but engine %s computes on %s only", p.model.Name, info.Device, p.w.e.Name(), want)
	}
	if err := p.checkMapped(info.Staging); err != nil {
		go p.unload()
		return loadError(p.model.Name, err)
	}
	p.mu.Lock()
	p.mapped = info.Staging
	p.compiler = info.Compiler
	if p.compiler == "" { // a worker from before the compiler was named
		p.compiler = "none"
		if info.Compiled {
			p.compiler = "rbln"
		}
	}
	p.reports, p.compileNote = nil, info.CompileNote // a new life: nothing built yet
	p.mu.Unlock()
	p.w.logger.Info("model loaded on rbln worker", "model", p.model.Name, "worker_device", info.Device,
		"compiler", p.compiler, "compute_dtype", info.ComputeDtype, "notes", info.Notes)
	return nil
}

// reload puts the model back on a restarted worker, with every bucket that
// was compiled before warmed up again.
func (p *program) reload(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	compiled := append([]bool(nil), p.compiled...)
	clear(p.ran) // a new life: every graph is built anew
	p.mu.Unlock()
	p.lives.Add(1)
	if err := p.load(ctx); err != nil {
		return err
	}
	for b, ok := range compiled {
		if ok {
			if err := p.warm(ctx, b); err != nil {
				return err
			}
		}
	}
	p.healthy.Store(true)
	return nil
}

// Compile implements [engine.Program].
func (p *program) Compile(ctx context.Context, bucket int) error {
	if err := p.check(bucket); err != nil {
		return err
	}
	return p.compile(ctx, bucket)
}

func (p *program) compile(ctx context.Context, bucket int) error {
	var r compileReply
	if err := p.w.call(ctx, &compileRequest{Model: p.key, Bucket: bucket}, &r); err != nil {
		return fmt.Errorf("rbln: model %s: compiling bucket %s: %w", p.model.Name, p.shapes[bucket].Label(), err)
	}
	p.mu.Lock()
	p.compiled[bucket] = true
	p.ran[bucket] = false // the worker built a new graph: its first run builds it
	p.mu.Unlock()
	p.w.logger.Debug("bucket compiled on rbln worker", "model", p.model.Name, "bucket", p.shapes[bucket].Label(),
		"seconds", r.CompileSeconds)
	// Device memory is allocated lazily: it is worth reading after a
	// bucket's warm-up, not before.
	go p.w.pollMemory()
	return nil
}

// warm compiles a bucket and runs it twice on zeros, as
// [steps.Runner.Warmup] does at load, so that a restarted worker builds
// its graphs (torch.compile is lazy) before the model is healthy again
// rather than on a client's step. Never on what staging holds: that is
// the last request's input, which may be what took the worker down.
func (p *program) warm(ctx context.Context, bucket int) error {
	if err := p.compile(ctx, bucket); err != nil {
		return err
	}
	clear(p.staging.buffer(p.lanes[0].in[bucket]))
	for range 2 {
		if _, err := p.step(ctx, bucket, 0); err != nil {
			return fmt.Errorf("rbln: model %s: warming bucket %s up: %w", p.model.Name, p.shapes[bucket].Label(), err)
		}
	}
	return nil
}

// Step implements [engine.Program]: a step on the first lane.
func (p *program) Step(ctx context.Context, bucket int) (engine.Explain, error) {
	return p.lanes[0].Step(ctx, bucket)
}

// step runs one step on the device staging as it is (Step packs it first
// and unpacks after; a restarted worker's warm-up zeroes it first): over the doorbell once the bucket's graph has run in this life of
// the worker, else as a message (its first run builds the graph, which the
// worker announces).
func (p *program) step(ctx context.Context, bucket, lane int) (engine.Explain, error) {
	p.mu.Lock()
	ran, ops := p.ran[bucket], p.hostOps[bucket]
	p.mu.Unlock()
	if ran {
		x, body, err := p.w.step(ctx, p.slot, bucket, lane)
		if err != nil {
			return x, err
		}
		p.bodyNS.Add(body)
		x.DeviceNS = engine.Unknown // 0: the worker timed no body
		if body > 0 {
			x.DeviceNS = engine.Count(body)
		}
		stampHostOps(&x, ops)
		p.refreshLater(x)
		return x, nil
	}
	return p.stepMessage(ctx, bucket, lane, nil)
}

// stampHostOps gives x the host operators of its bucket's program (h,
// nil where not inspected): every step runs them, and explain() sees
// none of them.
func stampHostOps(x *engine.Explain, h *hostOpsReply) {
	x.HostOps, x.HostOpReasons = engine.Unknown, nil
	if h != nil && h.Count != nil {
		x.HostOps, x.HostOpReasons = engine.Count(*h.Count), h.Ops
	}
}

// stepMessage runs one step as a message rather than over the doorbell: a
// bucket's first in the worker's life (it builds the graph), or a profiled
// step, whose events come back in the reply into prof.
func (p *program) stepMessage(ctx context.Context, bucket, lane int, prof *trace.Profile) (engine.Explain, error) {
	r := stepReply{Explain: engine.Unmeasured()} // a result without a report measured nothing
	if err := p.w.call(ctx, &stepRequest{Model: p.key, Bucket: bucket, Lane: lane, Profile: prof != nil}, &r); err != nil {
		return engine.Explain{}, err
	}
	p.mu.Lock()
	built := !p.ran[bucket]
	p.compiled[bucket] = true // a lazy bucket is compiled by its first step
	p.ran[bucket] = true
	if r.HostOps != nil { // the graph was built by this step and inspected
		p.hostOps[bucket] = r.HostOps
		if r.HostOps.Count == nil {
			p.w.logger.Info("compiled program not inspected for host operators", "model", p.model.Name,
				"bucket", p.shapes[bucket].Label(), "why", r.HostOps.Reason)
		} else if *r.HostOps.Count > 0 {
			p.w.logger.Warn("compiled program runs operators on the host", "model", p.model.Name,
				"bucket", p.shapes[bucket].Label(), "host_ops", *r.HostOps.Count, "ops", r.HostOps.Ops)
		}
	}
	ops := p.hostOps[bucket]
	p.mu.Unlock()
	if built {
		// The step built the bucket's program: what the compiler made of
		// it is read now, at warm-up, not at the first /explain.
		p.refreshPrograms(ctx)
	} else {
		p.refreshLater(r.Explain)
	}
	x := r.Explain
	stampHostOps(&x, ops)
	if r.BodyNS > 0 {
		x.DeviceNS = engine.Count(r.BodyNS)
	}
	if prof != nil && r.Profile != nil {
		name := fmt.Sprintf("%s worker, device %s, activities %s", p.w.e.Name(), p.Device(), strings.Join(r.Profile.Activities, "+"))
		if err := prof.SetWorker(name, r.Profile.Events, r.Profile.Dropped, r.Profile.Activities, r.Profile.Anchor); err != nil {
			p.w.logger.Warn("profile of a step dropped", "model", p.model.Name, "err", err)
		}
	}
	return x, nil
}

func (p *program) check(bucket int) error {
	if bucket < 0 || bucket >= len(p.shapes) {
		return fmt.Errorf("%w: %d (model %s has %d)", engine.ErrBucket, bucket, p.model.Name, len(p.shapes))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("rbln: program is closed")
	}
	return nil
}

// Staging implements [engine.Program]: the buffers in the host layout,
// which each step converts to and from the device staging in shared
// memory.
func (p *program) Staging(bucket int) (in, out []byte) { return p.lanes[0].Staging(bucket) }

// Healthy implements [engine.Program].
func (p *program) Healthy() bool { return p.healthy.Load() }

// Close implements [engine.Program]: the worker is told to unload the model
// (it does so after its current request, which may be a compile, so Close
// does not wait) and the staging memory is unmapped here.
func (p *program) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.healthy.Store(false)
	p.w.mu.Lock()
	delete(p.w.programs, p)
	p.w.mu.Unlock()
	go p.unload()
	p.release()
	return nil
}

// unload asks the worker to drop the model; best effort, since the worker
// may be down. It may wait behind a compile: it has the compile deadline.
func (p *program) unload() {
	ctx, cancel := context.WithTimeout(context.Background(), p.w.e.opts.CompileTimeout)
	defer cancel()
	var reply struct {
		Notes []string `json:"notes"`
	}
	if err := p.w.call(ctx, &unloadRequest{Model: p.key}, &reply); err == nil && len(reply.Notes) > 0 {
		// What the worker could not release yet (another model's compiled
		// programs share dynamo's cache).
		p.w.logger.Info("rbln model unloaded", "model", p.key, "notes", reply.Notes)
	}
}

// loadError is a failed load's error: a model error as it is, anything
// else naming the engine and the model.
func loadError(model string, err error) error {
	if _, ok := errors.AsType[*engine.ModelError](err); ok {
		return err
	}
	return fmt.Errorf("rbln: loading model %s: %w", model, err)
}

// release unmaps the staging memory; the worker's mapping, if any, stays
// valid until it unloads the model.
func (p *program) release() { p.staging.close() }
