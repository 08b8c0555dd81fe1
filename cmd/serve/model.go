package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// servedModel is one model on its engine, as the server sees it: loaded at
// start, ready once every bucket has been compiled and warmed up.
type servedModel struct {
	model   *models.Model
	program engine.Program
	runner  *steps.Runner
	logger  *slog.Logger
	ready   atomic.Bool
}

func newServedModel(m *models.Model, logger *slog.Logger) (*servedModel, error) {
	eng, err := engineFor(m)
	if err != nil {
		return nil, err
	}
	grid, err := bucketing.NewGrid(m.Config.Buckets.Batch)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", m.Name, err)
	}
	prog, err := eng.Load(context.Background(), m, grid.Shapes())
	if err != nil {
		return nil, err
	}
	runner, err := steps.New(steps.Options{Model: m, Program: prog, Engine: eng.Name(), Grid: grid, Logger: logger})
	if err != nil {
		prog.Close()
		return nil, err
	}
	return &servedModel{model: m, program: prog, runner: runner, logger: logger.With("model", m.Name, "engine", eng.Name())}, nil
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

// Warmup compiles and runs every bucket, then marks the model ready.
func (s *servedModel) Warmup(ctx context.Context) error {
	start := time.Now()
	compile, err := s.runner.Warmup(ctx)
	if err != nil {
		return err
	}
	s.ready.Store(true)
	s.logger.Info("model ready", "buckets", len(compile), "load_seconds", time.Since(start).Seconds())
	return nil
}

func (s *servedModel) Model() *models.Model { return s.model }

func (s *servedModel) Ready() bool { return s.ready.Load() }

func (s *servedModel) Infer(ctx context.Context, r *steps.Request) error {
	return s.runner.Run(ctx, []*steps.Request{r})
}

func (s *servedModel) Close() error {
	s.ready.Store(false)
	return s.program.Close()
}
