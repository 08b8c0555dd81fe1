package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/config"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/engine/rbln"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// servedModel is one model on its engine, as the server sees it: loaded at
// start, behind its batcher, ready once warmed up (eager) or at once (lazy),
// and not ready while its device is down unless it fails over to the CPU.
type servedModel struct {
	model    *models.Model
	engine   string
	program  engine.Program
	runner   *steps.Runner
	fallback *steps.Runner // the CPU engine's, with engine.failover: cpufallback
	fbProg   engine.Program
	batcher  *batching.Batcher
	sh       *shared
	logger   *slog.Logger
	warmed   atomic.Bool
}

// shared holds what every served model uses: metrics, defaults and the
// engines.
type shared struct {
	steps    *steps.Metrics
	batching *batching.Metrics
	defaults batching.Policy
	cfg      *config.Config
	reg      prometheus.Registerer
	logger   *slog.Logger

	mu   sync.Mutex
	rbln *rbln.Engine // started on first use
}

// engine returns the named engine, starting the rbln engine on first use.
func (sh *shared) engine(name string) (engine.Engine, error) {
	if name == "cpu" {
		return cpufallback.Engine{}, nil
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.rbln == nil {
		r := sh.cfg.RBLN
		e, err := rbln.New(rbln.Options{
			Python: r.Python, Devices: r.Devices, Env: r.Env, CompileCacheDir: r.CompileCacheDir,
			StallTimeout: r.StallTimeout, PingInterval: r.StallTimeout / 4,
			LogLevel: torchLogLevel(sh.cfg.Log.Level), Logger: sh.logger, Registerer: sh.reg,
		})
		if err != nil {
			return nil, err
		}
		sh.rbln = e
	}
	return sh.rbln, nil
}

func (sh *shared) close() {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.rbln != nil {
		sh.rbln.Close()
	}
}

func torchLogLevel(l slog.Level) string {
	switch {
	case l <= slog.LevelDebug:
		return "debug"
	case l <= slog.LevelInfo:
		return "info"
	case l <= slog.LevelWarn:
		return "warning"
	default:
		return "error"
	}
}

func newServedModel(m *models.Model, sh *shared) (*servedModel, error) {
	name := m.Config.Engine
	if name == "" {
		name = sh.cfg.Engine.Default
	}
	bopts, err := batchingOptions(m, sh)
	if err != nil {
		return nil, fmt.Errorf("model %s: %s: %w", m.Name, models.ConfigFile, err)
	}
	grid, err := bucketing.NewGrid(m.Config.Buckets.Batch, m.Config.Buckets.Seq)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", m.Name, err)
	}
	s := &servedModel{model: m, engine: name, sh: sh, logger: sh.logger.With("model", m.Name, "engine", name)}
	if s.program, s.runner, err = sh.load(m, name, grid); err != nil {
		return nil, err
	}
	var runner batching.Runner = s.runner
	if name == "rbln" && sh.cfg.Engine.Failover == "cpufallback" {
		if s.fbProg, s.fallback, err = sh.load(m, "cpu", grid); err != nil {
			s.Close()
			return nil, err
		}
		sh.steps.AddFailover(m.Name, name, "cpu")
		runner = &steps.Failover{Primary: s.runner, Fallback: s.fallback, PrimaryHealthy: s.program.Healthy,
			Model: m.Name, From: name, To: "cpu", Metrics: sh.steps, Logger: sh.logger}
	}
	if s.batcher, err = batching.New(runner, bopts); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// load makes a program and its runner for m on the named engine.
func (sh *shared) load(m *models.Model, name string, grid *bucketing.Grid) (engine.Program, *steps.Runner, error) {
	eng, err := sh.engine(name)
	if err != nil {
		return nil, nil, err
	}
	prog, err := eng.Load(context.Background(), m, grid.Shapes())
	if err != nil {
		return nil, nil, err
	}
	runner, err := steps.New(steps.Options{Model: m, Program: prog, Engine: eng.Name(), Grid: grid,
		Logger: sh.logger, Metrics: sh.steps, StrictWarmup: name == "cpu" || sh.cfg.RBLN.StrictWarmup})
	if err != nil {
		prog.Close()
		return nil, nil, err
	}
	return prog, runner, nil
}

// batchingOptions merges model.yaml's batching keys over the server's
// defaults and validates the result: models only parsed the keys.
func batchingOptions(m *models.Model, sh *shared) (batching.Options, error) {
	o := batching.Options{
		Model:   m.Name,
		Policy:  sh.defaults,
		Metrics: sh.batching,
		Logger:  sh.logger,
	}
	b := m.Config.Batching
	if b.MaxQueueDelay != nil {
		o.Policy.MaxQueueDelay = *b.MaxQueueDelay
	}
	if b.MaxQueueSize != nil {
		o.Policy.MaxQueueSize = *b.MaxQueueSize
	}
	if b.PriorityLevels != nil {
		o.Policy.PriorityLevels = *b.PriorityLevels
	}
	if b.DefaultPriorityLevel != nil {
		o.Policy.DefaultPriority = *b.DefaultPriorityLevel
	}
	if b.DefaultTimeout != nil {
		o.Policy.DefaultTimeout = *b.DefaultTimeout
	}
	return o, o.Policy.Validate()
}

// Warmup makes the model ready: with warmup: eager it first compiles and
// runs every bucket twice (on the fallback engine too); with lazy, buckets
// compile on first use.
func (s *servedModel) Warmup(ctx context.Context) error {
	start := time.Now()
	buckets := 0
	if s.model.Config.Warmup != "lazy" {
		for _, r := range []*steps.Runner{s.runner, s.fallback} {
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
	s.sh.steps.SetLoadDuration(s.model.Name, time.Since(start))
	s.warmed.Store(true)
	s.logger.Info("model ready", "warmup", s.model.Config.Warmup, "buckets_compiled", buckets,
		"failover", s.fallback != nil, "load_seconds", time.Since(start).Seconds())
	return nil
}

func (s *servedModel) Model() *models.Model { return s.model }

// Ready reports whether requests can be served now: warmed up, and the
// engine's device up (or a fallback to serve on).
func (s *servedModel) Ready() bool {
	return s.warmed.Load() && (s.program.Healthy() || s.fallback != nil)
}

func (s *servedModel) Infer(ctx context.Context, r *steps.Request, p batching.Params) error {
	return s.batcher.Submit(ctx, r, p)
}

func (s *servedModel) Explains() []steps.Record { return s.runner.Explains() }

func (s *servedModel) Stats() []steps.BucketStats { return s.runner.Stats() }

// Drain stops taking requests and runs what is queued, within ctx.
func (s *servedModel) Drain(ctx context.Context) error {
	s.warmed.Store(false)
	if s.batcher == nil {
		return nil
	}
	return s.batcher.Shutdown(ctx)
}

func (s *servedModel) Close() error {
	if s.fbProg != nil {
		s.fbProg.Close()
	}
	return s.program.Close()
}

// readyCollector exports stepserve_model_ready from every served model's
// readiness at scrape time, so the gauge can never disagree with
// /v2/health/ready (a worker dying flips both at once), and an unloaded
// model's series is gone with it.
type readyCollector struct {
	repo *repository
	desc *prometheus.Desc
}

func newReadyCollector(repo *repository) *readyCollector {
	return &readyCollector{repo: repo, desc: prometheus.NewDesc("stepserve_model_ready",
		"1 when the model takes requests (loaded, warmed up, its device up or failed over), 0 when it does not.",
		[]string{"model", "engine"}, nil)}
}

func (c *readyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *readyCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.repo.all() {
		v := 0.0
		if s.Ready() {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, s.model.Name, s.engine)
	}
}
