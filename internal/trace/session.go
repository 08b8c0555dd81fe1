// A trace file being taken for a model: when it closes, and its writing.

package trace

import "time"

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
