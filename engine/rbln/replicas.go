// Replicas: where a model's copies go (model.yaml's instances), one
// program per replica, each on its worker's device with staging of its
// own.

package rbln

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/models"
)

// Device implements [engine.Replica]: the device of the program's worker.
// Programs of one model on one worker are lanes of that device: the worker
// runs their steps one at a time, and while one steps the next is packed
// into another's staging.
func (p *program) Device() string { return p.w.device }

// DeviceNames implements [engine.Placer]: the workers' devices, which
// model.yaml's instances may name.
func (e *Engine) DeviceNames() []string { return append([]string(nil), e.opts.Devices...) }

// place chooses the workers of a model's replicas, as its instances say:
// the listed devices (every worker's for all), per_device programs each;
// a model that lists none goes to the next worker in turn. Call it with
// e.mu held and the workers started.
func (e *Engine) place(m *models.Model) ([]*worker, error) {
	next := e.workers[e.next%len(e.workers)]
	placed, err := engine.Placement(e.Name(), m.Config.Instances, e.opts.Devices, next.device)
	if err != nil {
		return nil, fmt.Errorf("rbln: model %s: %w", m.Name, err)
	}
	if len(m.Config.Instances.Devices) == 0 && !m.Config.Instances.All {
		e.next++
	}
	out := make([]*worker, len(placed))
	for i, d := range placed {
		for _, w := range e.workers {
			if w.device == d {
				out[i] = w
			}
		}
	}
	return out, nil
}

// loadReplicas loads one program per replica, on all their workers at once
// (each worker loads its own in turn); if any fails, those loaded are
// closed and the first error is returned.
func loadReplicas(ctx context.Context, workers []*worker, m *models.Model, buckets []bucketing.Shape) (engine.Program, error) {
	if len(workers) == 1 {
		return newProgram(ctx, workers[0], m, buckets)
	}
	ps := make([]*program, len(workers))
	errs := make([]error, len(workers))
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Go(func() {
			ps[i], errs[i] = newProgram(ctx, w, m, buckets)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("replica %d of %d (device %s): %w", i+1, len(workers), w.device, errs[i])
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, p := range ps {
			if p != nil {
				p.Close()
			}
		}
		return nil, err
	}
	return engine.Replicate(ps), nil
}

// lane is one staging set of a program, stepped as a replica of its own on
// the program's device: its buffers in the host layout, which its caller
// fills and reads, and where its device staging lies. Lanes share the
// program's graphs (and its worker, which steps them one at a time), so
// only the first is warmed up.
type lane struct {
	p               *program
	n               int
	hostIn, hostOut [][]byte
	in, out         []region
}

// Replicas implements [engine.Replicated]: the program's lanes.
func (p *program) Replicas() []engine.Replica {
	out := make([]engine.Replica, len(p.lanes))
	for i, l := range p.lanes {
		out[i] = l
	}
	return out
}

// Compile implements [engine.Replica]: the program's graph, built once for
// every lane.
func (l *lane) Compile(ctx context.Context, bucket int) error {
	if l.n > 0 {
		if err := l.p.check(bucket); err != nil {
			return err
		}
		l.p.mu.Lock()
		done := l.p.compiled[bucket]
		l.p.mu.Unlock()
		if done {
			return nil
		}
	}
	return l.p.Compile(ctx, bucket)
}

// Step implements [engine.Replica]: the lane's inputs converted into its
// device staging, the step on them, its outputs converted back.
func (l *lane) Step(ctx context.Context, bucket int) (engine.Explain, error) {
	return l.step(ctx, bucket, nil)
}

// StepProfile implements [engine.Profiler]: the step as Step runs it, but
// as a message (never over the doorbell) that asks the worker to run it
// inside torch.profiler; its events come back into prof.
func (l *lane) StepProfile(ctx context.Context, bucket int, prof *trace.Profile) (engine.Explain, error) {
	return l.step(ctx, bucket, prof)
}

// step is Step, or StepProfile when prof is not nil.
func (l *lane) step(ctx context.Context, bucket int, prof *trace.Profile) (engine.Explain, error) {
	p := l.p
	if err := p.check(bucket); err != nil {
		return engine.Explain{}, err
	}
	if !p.healthy.Load() {
		return engine.Explain{}, fmt.Errorf("rbln: model %s: %w", p.model.Name, errWorkerDown)
	}
	l.pack(bucket)
	var x engine.Explain
	var err error
	if prof != nil {
		x, err = p.stepMessage(ctx, bucket, l.n, prof)
	} else {
		x, err = p.step(ctx, bucket, l.n)
	}
	if err != nil {
		return engine.Explain{}, fmt.Errorf("rbln: model %s: %w", p.model.Name, err)
	}
	l.unpack(bucket)
	return x, nil
}

// Staging implements [engine.Replica]: the lane's buffers in the host
// layout.
func (l *lane) Staging(bucket int) (in, out []byte) { return l.hostIn[bucket], l.hostOut[bucket] }

// Healthy implements [engine.Replica].
func (l *lane) Healthy() bool { return l.p.Healthy() }

// Device implements [engine.Replica].
func (l *lane) Device() string { return l.p.Device() }

// Follows implements [engine.Follower]: a lane after the first shares the
// first's graphs, so warming that one up warms it.
func (l *lane) Follows() engine.Replica {
	if l.n == 0 {
		return nil
	}
	return l.p.lanes[0]
}
