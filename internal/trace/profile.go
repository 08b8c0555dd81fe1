// What an engine records inside a step at trace level PROFILE.

package trace

import (
	"encoding/json"
	"errors"
	"sync"
	"time"
)

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
