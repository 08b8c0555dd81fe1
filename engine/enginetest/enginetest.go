// Package enginetest is a fake [engine.Engine] for the tests of the
// packages above the engines (steps, serving, server): its programs run a
// Go function per step over real staging buffers, and a test can hold a
// load or a compile, take a device down, or make steps fail.
//
// Production code never imports it.
package enginetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/models"
)

// StepFunc computes one step: it reads the bucket's packed inputs from in
// and writes its packed outputs to out, both laid out as l says.
type StepFunc func(l engine.Layout, in, out []byte) error

// Engine is a fake engine. Set its fields before the first Load.
type Engine struct {
	// Label is the engine's name; "fake" when empty.
	Label string
	// Func runs every step; nil leaves the outputs as they are.
	Func StepFunc
	// Explain, when set, is every step's report; otherwise a step reports
	// a clean, measured step with one copy each way.
	Explain func() engine.Explain
	// LoadGate and CompileGate, when set, hold every Load or Compile until
	// they are closed or the caller's context ends.
	LoadGate, CompileGate chan struct{}
	// LoadErr, when set, fails every Load.
	LoadErr error
	// Devices are the engine's devices, which model.yaml's instances may
	// name; nil means one, "0". A model that names none goes to each in
	// turn.
	Devices []string
	// BeforeStep, when set, is called at the start of every step (warm-up
	// included), on the stepping goroutine: a test can hold a step there,
	// or see which replicas step at the same time.
	BeforeStep func(p *Program, bucket int)
	// Dtype, when set, is the dtype the engine says it computes floats
	// in (engine.DtypeEngine).
	Dtype string

	mu       sync.Mutex
	programs []*Program
	next     int // the device of the next model that names none
	loads    atomic.Int32
	compiles atomic.Int32 // Compile calls begun, gated or not
}

// ComputeDtype implements engine.DtypeEngine: e.Dtype.
func (e *Engine) ComputeDtype(*models.Config) string { return e.Dtype }

func (e *Engine) devices() []string {
	if len(e.Devices) == 0 {
		return []string{"0"}
	}
	return e.Devices
}

// Name implements [engine.Engine].
func (e *Engine) Name() string {
	if e.Label == "" {
		return "fake"
	}
	return e.Label
}

// Loads counts the Load calls, finished or not.
func (e *Engine) Loads() int { return int(e.loads.Load()) }

// Compiles counts the Compile calls begun on the engine's programs,
// including those a CompileGate holds.
func (e *Engine) Compiles() int { return int(e.compiles.Load()) }

// Programs returns the programs loaded so far, oldest first: one per
// replica.
func (e *Engine) Programs() []*Program {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*Program(nil), e.programs...)
}

// Last returns the newest program, or nil.
func (e *Engine) Last() *Program {
	ps := e.Programs()
	if len(ps) == 0 {
		return nil
	}
	return ps[len(ps)-1]
}

// DeviceNames implements [engine.Placer]: the devices model.yaml's instances
// may name.
func (e *Engine) DeviceNames() []string { return e.devices() }

// Load implements [engine.Engine]: one fake program per replica that
// model.yaml's instances place ([engine.Placement]), each with its own
// staging; more than one make a [engine.Replicated] program.
func (e *Engine) Load(ctx context.Context, m *models.Model, buckets []bucketing.Shape) (engine.Program, error) {
	e.loads.Add(1)
	if err := wait(ctx, e.LoadGate); err != nil {
		return nil, err
	}
	if e.LoadErr != nil {
		return nil, e.LoadErr
	}
	devices := e.devices()
	e.mu.Lock()
	next := devices[e.next%len(devices)]
	e.next++
	e.mu.Unlock()
	placed, err := engine.Placement(e.Name(), m.Config.Instances, devices, next)
	if err != nil {
		return nil, fmt.Errorf("enginetest: model %s: %w", m.Name, err)
	}
	var ps []*Program
	for _, d := range placed {
		p := &Program{e: e, Model: m, device: d}
		p.healthy.Store(true)
		for _, s := range buckets {
			l := engine.NewLayout(m.Config, s)
			p.layouts = append(p.layouts, l)
			p.in = append(p.in, make([]byte, l.InBytes))
			p.out = append(p.out, make([]byte, l.OutBytes))
		}
		p.compiled = make([]bool, len(buckets))
		ps = append(ps, p)
	}
	e.mu.Lock()
	e.programs = append(e.programs, ps...)
	e.mu.Unlock()
	return engine.Replicate(ps), nil
}

func wait(ctx context.Context, gate chan struct{}) error {
	if gate == nil {
		return ctx.Err()
	}
	select {
	case <-gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Program is a fake program.
type Program struct {
	Model *models.Model

	e        *Engine
	device   string
	layouts  []engine.Layout
	in, out  [][]byte
	healthy  atomic.Bool
	closed   atomic.Bool
	steps    atomic.Int64
	failed   atomic.Int64
	failWith atomic.Pointer[error]

	mu       sync.Mutex
	compiled []bool
}

// SetHealthy takes the program's device down (false) or brings it back.
// While it is down, steps fail with [engine.ErrUnavailable].
func (p *Program) SetHealthy(ok bool) { p.healthy.Store(ok) }

// Fail makes every step fail with err from now on; nil ends that.
func (p *Program) Fail(err error) {
	if err == nil {
		p.failWith.Store(nil)
		return
	}
	p.failWith.Store(&err)
}

// Steps counts the steps run, warm-up included.
func (p *Program) Steps() int { return int(p.steps.Load()) }

// Failed counts the steps refused because the device was down or Fail
// was set.
func (p *Program) Failed() int { return int(p.failed.Load()) }

// Closed reports whether Close was called.
func (p *Program) Closed() bool { return p.closed.Load() }

// Compile implements [engine.Program].
func (p *Program) Compile(ctx context.Context, bucket int) error {
	if bucket < 0 || bucket >= len(p.layouts) {
		return engine.ErrBucket
	}
	p.e.compiles.Add(1)
	if err := wait(ctx, p.e.CompileGate); err != nil {
		return err
	}
	p.mu.Lock()
	p.compiled[bucket] = true
	p.mu.Unlock()
	return nil
}

// Step implements [engine.Program].
func (p *Program) Step(ctx context.Context, bucket int) (engine.Explain, error) {
	if bucket < 0 || bucket >= len(p.layouts) {
		return engine.Explain{}, engine.ErrBucket
	}
	switch {
	case p.closed.Load():
		return engine.Explain{}, errors.New("enginetest: step on a closed program")
	case !p.healthy.Load():
		p.failed.Add(1)
		return engine.Explain{}, fmt.Errorf("enginetest: %w", engine.ErrUnavailable)
	}
	if err := p.failWith.Load(); err != nil {
		p.failed.Add(1)
		return engine.Explain{}, *err
	}
	if p.e.BeforeStep != nil {
		p.e.BeforeStep(p, bucket)
	}
	p.steps.Add(1)
	p.mu.Lock()
	built := !p.compiled[bucket]
	p.compiled[bucket] = true
	p.mu.Unlock()
	if p.e.Func != nil {
		if err := p.e.Func(p.layouts[bucket], p.in[bucket], p.out[bucket]); err != nil {
			return engine.Explain{}, err
		}
	}
	if p.e.Explain != nil {
		return p.e.Explain(), nil
	}
	x := engine.Explain{Measured: true, Clean: true, H2D: 1, D2H: 1}
	if built {
		x.Clean, x.Recompiles = false, 1
		x.Reasons = []string{"recompile: bucket " + p.layouts[bucket].Bucket.Label() + " was not compiled at load"}
	}
	return x, nil
}

// Staging implements [engine.Program].
func (p *Program) Staging(bucket int) (in, out []byte) { return p.in[bucket], p.out[bucket] }

// Device implements [engine.Replica]: the device the program was placed on.
func (p *Program) Device() string { return p.device }

// Healthy implements [engine.Program].
func (p *Program) Healthy() bool { return p.healthy.Load() && !p.closed.Load() }

// Close implements [engine.Program].
func (p *Program) Close() error {
	p.closed.Store(true)
	return nil
}
