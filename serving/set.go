package serving

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// Errors of the set's lookups and loads; the server answers them with 404,
// 400 and 503.
var (
	ErrUnknownModel = errors.New("serving: unknown model")
	ErrBadModel     = errors.New("serving: model failed to load")
	// ErrEngineUnavailable is wrapped by the start errors of an engine this
	// machine cannot run (the torch engine without torch): LoadAll skips
	// its models, with a log line, instead of failing.
	ErrEngineUnavailable = errors.New("serving: engine unavailable on this machine")
	// ErrStopping: the set is draining; loads and unloads are refused or
	// cancelled (the server answers 503).
	ErrStopping = errors.New("serving: shutting down")
)

// Options configure a [Set].
type Options struct {
	// Repository is the model repository directory: one directory per
	// model, each holding a model.yaml.
	Repository string
	// Engines are the engines models may name, by name ("cpu", "torch",
	// "rbln").
	Engines map[string]Engine
	// DefaultEngine runs models whose model.yaml names none.
	DefaultEngine string
	// Failover, when set, names the engine that serves a model's steps
	// while its own engine's device is down. Models already on it have no
	// failover.
	Failover string
	// Batching is the server-wide batching policy that model.yaml's
	// batching keys override; its zero fields take batching's defaults.
	Batching batching.Policy
	// DrainGrace bounds how long an unloaded or replaced model may take to
	// run what it has queued; 0 means 30s.
	DrainGrace time.Duration
	// MaxModelBytes bounds the host memory all served models hold
	// together: a model whose estimate (its weights, and what its engines
	// allocate for its buckets), with what the served ones hold, is above
	// it is refused before its weights are read. 0 means half the
	// process's memory limit ([memlimit.Read]).
	MaxModelBytes int64
	// LoadTimeout bounds one model's load: reading, loading on its
	// engines and, through [Set.Load], warming up. 0 means 10 minutes.
	LoadTimeout time.Duration
	// KeepGoing serves the models that load and warm up at start and
	// leaves the others unserved, each listed UNAVAILABLE with its reason
	// (models.exit_on_error false); without it, [Set.LoadAll] and
	// [Set.Warmup] fail on any model, LoadAll naming every one that failed.
	KeepGoing bool
	// StrictReadiness makes [Set.Ready] false while a model that failed
	// at start (with KeepGoing) is not served (server.strict_readiness).
	StrictReadiness bool

	// StepMetrics and BatchMetrics record every model's steps and queues;
	// nil records nothing. The set deletes a model's series on unload.
	StepMetrics  *steps.Metrics
	BatchMetrics *batching.Metrics
	// Registerer receives the set's own metrics; nil registers none.
	Registerer prometheus.Registerer
	Logger     *slog.Logger // nil discards
}

// Set is the live model set. Lookups are safe while loads and unloads run;
// loads and unloads run one at a time.
type Set struct {
	opts    Options
	logger  *slog.Logger
	engines *engines
	metrics *metrics

	limit modelLimit

	mu     sync.RWMutex
	served map[string]*Model
	failed map[string]string // why a model last failed to load
	// startFailed are the models that failed at start, until one of them
	// loads.
	startFailed map[string]bool

	// changing holds a token while a load or an unload runs: one at a
	// time, and one waiting gives up when its context ends.
	changing chan struct{}
	// waiting counts the loads and unloads waiting for changing.
	waiting atomic.Int32

	// stopping ends when Drain starts: loads in progress are cancelled,
	// since a stopping server will never serve what they load.
	stopping context.Context
	stop     context.CancelFunc
}

// New returns an empty set. Serve the repository with [Set.LoadAll] and
// [Set.Warmup], and stop with [Set.Drain] and [Set.Close].
func New(opts Options) (*Set, error) {
	if opts.DrainGrace == 0 {
		opts.DrainGrace = 30 * time.Second
	}
	if opts.LoadTimeout == 0 {
		opts.LoadTimeout = 10 * time.Minute
	}
	opts.Batching = opts.Batching.WithDefaults()
	if err := opts.Batching.Validate(); err != nil {
		return nil, fmt.Errorf("serving: batching defaults: %w", err)
	}
	s := &Set{opts: opts, logger: opts.Logger, served: map[string]*Model{}, failed: map[string]string{}, startFailed: map[string]bool{},
		changing: make(chan struct{}, 1), limit: newModelLimit(opts.MaxModelBytes)}
	s.stopping, s.stop = context.WithCancel(context.Background())
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	var err error
	if s.engines, err = newEngines(opts.Engines); err != nil {
		return nil, err
	}
	for _, name := range []string{opts.DefaultEngine, opts.Failover} {
		if _, ok := opts.Engines[name]; name != "" && !ok {
			return nil, fmt.Errorf("serving: engine %q is not among the engines given (%s)", name, strings.Join(s.engines.names(), ", "))
		}
	}
	if s.metrics, err = newMetrics(opts.Registerer, s); err != nil {
		return nil, err
	}
	s.logger.Info("model limits", "max_model_bytes", s.limit.why, "load_timeout", opts.LoadTimeout)
	return s, nil
}

// Model returns the model served under name.
func (s *Set) Model(name string) (*Model, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	m, ok := s.served[name]
	return m, ok
}

// Models returns the served models in name order.
func (s *Set) Models() []*Model {
	s.mu.RLock()
	out := make([]*Model, 0, len(s.served))
	for _, m := range s.served {
		out = append(out, m)
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b *Model) int { return strings.Compare(a.model.Name, b.model.Name) })
	return out
}

// Ready reports whether every served model is ready, and if not, names the
// first that is not.
func (s *Set) Ready() (bool, string) {
	for _, m := range s.Models() {
		if !m.Ready() {
			return false, m.model.Name
		}
	}
	if s.opts.StrictReadiness {
		s.mu.RLock()
		defer s.mu.RUnlock()
		if len(s.startFailed) > 0 {
			return false, slices.Sorted(maps.Keys(s.startFailed))[0]
		}
	}
	return true, ""
}

// LoadAll loads every model of the repository onto its engine, without
// warming it up: a server answers liveness while [Set.Warmup] compiles.
// A bad model fails the whole load, naming every model that failed, so
// that a server never starts with part of what it was asked to serve;
// with KeepGoing the others are served and the failed ones listed
// UNAVAILABLE with their reasons. Each model is checked and bounded as
// [Set.Load] does. It honours ctx.
func (s *Set) LoadAll(ctx context.Context) error {
	names, err := models.List(s.opts.Repository)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return fmt.Errorf("models: repository %s holds no model (no <name>/%s, and no Hugging Face folder <name>/%s)", s.opts.Repository, models.ConfigFile, models.HFConfigFile)
	}
	var failed []error
	for _, name := range names {
		err := s.add(ctx, name)
		switch {
		case errors.Is(err, ErrEngineUnavailable):
			s.logger.Warn("model skipped: its engine cannot run on this machine", "model", name, "err", err)
			s.mu.Lock()
			s.failed[name] = err.Error()
			s.mu.Unlock()
		case err != nil && (ctx.Err() != nil || s.stopping.Err() != nil):
			return fmt.Errorf("model repository %s: %w", s.opts.Repository, err)
		case err != nil:
			failed = append(failed, s.startFailure(name, err))
		}
	}
	if len(failed) > 0 && !s.opts.KeepGoing {
		return fmt.Errorf("model repository %s: %d of %d models failed to load (models.exit_on_error: false serves the others):\n%w",
			s.opts.Repository, len(failed), len(names), errors.Join(failed...))
	}
	return nil
}

// startFailure records that name failed at start, and returns err naming
// it; with KeepGoing it is logged, and the set serves on without it.
func (s *Set) startFailure(name string, err error) error {
	s.mu.Lock()
	s.failed[name] = err.Error()
	s.startFailed[name] = true
	s.mu.Unlock()
	if s.opts.KeepGoing {
		s.logger.Error("model failed at start; serving the others (models.exit_on_error false)", "model", name, "err", err)
	}
	if strings.HasPrefix(err.Error(), "model "+name+":") {
		return err // it names the model already
	}
	return fmt.Errorf("model %s: %w", name, err)
}

// add reads name and serves it, not yet warmed up (not ready). It
// replaces nothing: a model of that name must not be served already.
func (s *Set) add(ctx context.Context, name string) error {
	ctx, cancel := s.loadContext(ctx)
	defer cancel()
	if err := s.lock(ctx, name); err != nil {
		return err
	}
	defer s.unlock()
	if _, ok := s.Model(name); ok {
		return fmt.Errorf("serving: model %s is already served; Load replaces it", name)
	}
	return s.guard(ctx, name, func() error {
		sm, err := s.read(ctx, name, nil)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.served[name] = sm
		delete(s.failed, name)
		s.mu.Unlock()
		return nil
	})
}

// Warmup warms up every served model that is not warm yet, in name order,
// and returns the first failure.
func (s *Set) Warmup(ctx context.Context) error {
	ctx, cancel := s.untilStopping(ctx)
	defer cancel()
	for _, m := range s.Models() {
		err := s.warmup(ctx, m)
		if err == nil {
			continue
		}
		if ctx.Err() != nil || !s.opts.KeepGoing {
			return err
		}
		// Served no more: listed UNAVAILABLE with why; the others go on.
		name := m.model.Name
		s.mu.Lock()
		cur, ok := s.served[name]
		if ok && cur == m {
			delete(s.served, name)
		}
		s.mu.Unlock()
		if ok && cur == m {
			s.retire(m, true)
		}
		s.startFailure(name, err)
	}
	return nil
}

// warmup warms m while no load or unload runs, unless it is warm already
// or no longer served (unloaded or replaced meanwhile).
func (s *Set) warmup(ctx context.Context, m *Model) error {
	if err := s.lock(ctx, m.model.Name); err != nil {
		return err
	}
	defer s.unlock()
	if cur, ok := s.Model(m.model.Name); !ok || cur != m || m.warmed.Load() {
		return nil
	}
	return m.Warmup(ctx)
}

// IndexEntry is one model directory of the repository, served or not.
type IndexEntry struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
	// State is READY, LOADING (loaded, warming up, or its device down
	// without failover) or UNAVAILABLE.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
}

// Index lists every model directory of the repository in name order,
// served or not, with its state: the directories [models.List] names,
// those with a model.yaml and Hugging Face folders served as they are.
func (s *Set) Index(ctx context.Context) ([]IndexEntry, error) {
	// The directory is read outside the lock, so that slow storage never
	// holds up lookups.
	names, err := models.List(s.opts.Repository)
	if err != nil {
		return nil, fmt.Errorf("serving: %w", err)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []IndexEntry
	for _, name := range names {
		ie := IndexEntry{Name: name, State: "UNAVAILABLE", Reason: "unloaded"}
		if m, ok := s.served[name]; ok {
			ie.Version = m.model.Version
			ie.State, ie.Reason = "LOADING", ""
			if m.Ready() {
				ie.State = "READY"
			}
		} else if why, ok := s.failed[name]; ok {
			ie.Reason = why
		}
		out = append(out, ie)
	}
	return out, nil
}

// Load loads name from the repository, warms it up and serves it; it
// returns when the model is ready. A model already served goes on serving
// until the new one is ready, then drains its queue and is closed. A load
// cancelled through ctx (its client went away, the server is stopping) or
// out of time (Options.LoadTimeout) leaves the served model as it was.
// Errors wrap [ErrUnknownModel] (no such model directory) or
// [ErrBadModel]; a load waiting for another past its context returns the
// context's error.
func (s *Set) Load(ctx context.Context, name string) error {
	return s.LoadWith(ctx, name, nil)
}

// Override changes a model's configuration, as read from its model.yaml,
// before it loads; the result is validated as model.yaml is. Errors it
// returns should wrap [models.ErrConfig].
type Override func(*models.Config) error

// LoadWith is [Set.Load] with the model's configuration changed by
// override (nil: none): the repository API's load with a config.
func (s *Set) LoadWith(ctx context.Context, name string, override Override) error {
	if !models.ValidName(name) {
		return fmt.Errorf("%w: %q is not a valid model name", ErrUnknownModel, name)
	}
	ctx, cancel := s.loadContext(ctx)
	defer cancel()
	if err := s.lock(ctx, name); err != nil {
		return err
	}
	defer s.unlock()

	err := s.guard(ctx, name, func() error {
		sm, err := s.read(ctx, name, override)
		if err != nil {
			return err
		}
		installed := false
		defer func() { // on every failure, a panic included
			if !installed {
				sm.drain(context.Background())
				sm.Close()
			}
		}()
		if err := s.replace(ctx, sm); err != nil {
			return err
		}
		installed = true
		return nil
	})
	if errors.Is(err, models.ErrNoModel) {
		return fmt.Errorf("%w: the repository has no %s/%s", ErrUnknownModel, name, models.ConfigFile)
	}
	if err != nil && s.stopping.Err() != nil {
		return fmt.Errorf("%w: the load of %s was cancelled: %w", ErrStopping, name, err)
	}
	if err != nil {
		s.mu.Lock()
		s.failed[name] = err.Error()
		_, served := s.served[name]
		s.mu.Unlock()
		if !served {
			s.forget(name) // the series its runners created
		}
		return fmt.Errorf("%w: %w", ErrBadModel, err)
	}
	s.mu.Lock()
	delete(s.startFailed, name) // loaded at last: ready again, where it was all that was missing
	s.mu.Unlock()
	return nil
}

// loadContext is ctx bounded by the load timeout, and cancelled when the
// set starts draining.
func (s *Set) loadContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, stop := s.untilStopping(ctx)
	d := s.opts.LoadTimeout
	ctx, cancel := context.WithTimeoutCause(ctx, d,
		fmt.Errorf("the load did not finish within models.load_timeout (%v): %w", d, context.DeadlineExceeded))
	return ctx, func() { cancel(); stop() }
}

// lock waits for the load or unload in progress, if any, until ctx ends.
func (s *Set) lock(ctx context.Context, name string) error {
	if s.stopping.Err() != nil {
		return fmt.Errorf("%w: %s is neither loaded nor unloaded now", ErrStopping, name)
	}
	select {
	case s.changing <- struct{}{}:
		return nil
	default:
	}
	s.waiting.Add(1)
	defer s.waiting.Add(-1)
	select {
	case s.changing <- struct{}{}:
		return nil
	case <-ctx.Done():
		if s.stopping.Err() != nil {
			return fmt.Errorf("%w: %s is neither loaded nor unloaded now", ErrStopping, name)
		}
		return fmt.Errorf("serving: %s: another load or unload is still running: %w", name, context.Cause(ctx))
	}
}

func (s *Set) unlock() { <-s.changing }

// Waiting counts the loads and unloads waiting for another load or unload
// to finish (they run one at a time).
func (s *Set) Waiting() int { return int(s.waiting.Load()) }

// guard runs one model's load, turning a panic in it (a bug in a loader
// or an engine, met on a file nobody foresaw) into the load's error, so
// that no model file takes the server down; the stack goes to the log. An
// error after ctx ended says why it ended.
func (s *Set) guard(ctx context.Context, name string, load func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.logger.Error("model load panicked", "model", name, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("model %s: the load failed on an internal error (logged)", name)
		}
		if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w: %w", cause, err)
		}
	}()
	return load()
}

// read reads name from the repository and loads it onto its engines, not
// warmed up. What it will take is checked before its weights are read:
// model.yaml and the tensors' shapes, its batching keys, and its
// estimated memory against the limit.
func (s *Set) read(ctx context.Context, name string, override Override) (*Model, error) {
	began := time.Now()
	man, err := models.Open(s.opts.Repository, name)
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
	batchOpts, err := s.batchingOptions(name, man.Config)
	if err != nil {
		return nil, err
	}
	need, err := s.admit(man, s.enginesFor(man.Config), grid.Shapes())
	if err != nil {
		return nil, err
	}
	m, err := man.Load(ctx)
	if err != nil {
		return nil, err
	}
	if n := len(m.Skipped); n > 0 {
		s.logger.Info("model weights: tensors the model does not use were left unread", "model", name, "count", n,
			"tensors", strings.Join(m.Skipped[:min(n, 16)], ", ")+map[bool]string{true: fmt.Sprintf(" and %d more", n-16)}[n > 16])
	}
	sm, err := s.newModel(ctx, m, grid, batchOpts)
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
func (s *Set) enginesFor(cfg *models.Config) []string {
	name := cfg.Engine
	if name == "" {
		name = s.opts.DefaultEngine
	}
	fb := s.opts.Failover
	if fb == "" || fb == name || cfg.Architecture == "torch" && fb == "cpu" {
		// The Go CPU engine cannot run a PyTorch module: such a model
		// has no failover there.
		return []string{name}
	}
	return []string{name, fb}
}

// replace warms up a new version of a model before it takes over.
func (s *Set) replace(ctx context.Context, sm *Model) error {
	if err := sm.Warmup(ctx); err != nil {
		return err
	}
	name := sm.model.Name
	s.mu.Lock()
	if s.stopping.Err() != nil { // Drain has taken its list of models
		s.mu.Unlock()
		return ErrStopping
	}
	old := s.served[name]
	s.served[name] = sm
	delete(s.failed, name)
	s.mu.Unlock()
	if old != nil {
		s.retire(old, false)
	}
	return nil
}

// Unload stops serving name: from now on it is not found, it runs what it
// has queued within the drain grace, and its metric series are deleted.
func (s *Set) Unload(ctx context.Context, name string) error {
	if err := s.lock(ctx, name); err != nil {
		return err
	}
	defer s.unlock()
	s.mu.Lock()
	m, ok := s.served[name]
	delete(s.served, name)
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q is not loaded", ErrUnknownModel, name)
	}
	s.retire(m, true)
	return nil
}

// retire drains and closes a model no longer reachable by name; forget
// deletes its series too (not when a newer version took its name).
func (s *Set) retire(m *Model, forget bool) {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.DrainGrace)
	defer cancel()
	if err := m.drain(ctx); err != nil {
		s.logger.Warn("unload: drain incomplete", "model", m.model.Name, "err", err)
	}
	m.closeWhenIdle(time.Second)
	if forget {
		s.forget(m.model.Name)
	}
	s.logger.Info("model unloaded", "model", m.model.Name, "replaced", !forget)
}

// forget deletes every series of a model no longer served.
func (s *Set) forget(name string) {
	s.opts.StepMetrics.Forget(name)
	s.opts.BatchMetrics.Forget(name)
	s.metrics.forget(name)
}

// untilStopping is ctx, cancelled also when the set starts draining.
func (s *Set) untilStopping(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	unhook := context.AfterFunc(s.stopping, cancel)
	return ctx, func() { unhook(); cancel() }
}

// Drain stops every model from taking requests and runs what each has
// queued, side by side, within ctx: the first half of a graceful shutdown.
// Loads and warm-ups in progress are cancelled. Models that ran out of
// time answer what is left with [batching.ErrDraining].
func (s *Set) Drain(ctx context.Context) {
	s.stop()
	// Wait out a load or unload in progress (cancelled by stop), so that
	// no model is installed after the list below is taken.
	select {
	case s.changing <- struct{}{}:
		defer s.unlock()
	case <-ctx.Done():
	}
	var wg sync.WaitGroup
	for _, m := range s.Models() {
		wg.Go(func() {
			if err := m.drain(ctx); err != nil {
				s.logger.Warn("drain incomplete", "model", m.model.Name, "err", err)
			}
		})
	}
	wg.Wait()
}

// Close closes every model's programs and the engines the set started.
// Call it after [Set.Drain].
func (s *Set) Close() error {
	var errs []error
	for _, m := range s.Models() {
		m.closeWhenIdle(time.Second)
	}
	s.mu.Lock()
	clear(s.served)
	s.mu.Unlock()
	errs = append(errs, s.engines.close())
	return errors.Join(errs...)
}

// batchingOptions merges model.yaml's batching keys over the defaults and
// checks the result, before anything is loaded.
func (s *Set) batchingOptions(name string, cfg *models.Config) (batching.Options, error) {
	o := batching.Options{Model: name, Policy: s.opts.Batching, Metrics: s.opts.BatchMetrics, Logger: s.logger}
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

// RunsCode reports whether the repository's model name is one whose
// directory holds code the worker would run (architecture torch); false
// when it cannot be read (its load then says why).
func (s *Set) RunsCode(name string) bool {
	m, err := models.Open(s.opts.Repository, name)
	if err != nil {
		return false
	}
	defer m.Close()
	return m.Config.Architecture == "torch"
}
