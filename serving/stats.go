package serving

import (
	"slices"
	"sync"
	"time"

	"github.com/stepserve/stepserve/steps"
)

// Statistics are a model's inference statistics since it was loaded, in
// the terms of Triton's statistics extension. Every figure is measured;
// see [Model.Report] for what each request adds.
type Statistics struct {
	// LastInference is when the last request the protocols reported was
	// answered; zero before the first.
	LastInference time.Time
	// InferenceCount counts the rows of the successful requests.
	InferenceCount int64
	// ExecutionCount counts the steps that succeeded (on the failover
	// engine too); a step runs the rows of one or more requests.
	ExecutionCount int64
	// Success and Fail are the requests answered and their time, from
	// when the protocol had read the request to when its answer was
	// written.
	Success, Fail Duration
	// Queue is the successful requests' time waiting for their first
	// step; ComputeInput, ComputeInfer and ComputeOutput their steps'
	// packing, engine step and unpacking (a step's whole time for every
	// request in it, every step of a request that took several).
	Queue, ComputeInput, ComputeInfer, ComputeOutput Duration
	// Batches are the successful steps by batch size (rows, padding not
	// counted), smallest first.
	Batches []steps.Execution
}

// Duration is a count of events and their total time.
type Duration struct {
	Count int64
	Total time.Duration
}

func (d *Duration) add(t time.Duration) {
	d.Count++
	d.Total += t
}

// requestStats are what the protocols report of a model's requests.
type requestStats struct {
	mu                    sync.Mutex
	last                  time.Time
	inferences            int64
	success, fail         Duration
	queue, in, infer, out Duration
}

// Report records a request the model was asked to serve, as the protocol
// that answered it saw it: whether it succeeded, and took, how long it
// took from when its body had been read to when its answer was written.
// res is the request's result ([Model.Infer]), when it got that far; a
// successful request's rows, queue time and step times come from it. Every protocol reports each request it looked up the
// model for exactly once.
func (m *Model) Report(res *Result, ok bool, took time.Duration) {
	var r *steps.Request
	if res != nil {
		r = res.step
	}
	now := time.Now()
	s := &m.requests
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = now
	switch {
	case ok && r == nil && m.gen != nil: // a generation: no step of its own
		s.success.add(took)
		s.inferences++
		return
	case !ok || r == nil:
		s.fail.add(took)
		return
	}
	s.success.add(took)
	s.inferences += int64(r.Rows)
	s.queue.add(r.Queued)
	s.in.add(r.Compute.Input)
	s.infer.add(r.Compute.Infer)
	s.out.add(r.Compute.Output)
}

// Statistics returns the model's statistics since it was loaded.
func (m *Model) Statistics() Statistics {
	s := &m.requests
	s.mu.Lock()
	st := Statistics{LastInference: s.last, InferenceCount: s.inferences,
		Success: s.success, Fail: s.fail, Queue: s.queue, ComputeInput: s.in, ComputeInfer: s.infer, ComputeOutput: s.out}
	s.mu.Unlock()
	if m.gen != nil {
		return st
	}
	st.Batches = m.runners[0].Executions() // shared by every replica's runner
	if m.fallback != nil {
		st.Batches = mergeExecutions(st.Batches, m.fallback.Executions())
	}
	for _, b := range st.Batches {
		st.ExecutionCount += b.Count
	}
	return st
}

// mergeExecutions adds b's batch sizes into a's, both smallest first.
func mergeExecutions(a, b []steps.Execution) []steps.Execution {
	for _, e := range b {
		i, found := slices.BinarySearchFunc(a, e.BatchSize, func(x steps.Execution, size int) int { return x.BatchSize - size })
		if !found {
			a = slices.Insert(a, i, e)
			continue
		}
		a[i].Count += e.Count
		a[i].Input += e.Input
		a[i].Infer += e.Infer
		a[i].Output += e.Output
	}
	return a
}
