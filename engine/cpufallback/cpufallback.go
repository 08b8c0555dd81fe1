// Package cpufallback is the CPU engine: it runs the same models as the
// NPU engine on the host CPU, so that a laptop, CI and a node without an NPU
// serve the same API.
//
// It follows the device's step structure on purpose. Weights stay resident
// from load, packed for the kernels in use; each bucket has its own staging
// buffers and a plan built once (its "device" input buffer, the
// activations of every layer); a step copies the input staging into the
// plan once, runs the layers, and copies the result out once, with no heap
// allocation.
//
// # Kernels
//
// The matrix products and the element-wise passes (bias and activation,
// softmax, layer norm, one attention head in one call) are C, through cgo
// (gemm_native.c, kernels_avx2.c, crew_native.c), in two sets chosen from
// the CPU at start by cpuid: avx512 (with bfloat16 products where the CPU
// has AVX512_BF16, for device_dtype bfloat16) and avx2. The portable set,
// "go", is Go over the BLAS the build has: gonum, or OpenBLAS with the
// openblas build tag. Builds without cgo, or with the purego tag, have only
// "go". STEPSERVE_CPU_KERNELS names a set ([SetKernels]); [Kernels] and
// [BLAS] say which runs.
//
// # Threads: which scheme runs when
//
// engine.cpu_threads bounds the threads one step uses ([SetThreads]).
//
//   - A step of several sequences splits them into groups, at most one per
//     thread, each group run by one goroutine from its first layer to its
//     last (encoder.go, split).
//   - A group left with spare threads (fewer groups than threads) splits
//     its own work: with the native kernels and at least about 33 million
//     multiply-adds (minCrewWork), it holds a crew of POSIX threads that
//     spin between the layer's phases (crew.go, crew_native.c); otherwise
//     each product of at least half a million multiply-adds
//     (minParallelWork) splits its panels on the team of helper goroutines
//     (team.go).
//   - Smaller work runs on the calling goroutine.
//
// Crews and groups count against the machine's CPUs together, so that
// replicas and models stepping side by side do not spin more threads than
// there are CPUs.
package cpufallback

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/models"
)

// Engine is the CPU engine. The zero value is ready to use.
type Engine struct{}

// Name implements [engine.Engine].
func (Engine) Name() string { return "cpu" }

// Device is the CPU engine's one device, the name model.yaml's instances
// may give it.
const Device = "cpu"

// DeviceNames implements [engine.Placer]: the engine has one device, cpu.
func (Engine) DeviceNames() []string { return []string{Device} }

// Load implements [engine.Engine]. It checks that the model's architecture
// is one this engine runs and allocates every bucket's staging buffers;
// plans are built by Compile, or by the first Step that needs one.
//
// model.yaml's instances may name the engine's one device, cpu (or all);
// per_device N loads N replicas that share the model's resident weights,
// each with its own staging buffers and plans, so that N steps run side by
// side on the host's cores (each on up to engine.cpu_threads of them).
func (Engine) Load(ctx context.Context, m *models.Model, buckets []bucketing.Shape) (engine.Program, error) {
	if kernelsErr != nil {
		return nil, kernelsErr
	}
	if err := checkDtype(m.Name, m.Config); err != nil {
		return nil, err
	}
	if m.MLP == nil && m.Encoder == nil {
		if m.Config.Architecture == "torch" {
			return nil, fmt.Errorf("cpufallback: model %s: the CPU engine cannot run architecture torch (a PyTorch module); set engine: %s in its model.yaml",
				m.Name, strings.Join(models.TorchEngines, " or "))
		}
		return nil, fmt.Errorf("cpufallback: model %s: architecture %q is not supported by the CPU engine", m.Name, m.Config.Architecture)
	}
	placed, err := engine.Placement("cpu", m.Config.Instances, []string{Device}, Device)
	if err != nil {
		return nil, fmt.Errorf("cpufallback: model %s: %w", m.Name, err)
	}
	weights := newResidentWeights(m)
	ps := make([]*program, len(placed))
	for r := range ps {
		p := &program{model: m, weights: weights, buckets: make([]bucketState, len(buckets))}
		for i, s := range buckets {
			l := engine.NewLayout(m.Config, s)
			p.buckets[i] = bucketState{
				shape:  s,
				layout: l,
				in:     alignedBytes(l.InBytes),
				out:    alignedBytes(l.OutBytes),
			}
		}
		ps[r] = p
	}
	return engine.Replicate(ps), nil
}

type program struct {
	model   *models.Model
	weights residentWeights
	mu      sync.Mutex // serializes plan builds
	buckets []bucketState
	closed  bool
}

type bucketState struct {
	shape   bucketing.Shape
	layout  engine.Layout
	in, out []byte
	plan    plan // nil until compiled; written under mu, read by the stepping goroutine
}

// plan is one bucket's compiled program. step copies the input staging in
// once, computes, and copies the outputs to the output staging once; it
// must not allocate.
type plan interface {
	step(in, out []byte) error
	// record has the next steps record their spans into rec; nil stops.
	record(rec *trace.Recorder)
}

func (p *program) bucket(i int) (*bucketState, error) {
	if i < 0 || i >= len(p.buckets) {
		return nil, fmt.Errorf("%w: %d (model %s has %d)", engine.ErrBucket, i, p.model.Name, len(p.buckets))
	}
	return &p.buckets[i], nil
}

// Compile implements [engine.Program].
func (p *program) Compile(ctx context.Context, bucket int) error {
	_, _, err := p.planFor(bucket)
	return err
}

// planFor returns bucket's plan, building it if needed; built says whether
// this call built it.
func (p *program) planFor(bucket int) (pl plan, built bool, err error) {
	b, err := p.bucket(bucket)
	if err != nil {
		return nil, false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, false, fmt.Errorf("cpufallback: model %s: program is closed", p.model.Name)
	}
	if b.plan == nil {
		if p.model.Encoder != nil {
			b.plan = newEncoderPlan(p.model.Encoder, p.weights, b.layout)
		} else {
			b.plan = newMLPPlan(p.model.MLP, p.weights, b.shape.Batch)
		}
		built = true
	}
	return b.plan, built, nil
}

// Step implements [engine.Program]. On a compiled bucket it does not
// allocate.
func (p *program) Step(ctx context.Context, bucket int) (engine.Explain, error) {
	return p.step(ctx, bucket, nil)
}

// StepProfile implements [engine.Profiler]: the step, with its plan's
// spans (each layer's products and element-wise kernels) recorded.
func (p *program) StepProfile(ctx context.Context, bucket int, prof *trace.Profile) (engine.Explain, error) {
	return p.step(ctx, bucket, &prof.Recorder)
}

// step runs bucket's plan, recording its spans into rec when it is not
// nil.
func (p *program) step(ctx context.Context, bucket int, rec *trace.Recorder) (engine.Explain, error) {
	start := time.Now()
	if err := ctx.Err(); err != nil {
		return engine.Explain{}, err
	}
	pl, built, err := p.planFor(bucket)
	if err != nil {
		return engine.Explain{}, err
	}
	b := &p.buckets[bucket]
	if rec != nil {
		pl.record(rec)
	}
	compute := time.Now()
	err = pl.step(b.in, b.out)
	computed := time.Since(compute)
	if rec != nil {
		pl.record(nil)
	}
	if err != nil {
		return engine.Explain{}, fmt.Errorf("model %s bucket %s: %w", p.model.Name, b.shape.Label(), err)
	}

	x := engine.Explain{
		Measured:        true,
		Clean:           true,
		CPUFallbacks:    0,
		HostBounces:     0,
		HostBounceBytes: 0,
		H2D:             1,
		D2H:             1,
		WallNS:          engine.Count(time.Since(start)),
		// Its copies are part of the step's wall time, not timed apart;
		// it has no device to copy within.
		H2DNS:   engine.Unknown,
		D2HNS:   engine.Unknown,
		V2V:     0,
		V2VSlow: 0,
		// The CPU is the device: its compute is the plan's step, the
		// rest (the plan lookup, the context check) the host's.
		DeviceNS: engine.Count(computed),
		// No compiled program to hold host operators: not applicable.
		HostOps: engine.Unknown,
	}
	if built {
		x.Recompiles = 1
		x.Clean = false
		x.Reasons = []string{fmt.Sprintf("recompile: bucket %s had no plan built at load", b.shape.Label())}
	}
	return x, nil
}

// Device implements [engine.Replica]: every replica is on the host's CPU.
func (p *program) Device() string { return Device }

// Healthy implements [engine.Program]: the CPU is always there.
func (p *program) Healthy() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.closed
}

// Staging implements [engine.Program].
func (p *program) Staging(bucket int) (in, out []byte) {
	b := &p.buckets[bucket]
	return b.in, b.out
}

// Close implements [engine.Program]. Staging buffers stay valid for a caller
// still holding them, but no step runs after Close.
func (p *program) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for i := range p.buckets {
		p.buckets[i].plan = nil
	}
	return nil
}

// alignedBytes allocates n bytes backed by uint64s, so that the buffer can be
// read as float32 or int64 in place.
func alignedBytes(n int) []byte {
	if n == 0 {
		return nil
	}
	words := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), n)
}

// floats views a packed FP32 region as float32s (host byte order, which is
// the little-endian order the wire protocol and safetensors use on every
// platform we build for).
func floats(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// Programs implements [engine.ProgramReporter]: a bucket's plan is Go
// kernels chosen for its shape, not a captured graph: no compiler, no
// graph, nothing to break or recompile.
func (p *program) Programs(context.Context) []engine.ProgramReport {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]engine.ProgramReport, len(p.buckets))
	for i, b := range p.buckets {
		out[i] = engine.ProgramReport{Bucket: b.shape.Label(), Kind: "step", Compiler: "none", Device: Device,
			Built: b.plan != nil, Graphs: 0, GraphBreaks: engine.Unknown, Recompiles: engine.Unknown, HostOps: engine.Unknown,
			Note: "the CPU engine runs Go kernels planned for the bucket's shape; no graph is captured or compiled"}
	}
	return out
}
