package trace

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The Chrome trace's processes: the model's steps and requests, the
// engine's own spans, and a worker's profiler events.
const (
	pidModel  = 1
	pidEngine = 2
	pidWorker = 3
)

// event is one Chrome trace event. Ts and Dur are microseconds from the
// trace's origin.
type event struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   micros         `json:"ts"`
	Dur  *micros        `json:"dur,omitempty"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	S    string         `json:"s,omitempty"`
	Args map[string]any `json:"args,omitempty"`
}

// micros is a time in microseconds, written with nanosecond precision.
type micros float64

func (m micros) MarshalJSON() ([]byte, error) {
	if math.IsNaN(float64(m)) || math.IsInf(float64(m), 0) {
		return []byte("0"), nil
	}
	return strconv.AppendFloat(nil, float64(m), 'f', 3, 64), nil
}

// encoder appends events to a trace, dropping those past its byte bound.
type encoder struct {
	buf     []byte
	limit   int
	events  int
	dropped int
}

func (e *encoder) add(ev *event) {
	b, err := json.Marshal(ev)
	if err != nil || len(e.buf)+len(b)+1 > e.limit {
		e.dropped++
		return
	}
	if e.events > 0 {
		e.buf = append(e.buf, ',')
	}
	e.buf = append(e.buf, b...)
	e.events++
}

// FileInfo describes a trace file, as GET /v2/trace/files lists it; the
// same fields open the file, under otherData.
type FileInfo struct {
	Name    string    `json:"name"`
	Size    int64     `json:"size"`
	Model   string    `json:"model"`
	Level   string    `json:"level"`
	Steps   int       `json:"steps"`
	Created time.Time `json:"created"`
	// Requests is how many traced requests it holds; DroppedEvents how
	// many events its size bound (trace.max_bytes) left out.
	Requests      int `json:"requests"`
	DroppedEvents int `json:"dropped_events"`
}

// trailerRoom is what the otherData block and the brackets may take, kept
// free of events.
const trailerRoom = 2048

// render writes s as a Chrome trace of at most maxBytes bytes.
func render(s *session, maxBytes int64) ([]byte, FileInfo) {
	origin := s.created
	for _, st := range s.steps {
		if st.Start.Before(origin) {
			origin = st.Start
		}
	}
	for _, r := range s.reqs {
		if at := r.at[Received]; !at.IsZero() && at.Before(origin) {
			origin = at
		}
	}
	us := func(t time.Time) micros { return micros(float64(t.Sub(origin).Nanoseconds()) / 1e3) }
	span := func(name string, pid, tid int, from, to time.Time, args map[string]any) *event {
		d := micros(0)
		if to.After(from) {
			d = micros(float64(to.Sub(from).Nanoseconds()) / 1e3)
		}
		return &event{Name: name, Ph: "X", Ts: us(from), Dur: &d, Pid: pid, Tid: tid, Args: args}
	}
	meta := func(what string, pid, tid int, name string) *event {
		return &event{Name: what, Ph: "M", Pid: pid, Tid: tid, Args: map[string]any{"name": name}}
	}
	limit := int(max(maxBytes-trailerRoom, 1024))
	e := &encoder{buf: make([]byte, 0, min(limit, 1<<20)), limit: limit}

	// Metadata first: a trace cut at its bound still names its rows.
	e.add(meta("process_name", pidModel, 0, "stepserve model "+s.model))
	e.add(&event{Name: "process_sort_index", Ph: "M", Pid: pidModel, Args: map[string]any{"sort_index": 1}})
	devices := map[string]int{}
	for _, st := range s.steps {
		key := st.Engine + " device " + st.Device
		if _, ok := devices[key]; !ok {
			devices[key] = len(devices) + 1
			e.add(meta("thread_name", pidModel, devices[key], "steps on "+key))
		}
	}
	reqTid := map[*Request]int{}
	for i, r := range s.reqs {
		tid := 1000 + i
		reqTid[r] = tid
		name := "request " + strconv.Itoa(i+1)
		if r.ID != "" {
			name += " (id " + clip(r.ID) + ")"
		}
		e.add(meta("thread_name", pidModel, tid, name))
	}
	engineRows, workerRows := false, false
	for _, st := range s.steps {
		if p := st.Profile; p != nil {
			engineRows = engineRows || len(p.Recorder.spans) > 0
			workerRows = workerRows || p.worker != nil
		}
	}
	if engineRows {
		e.add(meta("process_name", pidEngine, 0, "engine spans ("+s.model+")"))
	}

	// The steps, each with its phases, on its device's row.
	for i, st := range s.steps {
		tid := devices[st.Engine+" device "+st.Device]
		args := map[string]any{"step": i + 1, "bucket": st.Bucket, "rows": st.Rows, "requests": st.Requests,
			"verdict": st.Verdict, "padding": st.Padding, "engine": st.Engine, "device": st.Device}
		if st.DeviceNS >= 0 {
			args["device_ms"] = float64(st.DeviceNS) / 1e6
		}
		if st.Err != "" {
			args["error"] = st.Err
		}
		e.add(span("step", pidModel, tid, st.Start, st.End, args))
		e.add(span("copy in", pidModel, tid, st.Start, st.InferStart, nil))
		inferArgs := map[string]any(nil)
		if st.DeviceNS >= 0 {
			inferArgs = map[string]any{"device_ms": float64(st.DeviceNS) / 1e6}
		}
		e.add(span("infer", pidModel, tid, st.InferStart, st.InferEnd, inferArgs))
		e.add(span("copy out", pidModel, tid, st.InferEnd, st.End, nil))
	}

	// The requests: each on its own row, its phases inside its whole.
	for _, r := range s.reqs {
		tid := reqTid[r]
		end := r.at[Written]
		if !r.done {
			end = time.Time{}
		}
		if !end.IsZero() {
			args := map[string]any{"rows": r.Rows, "status": r.status, "steps": len(r.steps)}
			if r.ID != "" {
				args["id"] = clip(r.ID)
			}
			e.add(span("request", pidModel, tid, r.at[Received], end, args))
		}
		phases := []struct {
			name     string
			from, to Phase
		}{{"decode", Received, Decoded}, {"prepare", Decoded, Prepared}, {"queue", Enqueued, Batched}}
		for _, p := range phases {
			if !r.at[p.from].IsZero() && !r.at[p.to].IsZero() {
				e.add(span(p.name, pidModel, tid, r.at[p.from], r.at[p.to], nil))
			}
		}
		var last time.Time
		for _, st := range r.steps {
			e.add(span("step", pidModel, tid, st.Start, st.End, map[string]any{"bucket": st.Bucket, "rows": st.Rows, "verdict": st.Verdict}))
			last = st.End
		}
		if !end.IsZero() && !last.IsZero() {
			e.add(span("respond", pidModel, tid, last, end, nil))
		}
	}

	// What the engines recorded inside profiled steps.
	tracks := map[int]bool{}
	workerTids := map[string]int{}
	if workerRows {
		e.add(meta("process_name", pidWorker, 0, "worker torch.profiler ("+s.model+")"))
	}
	unaligned := 0
	for _, st := range s.steps {
		p := st.Profile
		if p == nil {
			continue
		}
		for _, sp := range p.Recorder.spans {
			if !tracks[sp.Track] {
				tracks[sp.Track] = true
				e.add(meta("thread_name", pidEngine, sp.Track+1, fmt.Sprintf("%s rows from sequence %d", st.Engine, sp.Track)))
			}
			name := sp.Name
			if sp.Layer >= 0 {
				name = fmt.Sprintf("layer %d: %s", sp.Layer, sp.Name)
			}
			e.add(span(name, pidEngine, sp.Track+1, sp.Start, sp.End, nil))
		}
		if p.Recorder.dropped > 0 {
			e.dropped += p.Recorder.dropped
		}
		if w := p.worker; w != nil {
			if !addWorker(e, w, us(st.InferStart), workerTids) {
				unaligned++
			}
		}
	}

	info := FileInfo{Model: s.model, Level: s.level.String(), Steps: len(s.steps), Created: s.created.UTC(),
		Requests: len(s.reqs), DroppedEvents: e.dropped}
	other := map[string]any{"stepserve": info, "origin_unix_ns": origin.UnixNano(),
		"clock": "ts and dur are microseconds from origin_unix_ns, on the server's monotonic clock"}
	if unaligned > 0 {
		other["unaligned_worker_steps"] = unaligned
	}
	head, _ := json.Marshal(other)
	out := make([]byte, 0, len(e.buf)+len(head)+64)
	out = append(out, `{"otherData":`...)
	out = append(out, head...)
	out = append(out, `,"displayTimeUnit":"ms","traceEvents":[`...)
	out = append(out, e.buf...)
	out = append(out, "]}\n"...)
	return out, info
}

// workerEvent is one event of a worker's torch.profiler Chrome trace.
type workerEvent struct {
	Name string          `json:"name"`
	Cat  string          `json:"cat"`
	Ph   string          `json:"ph"`
	Ts   float64         `json:"ts"`
	Dur  float64         `json:"dur"`
	Pid  json.RawMessage `json:"pid"`
	Tid  json.RawMessage `json:"tid"`
	Args json.RawMessage `json:"args"`
}

// AnchorPrefix begins the name of the worker's range around a profiled
// step's body.
const AnchorPrefix = "stepserve.step"

// addWorker adds a worker's events, shifted so that its range around the
// step body (named anchor...) starts at inferStart; it reports false when
// the range is missing (the events are then shifted so that the first
// starts there).
func addWorker(e *encoder, w *workerProfile, inferStart micros, tids map[string]int) bool {
	var evs []workerEvent
	if err := json.Unmarshal(w.events, &evs); err != nil {
		e.dropped++
		return false
	}
	anchor := w.anchor
	if anchor == "" {
		anchor = AnchorPrefix
	}
	shift, aligned := 0.0, false
	first := math.Inf(1)
	for _, ev := range evs {
		if ev.Ph == "X" && strings.HasPrefix(ev.Name, anchor) && !aligned {
			shift, aligned = float64(inferStart)-ev.Ts, true
		}
		if ev.Ph == "X" || ev.Ph == "i" || ev.Ph == "I" {
			first = min(first, ev.Ts)
		}
	}
	if !aligned {
		if math.IsInf(first, 1) {
			return false
		}
		shift = float64(inferStart) - first
	}
	tidOf := func(ev *workerEvent) int {
		key := string(ev.Pid) + "/" + string(ev.Tid)
		tid, ok := tids[key]
		if !ok {
			tid = len(tids) + 1
			tids[key] = tid
			name := fmt.Sprintf("%s thread %s", w.name, strings.Trim(string(ev.Tid), `"`))
			if strings.Contains(strings.ToLower(string(ev.Pid)+string(ev.Tid)), "rbln") || strings.Contains(ev.Cat, "kernel") {
				name = fmt.Sprintf("%s device %s", w.name, strings.Trim(string(ev.Tid), `"`))
			}
			e.add(&event{Name: "thread_name", Ph: "M", Pid: pidWorker, Tid: tid, Args: map[string]any{"name": clip(name)}})
		}
		return tid
	}
	for i := range evs {
		ev := &evs[i]
		switch ev.Ph {
		case "X":
			d := micros(ev.Dur)
			var args map[string]any
			if len(ev.Args) > 0 && len(ev.Args) < 4096 {
				json.Unmarshal(ev.Args, &args)
			}
			e.add(&event{Name: clip(ev.Name), Cat: clip(ev.Cat), Ph: "X", Ts: micros(ev.Ts + shift), Dur: &d, Pid: pidWorker, Tid: tidOf(ev), Args: args})
		case "i", "I":
			e.add(&event{Name: clip(ev.Name), Cat: clip(ev.Cat), Ph: "i", S: "t", Ts: micros(ev.Ts + shift), Pid: pidWorker, Tid: tidOf(ev)})
		}
	}
	if w.dropped > 0 {
		e.dropped += w.dropped
	}
	if len(w.activities) > 0 {
		e.add(&event{Name: "profiler activities", Ph: "i", S: "p", Ts: inferStart, Pid: pidWorker, Tid: 0,
			Args: map[string]any{"activities": slices.Clone(w.activities)}})
	}
	return aligned
}
