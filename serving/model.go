package serving

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// Model is one model being served: loaded on its engine, behind its
// batcher, ready once warmed up and while its device is up (or a failover
// engine serves it). Its methods are safe for concurrent use.
type Model struct {
	model  *models.Model
	engine string
	set    *Set
	logger *slog.Logger

	program  engine.Program
	runner   *steps.Runner
	fbProg   engine.Program // the failover engine's, when there is one
	fallback *steps.Runner
	batcher  *batching.Batcher
	loaded   time.Time
	resident int64 // the host memory estimated before it was loaded

	warmed atomic.Bool
	closed atomic.Bool
}

// newModel loads m onto its engine (and the failover engine), with a
// batcher in front; nothing is compiled yet.
func (s *Set) newModel(ctx context.Context, m *models.Model, grid *bucketing.Grid, batchOpts batching.Options) (*Model, error) {
	name := s.enginesFor(m.Config)[0]
	var err error
	sm := &Model{model: m, engine: name, set: s, loaded: time.Now(),
		logger: s.logger.With("model", m.Name, "engine", name)}
	if sm.program, sm.runner, err = s.load(ctx, m, name, grid); err != nil {
		return nil, err
	}
	var runner batching.Runner = sm.runner
	if fb := s.opts.Failover; fb != "" && fb != name {
		if sm.fbProg, sm.fallback, err = s.load(ctx, m, fb, grid); err != nil {
			sm.Close()
			return nil, err
		}
		runner = &failover{primary: sm.runner, fallback: sm.fallback, primaryHealthy: sm.program.Healthy,
			model: m.Name, from: name, to: fb, switched: s.metrics.addFailover(m.Name, name, fb).Inc, logger: s.logger}
	}
	if sm.batcher, err = batching.New(runner, batchOpts); err != nil {
		sm.Close()
		return nil, err
	}
	return sm, nil
}

// load makes a program and its runner for m on the named engine.
func (s *Set) load(ctx context.Context, m *models.Model, name string, grid *bucketing.Grid) (engine.Program, *steps.Runner, error) {
	eng, err := s.engines.get(name)
	if err != nil {
		return nil, nil, fmt.Errorf("model %s: %w", m.Name, err)
	}
	prog, err := eng.Load(ctx, m, grid.Shapes())
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return nil, nil, fmt.Errorf("model %s: load on engine %s: %w", m.Name, name, err)
	}
	runner, err := steps.New(steps.Options{Model: m, Program: prog, Engine: eng.Name(), Grid: grid,
		Logger: s.logger, Metrics: s.opts.StepMetrics, StrictWarmup: s.engines.strictWarmup(name)})
	if err != nil {
		prog.Close()
		return nil, nil, err
	}
	return prog, runner, nil
}

// Warmup makes the model ready: with warmup: eager (the default) it first
// compiles and runs every bucket twice, on the failover engine too; with
// lazy, buckets compile on first use. It honours ctx.
func (m *Model) Warmup(ctx context.Context) error {
	if m.closed.Load() {
		return fmt.Errorf("serving: model %s was unloaded before its warm-up", m.model.Name)
	}
	buckets := 0
	if m.model.Config.Warmup != "lazy" {
		for _, r := range []*steps.Runner{m.runner, m.fallback} {
			if r == nil {
				continue
			}
			compile, err := r.Warmup(ctx)
			if err != nil {
				return err
			}
			buckets = len(compile)
		}
	}
	took := time.Since(m.loaded)
	m.set.metrics.loaded(m.model.Name, took)
	m.warmed.Store(true)
	m.logger.Info("model ready", "warmup", m.model.Config.Warmup, "buckets_compiled", buckets,
		"failover", m.fallback != nil, "load_seconds", took.Seconds())
	return nil
}

// Model is the model's name, version, signature and weights.
func (m *Model) Model() *models.Model { return m.model }

// Engine is the name of the engine the model runs on.
func (m *Model) Engine() string { return m.engine }

// Ready reports whether requests can be served now: warmed up, not
// draining, and the engine's device up (or a failover engine to serve on).
func (m *Model) Ready() bool {
	return m.warmed.Load() && (m.program.Healthy() || m.fallback != nil)
}

// Infer queues r for the model's next batch and waits for its outputs.
// It returns the batcher's errors ([batching.ErrQueueFull], ...), an
// engine's, or ctx's.
func (m *Model) Infer(ctx context.Context, r *steps.Request, p batching.Params) error {
	return m.batcher.Submit(ctx, r, p)
}

// Explains lists the model's last non-clean steps, newest first.
func (m *Model) Explains() []steps.Record { return m.runner.Explains() }

// Stats summarises the model's steps per bucket since load.
func (m *Model) Stats() []steps.BucketStats { return m.runner.Stats() }

// drain stops taking requests and runs what is queued, within ctx.
func (m *Model) drain(ctx context.Context) error {
	m.warmed.Store(false)
	if m.batcher == nil {
		return nil
	}
	return m.batcher.Shutdown(ctx)
}

// closeWhenIdle closes the model once no step runs on it any more. A step
// that outlived the drain (a long compile, a hung device the supervisor
// has yet to restart) keeps the programs open until it ends: releasing
// staging under a running step would crash the server.
func (m *Model) closeWhenIdle(wait time.Duration) {
	if m.batcher == nil {
		m.Close()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	m.drain(ctx) // at once when drained already
	if m.batcher.WaitIdle(ctx) == nil {
		m.Close()
		return
	}
	m.logger.Warn("a step outlived the drain; the model's programs close when it ends")
	go func() {
		m.batcher.WaitIdle(context.Background())
		m.Close()
	}()
}

// Close releases the model's programs. It is idempotent.
func (m *Model) Close() error {
	if !m.closed.CompareAndSwap(false, true) {
		return nil
	}
	var errs []error
	if m.fbProg != nil {
		errs = append(errs, m.fbProg.Close())
	}
	if m.program != nil {
		errs = append(errs, m.program.Close())
	}
	return errors.Join(errs...)
}
