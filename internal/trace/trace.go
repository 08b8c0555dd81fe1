// Package trace is stepserve's side of Triton's trace extension: settings
// per server and per model (trace_level OFF, TIMESTAMPS or PROFILE,
// trace_rate, trace_count, log_frequency, trace_file), sampled requests
// whose phases the server, the batcher and the step stamp, the traced
// steps (and, at PROFILE, what the engine saw inside them), and the Chrome
// trace files (the traceEvents JSON that Perfetto and chrome://tracing
// open) they are written to, under a directory of bounded count and size.
//
// Tracing off costs the request path one atomic load ([Tracer.Sample]):
// nothing is allocated or stamped for a request that is not traced.
package trace

import (
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure a [Tracer].
type Options struct {
	// Dir holds the trace files; it is created when the first one is
	// written. Empty means stepserve-traces-<pid> under the OS temp directory.
	Dir string
	// MaxFiles bounds the trace files kept: the oldest go first. 0 means 32.
	MaxFiles int
	// MaxBytes bounds one file; events past it are dropped, and counted in
	// the file's otherData. 0 means 16 MiB.
	MaxBytes int64
	// Wait bounds how long a trace waits for its requests' answers, and an
	// open trace of no step limit for its next step, before it is written.
	// 0 means 5s.
	Wait   time.Duration
	Logger *slog.Logger // nil discards
}

// MaxStepsPerFile bounds the steps of one file when trace_count sets no
// limit and log_frequency none either.
const MaxStepsPerFile = 1000

// maxRequestsPerFile bounds the requests one file keeps.
const maxRequestsPerFile = 16 * MaxStepsPerFile

// Tracer holds the trace settings in force and the traces being taken.
// Its methods are safe for concurrent use; a nil *Tracer traces nothing.
type Tracer struct {
	opts  Options
	store *Store
	// armed is whether any setting may trace a request: the one thing the
	// request path reads while tracing is off.
	armed atomic.Bool

	mu       sync.Mutex
	global   Settings
	models   map[string]*override
	sampled  map[string]uint64   // per model: requests seen while tracing, for trace_rate
	sessions map[string]*session // per model: the trace being taken
	writes   sync.WaitGroup
	closed   bool
}

// override is a model's own settings: the keys it sets.
type override struct {
	has map[string]bool
	s   Settings
}

// DirOr is dir, or the default trace directory when dir is empty:
// stepserve-traces-<pid> under the OS temp directory, this process's own,
// so that servers side by side neither list nor prune each other's files
// (set trace.dir to keep traces across restarts).
func DirOr(dir string) string {
	if dir == "" {
		return defaultDir()
	}
	return dir
}

func defaultDir() string {
	return filepath.Join(os.TempDir(), "stepserve-traces-"+strconv.Itoa(os.Getpid()))
}

// New returns a Tracer with tracing off.
func New(opts Options) *Tracer {
	opts.Dir = DirOr(opts.Dir)
	if opts.MaxFiles <= 0 {
		opts.MaxFiles = 32
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = 16 << 20
	}
	if opts.Wait <= 0 {
		opts.Wait = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Tracer{opts: opts, store: newStore(opts.Dir, opts.MaxFiles), global: DefaultSettings,
		models: map[string]*override{}, sampled: map[string]uint64{}, sessions: map[string]*session{}}
}

// Dir is the directory the trace files are written to.
func (t *Tracer) Dir() string { return t.opts.Dir }

// Files is the store of written traces.
func (t *Tracer) Files() *Store { return t.store }

// effective is model's settings: its overrides over the global ones.
// Called with t.mu held.
func (t *Tracer) effective(model string) Settings {
	s := t.global
	o := t.models[model]
	if model == "" || o == nil {
		return s
	}
	for k := range o.has {
		switch k {
		case keyLevel:
			s.Level = o.s.Level
		case keyRate:
			s.Rate = o.s.Rate
		case keyCount:
			s.Count = o.s.Count
		case keyLogFrequency:
			s.LogFrequency = o.s.LogFrequency
		case keyFile:
			s.File = o.s.File
		}
	}
	return s
}

// Settings returns the settings in force for model, or the global ones
// for "", as Triton's JSON writes them.
func (t *Tracer) Settings(model string) map[string]any {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.effective(model).Map()
}

// Update applies a settings request body (Triton's JSON: strings, null to
// remove a model's override of a key; for a model, an empty object removes
// every override) to model's settings, or the global ones for "", and
// returns the settings then in force. Traces being taken under the old
// settings are finished and written. It returns a *BadSettingsError for
// unknown keys and bad values, naming each.
func (t *Tracer) Update(model string, body []byte) (map[string]any, error) {
	u, err := parseUpdate(body)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if model == "" {
		if len(u.clear) > 0 {
			return nil, &BadSettingsError{[]string{"null clears a model's override; the global settings take values"}}
		}
		u.apply(&t.global, nil)
	} else {
		o := t.models[model]
		if o == nil {
			o = &override{has: map[string]bool{}}
		}
		if len(u.set) == 0 && len(u.clear) == 0 {
			o.has = map[string]bool{} // Triton: no settings removes the model's
		}
		for k := range u.clear {
			delete(o.has, k)
		}
		u.apply(&o.s, o.has)
		if len(o.has) == 0 {
			delete(t.models, model)
		} else {
			t.models[model] = o
		}
	}
	for _, s := range t.sessions {
		t.finish(s) // taken under other settings
	}
	t.rearm()
	return t.effective(model).Map(), nil
}

// rearm sets armed from the settings. Called with t.mu held.
func (t *Tracer) rearm() {
	on := t.global.Level != LevelOff && t.global.Count != 0
	for m := range t.models {
		if s := t.effective(m); s.Level != LevelOff && s.Count != 0 {
			on = true
		}
	}
	t.armed.Store(on)
}

// Forget drops a model's own settings, when it is unloaded.
func (t *Tracer) Forget(model string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.models, model)
	delete(t.sampled, model)
	t.rearm()
}

// Sample returns a trace record for a request to model that trace_rate
// samples while model's tracing is on, and nil otherwise (at the cost of
// one atomic load while tracing is off everywhere).
func (t *Tracer) Sample(model string) *Request {
	if t == nil || !t.armed.Load() {
		return nil
	}
	return t.sample(model)
}

func (t *Tracer) sample(model string) *Request {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.effective(model)
	if s.Level == LevelOff || s.Count == 0 || t.closed {
		return nil
	}
	n := t.sampled[model]
	t.sampled[model] = n + 1
	if n%uint64(s.Rate) != 0 {
		return nil
	}
	r := &Request{t: t, model: model}
	r.at[Received] = now
	return r
}

// Close writes the traces being taken, and waits for every write.
func (t *Tracer) Close() {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.closed = true
	t.armed.Store(false)
	for _, s := range t.sessions {
		t.finish(s)
		if s.timer != nil {
			s.timer.Stop()
		}
		t.writeLocked(s)
	}
	t.mu.Unlock()
	t.writes.Wait()
}
