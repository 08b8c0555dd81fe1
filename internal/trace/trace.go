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
	"encoding/json"
	"errors"
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

// Phase is a moment of a request's life that its trace stamps.
type Phase int

const (
	// Received: its body has been read.
	Received Phase = iota
	// Decoded: its tensors are parsed and checked.
	Decoded
	// Prepared: its step inputs are packed for the model.
	Prepared
	// Enqueued: it was handed to the model's batcher.
	Enqueued
	// Batched: the batcher took it off the queue into a step.
	Batched
	// Written: its response has been written.
	Written
	numPhases
)

// Request is one sampled request's trace. Its stamps before Written are
// made by whoever holds the request at that point (the protocol handler,
// the batcher), in order; a nil *Request stamps nothing.
type Request struct {
	t     *Tracer
	model string
	// ID is the request's id, if it gave one.
	ID string
	// Rows is how many batch rows it has.
	Rows int

	at     [numPhases]time.Time
	steps  []*Step  // the traced steps its rows ran in; under t.mu
	sess   *session // the trace it belongs to; under t.mu
	status int      // under t.mu, once done
	done   bool     // under t.mu
}

// Stamp records that the request reached phase p now.
func (r *Request) Stamp(p Phase) {
	if r != nil && p < Written {
		r.at[p] = time.Now()
	}
}

// StampAt records that the request reached phase p at when.
func (r *Request) StampAt(p Phase, when time.Time) {
	if r != nil && p < Written {
		r.at[p] = when
	}
}

// Done records that the request's response has been written (or its error
// answered) with status.
func (r *Request) Done(status int) {
	if r == nil {
		return
	}
	now := time.Now()
	t := r.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.done {
		return
	}
	r.done, r.status = true, status
	r.at[Written] = now
	if s := r.sess; s != nil {
		s.pending--
		t.advance(s)
	}
}

// Step is one traced step, filled in by the step runner: what it ran,
// when each phase began and ended, and (at PROFILE) what the engine saw.
type Step struct {
	sess *session

	Engine, Device, Bucket string
	Rows, Requests         int
	Verdict                string
	Padding                float64
	// DeviceNS is the step's device time as the engine measured it; < 0
	// when it did not.
	DeviceNS int64
	// Start (packing begins), InferStart, InferEnd and End (unpacking
	// done).
	Start, InferStart, InferEnd, End time.Time
	// Err is the step's error, if it failed.
	Err string
	// Profile is what the engine recorded inside the step; nil unless the
	// level is PROFILE.
	Profile *Profile
}

// BeginStep returns a Step to fill for a step that runs r's rows, when
// r's model still has steps to trace (trace_count, counted down here); nil
// otherwise.
func (r *Request) BeginStep() *Step {
	if r == nil {
		return nil
	}
	t := r.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	s := t.effective(r.model)
	if s.Level == LevelOff || s.Count == 0 {
		return nil
	}
	last := false
	if s.Count > 0 {
		last = s.Count == 1
		if o := t.models[r.model]; o != nil && o.has[keyCount] {
			o.s.Count--
		} else {
			t.global.Count--
		}
		t.rearm()
	}
	sess := t.sessions[r.model]
	if sess == nil || sess.closed {
		sess = t.newSession(r.model, s)
	}
	st := &Step{sess: sess, DeviceNS: -1}
	if sess.level >= LevelProfile {
		st.Profile = &Profile{}
	}
	if last {
		sess.last = true
	}
	return st
}

// Attach records that r's rows ran in st.
func (r *Request) Attach(st *Step) {
	if r == nil || st == nil {
		return
	}
	t := r.t
	t.mu.Lock()
	defer t.mu.Unlock()
	r.steps = append(r.steps, st)
	if r.sess == nil && !r.done && len(st.sess.reqs) < maxRequestsPerFile {
		r.sess = st.sess
		st.sess.reqs = append(st.sess.reqs, r)
		st.sess.pending++
	}
}

// Finish adds the filled-in step to its trace.
func (st *Step) Finish() {
	if st == nil {
		return
	}
	t := st.sess.t
	t.mu.Lock()
	defer t.mu.Unlock()
	s := st.sess
	s.steps = append(s.steps, st)
	if s.last || (s.logFrequency > 0 && len(s.steps) >= s.logFrequency) || len(s.steps) >= MaxStepsPerFile {
		t.finish(s)
	}
	t.advance(s)
}

// session is one trace file being taken for a model.
type session struct {
	t            *Tracer
	model, file  string
	level        Level
	logFrequency int
	steps        []*Step
	reqs         []*Request
	pending      int  // reqs not answered yet
	last         bool // trace_count ran out on its last step
	closed       bool // takes no more steps: written once pending is 0, or at the wait
	written      bool
	timer        *time.Timer
	created      time.Time
}

func (t *Tracer) newSession(model string, s Settings) *session {
	file := s.File
	if file == "" {
		file = model
	}
	sess := &session{t: t, model: model, file: file, level: s.Level, logFrequency: s.LogFrequency, created: time.Now()}
	t.sessions[model] = sess
	return sess
}

// finish closes s to new steps. Called with t.mu held.
func (t *Tracer) finish(s *session) {
	s.closed = true
	if t.sessions[s.model] == s {
		delete(t.sessions, s.model)
	}
	t.advance(s)
}

// advance writes s once it is closed and its requests are answered, and
// otherwise (re)starts the wait after which it is written anyway. Called
// with t.mu held.
func (t *Tracer) advance(s *session) {
	if s.written {
		return
	}
	if s.closed && s.pending <= 0 {
		if s.timer != nil {
			s.timer.Stop()
		}
		t.writeLocked(s)
		return
	}
	if s.timer == nil {
		s.timer = time.AfterFunc(t.opts.Wait, func() { t.expire(s) })
	} else {
		s.timer.Reset(t.opts.Wait)
	}
}

// expire writes s after the wait: its steps so far, its requests as far as
// they got.
func (t *Tracer) expire(s *session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s.written {
		return
	}
	if !s.closed {
		s.closed = true
		if t.sessions[s.model] == s {
			delete(t.sessions, s.model)
		}
	}
	t.writeLocked(s)
}

// writeLocked renders s (with t.mu held, which guards what it reads) and
// writes it in the background.
func (t *Tracer) writeLocked(s *session) {
	if s.written || len(s.steps) == 0 {
		s.written = true
		return
	}
	s.written = true
	data, meta := render(s, t.opts.MaxBytes)
	t.writes.Add(1)
	go func() {
		defer t.writes.Done()
		name, err := t.store.write(s.file, data, meta)
		if err != nil {
			t.opts.Logger.Error("trace not written", "model", s.model, "dir", t.opts.Dir, "err", err)
			return
		}
		t.opts.Logger.Info("trace written", "model", s.model, "file", name, "steps", meta.Steps,
			"bytes", len(data), "dropped_events", meta.DroppedEvents)
	}()
}

// Profile is what an engine recorded inside one step at trace level
// PROFILE: its own spans (the CPU engine's kernels), or a worker's
// torch.profiler events.
type Profile struct {
	// Recorder takes the engine's own spans.
	Recorder Recorder

	mu     sync.Mutex
	worker *workerProfile
}

// workerProfile is a worker's torch.profiler trace of one step.
type workerProfile struct {
	name       string
	events     json.RawMessage
	dropped    int
	activities []string
	anchor     string
}

// SetWorker keeps a worker's profile of the step: its Chrome trace events
// (a JSON array, at most maxWorkerEvents bytes), how many it dropped to
// stay within its bound, the profiler activities it ran, and the name
// prefix of its range around the step body (the events are shifted so that
// it starts where the step's infer span starts).
func (p *Profile) SetWorker(name string, events json.RawMessage, dropped int, activities []string, anchor string) error {
	if p == nil {
		return nil
	}
	if len(events) > MaxWorkerEventBytes {
		return errors.New("trace: a worker's profile is larger than MaxWorkerEventBytes")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.worker = &workerProfile{name: name, events: events, dropped: dropped, activities: activities, anchor: anchor}
	return nil
}

// MaxWorkerEventBytes bounds a worker's events for one step.
const MaxWorkerEventBytes = 8 << 20

// Recorder records an engine's spans inside a profiled step. A nil
// *Recorder records nothing and costs a nil check: a plan holds one only
// while a profiled step runs. Safe for concurrent use (the CPU engine's
// groups of sequences run side by side).
type Recorder struct {
	mu      sync.Mutex
	spans   []Span
	dropped int
}

// Span is one engine span: Name, with Layer when it is one layer's
// (-1 otherwise), on Track (a group of rows that ran on its own).
type Span struct {
	Name       string
	Layer      int
	Track      int
	Start, End time.Time
}

// maxSpans bounds the spans of one step.
const maxSpans = 1 << 16

// Begin returns the start of a span: now, or the zero time on a nil
// recorder.
func (r *Recorder) Begin() time.Time {
	if r == nil {
		return time.Time{}
	}
	return time.Now()
}

// End records the span name (layer, or -1) on track from start to now.
func (r *Recorder) End(name string, layer, track int, start time.Time) {
	if r == nil {
		return
	}
	end := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.spans) >= maxSpans {
		r.dropped++
		return
	}
	r.spans = append(r.spans, Span{Name: name, Layer: layer, Track: track, Start: start, End: end})
}

// Spans returns the spans recorded so far.
func (r *Recorder) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}
