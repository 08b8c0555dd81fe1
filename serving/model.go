package serving

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// Model is one model being served: loaded on its engine (once per replica
// that model.yaml's instances place), behind its batcher, ready once warmed
// up and while at least instances.min_ready replicas are healthy (or a
// failover engine serves it). Its methods are safe for concurrent use.
type Model struct {
	backend // what serves its requests, and what it reports of it (describe.go)
	model   *models.Model
	set     *Set
	logger  *slog.Logger

	// computeDtype is ComputeDtype's answer once the engine gave it:
	// every request that carries floats asks it.
	computeDtype atomic.Pointer[string]

	loaded   time.Time
	loadTook time.Duration // its own load, to its program on the engine
	readyIn  atomic.Int64  // ns of its own load and warm-up
	resident int64         // the host memory estimated before it was loaded

	warmed atomic.Bool
	closed atomic.Bool

	requests requestStats // what the protocols report (stats.go)
}

// newModel loads m onto its engine (and the failover engine), with a
// batcher in front; nothing is compiled yet.
func (l *loader) newModel(ctx context.Context, m *models.Model, grid *bucketing.Grid, batchOpts batching.Options) (*Model, error) {
	if m.Decoder != nil {
		return l.newDecoderModel(ctx, m)
	}
	engines := l.enginesFor(m.Config)
	name := engines[0]
	var err error
	sm := &Model{model: m, backend: backend{engine: name}, set: l.set, loaded: time.Now(),
		logger: l.logger.With("model", m.Name, "engine", name)}
	if sm.program, sm.runners, err = l.load(ctx, m, name, grid); err != nil {
		if len(engines) < 2 || !errors.Is(err, engine.ErrUnavailable) || ctx.Err() != nil {
			return nil, err
		}
		// Its engine cannot run it now (a worker that does not start):
		// with a failover engine the model serves there instead, rather
		// than keep the server from starting, until it is loaded again.
		fb := engines[1]
		l.logger.Warn("model's engine is unavailable; serving it on the failover engine until it is loaded again",
			"model", m.Name, "engine", name, "failover", fb, "err", err)
		name, engines = fb, []string{fb}
		sm.engine, sm.logger = fb, l.logger.With("model", m.Name, "engine", fb)
		if sm.program, sm.runners, err = l.load(ctx, oneReplica(m), fb, grid); err != nil {
			return nil, err
		}
	}
	sm.minReady = m.Config.Instances.MinReadyCount()
	sm.replicas = newReplicas(m.Name, sm.runners, sm.logger)
	var runner batching.Runner = sm.replicas
	if len(sm.runners) == 1 {
		runner = sm.runners[0] // nothing to choose between
	}
	if len(engines) > 1 {
		fb := engines[1]
		// The failover engine holds one replica: instances place the
		// model on its own engine's devices.
		var fallbacks []*steps.Runner
		if sm.fbProg, fallbacks, err = l.load(ctx, oneReplica(m), fb, grid); err != nil {
			sm.Close()
			return nil, err
		}
		sm.fallback, sm.fbEngine = fallbacks[0], fb
		runner = &failover{primary: runner, fallback: sm.fallback, primaryHealthy: sm.replicas.anyHealthy,
			model: m.Name, from: name, to: fb, switched: l.metrics.addFailover(m.Name, name, fb).Inc, logger: l.logger}
	}
	batchOpts.Padded = grid.Padded // for batching.max_batch_tokens
	if sm.batcher, err = batching.New(runner, batchOpts); err != nil {
		sm.Close()
		return nil, err
	}
	return sm, nil
}

// load makes a program for m on the named engine, and a runner for each
// of its replicas.
func (l *loader) load(ctx context.Context, m *models.Model, name string, grid *bucketing.Grid) (engine.Program, []*steps.Runner, error) {
	eng, err := l.engines.get(name)
	if err != nil {
		return nil, nil, fmt.Errorf("model %s: %w", m.Name, err)
	}
	prog, err := eng.Load(ctx, m, grid.Shapes())
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return nil, nil, loadError(m.Name, name, err)
	}
	reps := engine.ReplicasOf(prog)
	if need := m.Config.Instances.MinReadyCount(); need > len(reps) {
		prog.Close()
		return nil, nil, fmt.Errorf("model %s: %s: instances.min_ready: %d is more than the %d replicas engine %s loaded",
			m.Name, models.ConfigFile, need, len(reps), name)
	}
	first, err := steps.New(steps.Options{Model: m, Program: reps[0], Engine: eng.Name(), Device: reps[0].Device(), Grid: grid,
		Logger: l.logger, Metrics: l.opts.StepMetrics, StrictWarmup: l.engines.strictWarmup(name)})
	if err != nil {
		prog.Close()
		return nil, nil, err
	}
	runners := []*steps.Runner{first}
	for _, r := range reps[1:] {
		runners = append(runners, first.Sibling(r, r.Device()))
	}
	return prog, runners, nil
}

// oneReplica is m placed as one replica on its engine's choice of device,
// whatever its instances say: how a failover engine, whose devices are not
// the ones model.yaml names, holds it.
func oneReplica(m *models.Model) *models.Model {
	one := *m
	one.Config = oneReplicaConfig(m.Config)
	return &one
}

func oneReplicaConfig(cfg *models.Config) *models.Config {
	one := *cfg
	one.Instances = models.Instances{}
	return &one
}

// loadError is model's failed load on engine name: a model error (its own
// files at fault, named in it) with the model's name alone.
func loadError(model, name string, err error) error {
	if _, ok := errors.AsType[*engine.ModelError](err); ok {
		return fmt.Errorf("model %s: %w", model, err)
	}
	return fmt.Errorf("model %s: load on engine %s: %w", model, name, err)
}

// Warmup makes the model ready: with warmup: eager (the default) it first
// compiles and runs every bucket twice, on the failover engine too; with
// lazy, buckets compile on first use. It honours ctx.
func (m *Model) Warmup(ctx context.Context) error {
	warmStart := time.Now()
	if m.gen != nil {
		start := time.Now()
		if err := m.gen.warmup(ctx); err != nil {
			return fmt.Errorf("model %s: %w", m.model.Name, err)
		}
		m.warmed.Store(true)
		took := m.loadTook + time.Since(warmStart)
		m.readyIn.Store(int64(took))
		m.set.metrics.loaded(m.model.Name, took)
		m.logger.Info("model ready", "kind", "language model", "kv_cache_blocks", m.gen.opts.KVCacheBlocks,
			"block_size", m.gen.opts.BlockSize, "max_num_seqs", m.gen.opts.MaxNumSeqs, "max_model_len", m.gen.opts.MaxModelLen,
			"warmup_seconds", time.Since(start).Seconds(), "load_seconds", took.Seconds())
		return nil
	}
	if m.closed.Load() {
		return fmt.Errorf("serving: model %s was unloaded before its warm-up", m.model.Name)
	}
	buckets := 0
	if m.model.Config.Warmup != "lazy" {
		// Every replica is warmed, side by side: their devices compile
		// at once.
		errs := make([]error, len(m.runners))
		panics := make([]any, len(m.runners))
		var wg sync.WaitGroup
		for i, r := range m.runners {
			wg.Go(func() {
				// A panic (an engine's bug) goes back to the loading
				// goroutine, whose guard makes it the load's error.
				defer func() {
					if p := recover(); p != nil {
						panics[i] = fmt.Sprintf("%v [in the warm-up of replica %d]\n%s", p, i+1, debug.Stack())
					}
				}()
				_, err := r.Warmup(ctx)
				if err != nil && len(m.runners) > 1 {
					err = fmt.Errorf("replica %d of %d (device %q): %w", i+1, len(m.runners), r.Device(), err)
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for _, p := range panics {
			if p != nil {
				panic(p)
			}
		}
		buckets = m.runners[0].Buckets()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		if m.fallback != nil {
			if _, err := m.fallback.Warmup(ctx); err != nil {
				return err
			}
		}
	}
	took := m.loadTook + time.Since(warmStart)
	m.readyIn.Store(int64(took))
	m.set.metrics.loaded(m.model.Name, took)
	m.warmed.Store(true)
	m.logger.Info("model ready", "warmup", m.model.Config.Warmup, "buckets_compiled", buckets,
		"replicas", len(m.runners), "healthy_replicas", m.replicas.Healthy(), "min_ready", m.minReady,
		"failover", m.fallback != nil, "load_seconds", took.Seconds())
	return nil
}

// Model is the model's name, version, signature and weights.
func (m *Model) Model() *models.Model { return m.model }

// Engine is the name of the engine the model runs on.
func (m *Model) Engine() string { return m.engine }

// LoadedAt is when the model's load began.
func (m *Model) LoadedAt() time.Time { return m.loaded }

// ComputeDtype is the dtype the model's engine computes its floats in,
// where the engine says; "" where it does not.
func (m *Model) ComputeDtype() string {
	if d := m.computeDtype.Load(); d != nil {
		return *d
	}
	eng, err := m.set.loader.engines.get(m.engine)
	if err != nil {
		return "" // asked again next time
	}
	var d string
	if de, ok := eng.(engine.DtypeEngine); ok {
		d = de.ComputeDtype(m.model.Config)
	}
	m.computeDtype.Store(&d)
	return d
}

// ReadyIn is how long the model's own load and warm-up took (reading it,
// loading, compiling and warming up every bucket; not the other models'
// loads it waited behind at start); 0 until it is ready.
func (m *Model) ReadyIn() time.Duration { return time.Duration(m.readyIn.Load()) }

// Ready reports whether requests can be served now: warmed up, not
// draining, and at least instances.min_ready replicas healthy (or a
// failover engine to serve on).
func (m *Model) Ready() bool {
	if m.gen != nil {
		return m.warmed.Load()
	}
	return m.warmed.Load() && (m.fallback != nil || m.replicas.Healthy() >= m.minReady)
}

// Advise returns bucket advice for the model's traffic since it loaded
// (every replica's); see [steps.Runner.Advise].
func (m *Model) Advise(maxBuckets int) (Advice, error) {
	if m.gen != nil {
		// A language model's prefill steps are scheduled continuously;
		// its decode steps' context partitions are advised where its
		// engine runs them.
		if a, ok := m.gen.dec.(engine.ContextAdvisor); ok {
			return a.AdviseContexts(maxBuckets)
		}
		return Advice{}, fmt.Errorf("%w: model %s is a language model on an engine whose decode steps have no context partitions (the torch and rbln engines have); its steps are scheduled continuously, not by buckets", ErrNoTraffic, m.model.Name)
	}
	return m.runners[0].Advise(maxBuckets)
}

// drain stops taking requests and runs what is queued, within ctx.
func (m *Model) drain(ctx context.Context) error {
	m.warmed.Store(false)
	if m.gen != nil {
		return m.gen.drain(ctx)
	}
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
	if m.gen != nil {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		m.drain(ctx) // generations still running past wait end with an error
		m.Close()
		return
	}
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
	if m.gen != nil {
		errs = append(errs, m.gen.close())
	}
	if m.fbProg != nil {
		errs = append(errs, m.fbProg.Close())
	}
	if m.program != nil {
		errs = append(errs, m.program.Close())
	}
	return errors.Join(errs...)
}
