package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/config"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// servedModel is one model on its engine, as the server sees it: loaded at
// start, behind its batcher, ready once warmed up (eager) or at once (lazy).
type servedModel struct {
	model   *models.Model
	engine  string
	program engine.Program
	runner  *steps.Runner
	batcher *batching.Batcher
	metrics *steps.Metrics
	logger  *slog.Logger
	ready   atomic.Bool
}

// shared holds what every served model records into.
type shared struct {
	steps    *steps.Metrics
	batching *batching.Metrics
	defaults config.Batching
	logger   *slog.Logger
}

func newServedModel(m *models.Model, sh shared) (*servedModel, error) {
	eng, err := engineFor(m)
	if err != nil {
		return nil, err
	}
	grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, m.Config.Buckets.Seq)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", m.Name, err)
	}
	prog, err := eng.Load(context.Background(), m, grid.Shapes())
	if err != nil {
		return nil, err
	}
	runner, err := steps.New(steps.Options{Model: m, Program: prog, Engine: eng.Name(), Grid: grid, Logger: sh.logger, Metrics: sh.steps})
	if err != nil {
		prog.Close()
		return nil, err
	}
	bt, err := batching.New(runner, batchingOptions(m, sh))
	if err != nil {
		prog.Close()
		return nil, err
	}
	s := &servedModel{model: m, engine: eng.Name(), program: prog, runner: runner, batcher: bt,
		metrics: sh.steps, logger: sh.logger.With("model", m.Name, "engine", eng.Name())}
	sh.steps.SetReady(m.Name, eng.Name(), false)
	return s, nil
}

// batchingOptions merges model.yaml's batching keys over the server's
// defaults.
func batchingOptions(m *models.Model, sh shared) batching.Options {
	o := batching.Options{
		Model:          m.Name,
		MaxQueueDelay:  sh.defaults.MaxQueueDelay,
		MaxQueueSize:   sh.defaults.MaxQueueSize,
		PriorityLevels: sh.defaults.PriorityLevels,
		DefaultTimeout: sh.defaults.DefaultTimeout,
		Metrics:        sh.batching,
		Logger:         sh.logger,
	}
	b := m.Config.Batching
	if b.MaxQueueDelay != nil {
		o.MaxQueueDelay = *b.MaxQueueDelay
	}
	if b.MaxQueueSize != nil {
		o.MaxQueueSize = *b.MaxQueueSize
	}
	if b.PriorityLevels != nil {
		o.PriorityLevels = *b.PriorityLevels
	}
	if b.DefaultPriorityLevel != nil {
		o.DefaultPriority = *b.DefaultPriorityLevel
	}
	if b.DefaultTimeout != nil {
		o.DefaultTimeout = *b.DefaultTimeout
	}
	return o
}

// engineFor picks the model's engine. Only the CPU engine is built in so far.
func engineFor(m *models.Model) (engine.Engine, error) {
	switch m.Config.Engine {
	case "", "cpu":
		return cpufallback.Engine{}, nil
	default:
		return nil, fmt.Errorf("model %s: engine %q is not available in this build; set engine: cpu in %s/model.yaml",
			m.Name, m.Config.Engine, m.Dir)
	}
}

// Warmup makes the model ready: with warmup: eager it first compiles and
// runs every bucket twice; with lazy, buckets compile on first use.
func (s *servedModel) Warmup(ctx context.Context) error {
	start := time.Now()
	buckets := 0
	if s.model.Config.Warmup != "lazy" {
		compile, err := s.runner.Warmup(ctx)
		if err != nil {
			return err
		}
		buckets = len(compile)
	}
	s.metrics.SetLoadDuration(s.model.Name, time.Since(start))
	s.setReady(true)
	s.logger.Info("model ready", "warmup", s.model.Config.Warmup, "buckets_compiled", buckets,
		"load_seconds", time.Since(start).Seconds())
	return nil
}

func (s *servedModel) setReady(v bool) {
	s.ready.Store(v)
	s.metrics.SetReady(s.model.Name, s.engine, v)
}

func (s *servedModel) Model() *models.Model { return s.model }

func (s *servedModel) Ready() bool { return s.ready.Load() }

func (s *servedModel) Infer(ctx context.Context, r *steps.Request, p batching.Params) error {
	return s.batcher.Submit(ctx, r, p)
}

func (s *servedModel) Explains() []steps.Record { return s.runner.Explains() }

// Drain stops taking requests and runs what is queued, within ctx.
func (s *servedModel) Drain(ctx context.Context) error {
	s.setReady(false)
	return s.batcher.Shutdown(ctx)
}

func (s *servedModel) Close() error {
	return s.program.Close()
}

func (s *servedModel) Stats() []steps.BucketStats { return s.runner.Stats() }
