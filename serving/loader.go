package serving

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/models"
)

// loader makes a set's models and unmakes them: it reads a model from the
// repository, checks what it will take, loads it onto its engines behind a
// batcher or a generation loop, and retires one no longer served. The
// [Set] decides what is served; the loader owns the engines and the limit.
type loader struct {
	set     *Set     // whose models it makes: they answer to it
	opts    *Options // the set's
	logger  *slog.Logger
	engines *engines
	metrics *metrics
	limit   modelLimit
}

// read reads name from the repository and loads it onto its engines, not
// warmed up. What it will take is checked before its weights are read:
// model.yaml and the tensors' shapes, its batching keys, and its
// estimated memory against the limit.
func (l *loader) read(ctx context.Context, name string, override Override) (*Model, error) {
	began := time.Now()
	man, err := models.Open(l.opts.Repository, name)
	if err != nil {
		return nil, err
	}
	defer man.Close()
	if override != nil {
		if err := override(man.Config); err != nil {
			return nil, fmt.Errorf("model %s: %w", name, err)
		}
		if err := man.Config.Validate(); err != nil {
			return nil, fmt.Errorf("model %s: the load's config: %w", name, err)
		}
	}
	grid, err := bucketing.NewGrid(man.Config.Buckets.Batch, man.Config.Buckets.Seq)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", name, err)
	}
	batchOpts, err := l.batchingOptions(name, man.Config)
	if err != nil {
		return nil, err
	}
	need, err := l.admit(man, l.enginesFor(man.Config), grid.Shapes())
	if err != nil {
		return nil, err
	}
	m, err := man.Load(ctx)
	if err != nil {
		return nil, err
	}
	if n := len(m.Skipped); n > 0 {
		l.logger.Info("model weights: tensors the model does not use were left unread", "model", name, "count", n,
			"tensors", strings.Join(m.Skipped[:min(n, 16)], ", ")+map[bool]string{true: fmt.Sprintf(" and %d more", n-16)}[n > 16])
	}
	sm, err := l.newModel(ctx, m, grid, batchOpts)
	if err != nil {
		return nil, err
	}
	sm.resident = need
	// Its own load, from reading the repository to its program on the
	// engine: not the other models' that LoadAll reads before the
	// warm-ups begin.
	sm.loaded, sm.loadTook = began, time.Since(began)
	return sm, nil
}

// enginesFor names the engines a model loads on: its own, then the
// failover engine when there is one.
func (l *loader) enginesFor(cfg *models.Config) []string {
	name := cfg.Engine
	if name == "" {
		name = l.opts.DefaultEngine
	}
	fb := l.opts.Failover
	if fb == "" || fb == name || cfg.Architecture == "torch" && fb == "cpu" {
		// The Go CPU engine cannot run a PyTorch module: such a model
		// has no failover there.
		return []string{name}
	}
	return []string{name, fb}
}

// batchingOptions merges model.yaml's batching keys over the defaults and
// checks the result, before anything is loaded.
func (l *loader) batchingOptions(name string, cfg *models.Config) (batching.Options, error) {
	o := batching.Options{Model: name, Policy: l.opts.Batching, Metrics: l.opts.BatchMetrics, Logger: l.logger}
	b := cfg.Batching
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
	if b.MaxBatchTokens != nil {
		o.Policy.MaxBatchTokens = *b.MaxBatchTokens
	}
	if err := o.Policy.Validate(); err != nil {
		return o, fmt.Errorf("model %s: %s: %w", name, models.ConfigFile, err)
	}
	return o, nil
}

// retire drains and closes a model no longer reachable by name; forget
// deletes its series too (not when a newer version took its name).
func (l *loader) retire(m *Model, forget bool) {
	ctx, cancel := context.WithTimeout(context.Background(), l.opts.DrainGrace)
	defer cancel()
	if err := m.drain(ctx); err != nil {
		l.logger.Warn("unload: drain incomplete", "model", m.model.Name, "err", err)
	}
	m.closeWhenIdle(time.Second)
	if forget {
		l.forget(m.model.Name)
	}
	l.logger.Info("model unloaded", "model", m.model.Name, "replaced", !forget)
}

// forget deletes every series of a model no longer served.
func (l *loader) forget(name string) {
	l.opts.StepMetrics.Forget(name)
	l.opts.BatchMetrics.Forget(name)
	l.metrics.forget(name)
}
