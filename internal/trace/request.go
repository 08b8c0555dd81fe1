// A sampled request's trace, and the traced steps its rows ran in.

package trace

import "time"

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
