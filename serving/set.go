package serving

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepserve/stepserve/batching"
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
	// VLLMMetrics exports the language models' series under vLLM's names
	// too (vllm_metrics.go; server.vllm_metrics).
	VLLMMetrics bool
	Logger      *slog.Logger // nil discards
}

// Set is the live model set. Lookups are safe while loads and unloads run;
// loads and unloads run one at a time.
type Set struct {
	opts    Options
	logger  *slog.Logger
	metrics *metrics
	loader  *loader // makes and retires its models; owns the engines

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
		changing: make(chan struct{}, 1)}
	s.stopping, s.stop = context.WithCancel(context.Background())
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	engines, err := newEngines(opts.Engines)
	if err != nil {
		return nil, err
	}
	for _, name := range []string{opts.DefaultEngine, opts.Failover} {
		if _, ok := opts.Engines[name]; name != "" && !ok {
			return nil, fmt.Errorf("serving: engine %q is not among the engines given (%s)", name, strings.Join(engines.names(), ", "))
		}
	}
	if s.metrics, err = newMetrics(opts.Registerer, s, opts.VLLMMetrics); err != nil {
		return nil, err
	}
	s.loader = &loader{set: s, opts: &s.opts, logger: s.logger, engines: engines, metrics: s.metrics, limit: newModelLimit(opts.MaxModelBytes)}
	s.logger.Info("model limits", "max_model_bytes", s.loader.limit.why, "load_timeout", opts.LoadTimeout)
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
	errs = append(errs, s.loader.engines.close())
	return errors.Join(errs...)
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
