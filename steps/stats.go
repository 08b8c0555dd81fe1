package steps

import (
	"slices"
	"sync"
	"time"

	"github.com/stepserve/stepserve/bucketing"
)

// statsWindow is how many recent latencies each bucket keeps for its
// quantiles.
const statsWindow = 1024

// BucketStats summarises one bucket's steps since load, for the stats
// endpoint. Latency quantiles cover the last 1024 samples.
type BucketStats struct {
	Bucket        string    `json:"bucket"`
	Steps         int64     `json:"steps"`
	Clean         int64     `json:"clean"`
	Overhead      int64     `json:"overhead"`
	Unmeasured    int64     `json:"unmeasured"`
	MeanBatchSize float64   `json:"mean_batch_size"`
	MeanPadding   float64   `json:"mean_padding_ratio"`
	QueueSeconds  Quantiles `json:"queue_seconds"`
	StepSeconds   Quantiles `json:"step_seconds"`
}

// Quantiles of a latency, in seconds; all zero with Count 0 when there is
// no sample.
type Quantiles struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
}

// ring is a fixed window of recent durations.
type ring struct {
	buf  [statsWindow]float64
	n, i int
}

func (r *ring) add(d time.Duration) {
	r.buf[r.i] = d.Seconds()
	r.i = (r.i + 1) % statsWindow
	r.n = min(r.n+1, statsWindow)
}

func (r *ring) quantiles() Quantiles {
	if r.n == 0 {
		return Quantiles{}
	}
	s := slices.Clone(r.buf[:r.n])
	slices.Sort(s)
	at := func(q float64) float64 { return s[min(int(q*float64(len(s))), len(s)-1)] }
	return Quantiles{Count: r.n, P50: at(0.5), P90: at(0.9), P99: at(0.99)}
}

type bucketStats struct {
	steps, clean int64
	unmeasured   int64
	rows         int64
	padding      float64
	queue, step  ring
}

// stats holds every bucket's running summary, and every batch size's; a
// step updates them without allocating.
type stats struct {
	mu      sync.Mutex
	labels  []string
	buckets []bucketStats
	execs   []execStats // by the rows of a step, 1..the largest bucket's
	// traffic is the steps' sizes before padding, for bucket advice;
	// advice its recent answers.
	traffic *bucketing.Traffic
	advice  adviceCache
}

type execStats struct {
	count                int64
	input, infer, output time.Duration
}

// Execution is what the successful steps of one batch size took since
// load, in the terms of Triton's batch statistics: Count steps, and the
// total time each part of them took.
type Execution struct {
	BatchSize int
	Count     int64
	// Input packing the rows into staging, Infer the engine's step,
	// Output unpacking.
	Input, Infer, Output time.Duration
}

// executed counts a successful step of rows rows.
func (s *stats) executed(rows int, c Compute) {
	s.mu.Lock()
	e := &s.execs[rows]
	e.count++
	e.input += c.Input
	e.infer += c.Infer
	e.output += c.Output
	s.mu.Unlock()
}

func (s *stats) executions() []Execution {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Execution
	for rows, e := range s.execs {
		if e.count > 0 {
			out = append(out, Execution{BatchSize: rows, Count: e.count, Input: e.input, Infer: e.infer, Output: e.output})
		}
	}
	return out
}

func (s *stats) observe(bucket int, o *Observation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := &s.buckets[bucket]
	b.steps++
	switch {
	case o.Verdict.Unmeasured:
		b.unmeasured++
	case o.Verdict.Clean:
		b.clean++
	}
	b.rows += int64(o.Rows)
	b.padding += o.Padding
	b.step.add(o.Duration)
}

func (s *stats) queued(bucket int, d time.Duration) {
	s.mu.Lock()
	s.buckets[bucket].queue.add(d)
	s.mu.Unlock()
}

func (s *stats) snapshot() []BucketStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]BucketStats, len(s.buckets))
	for i := range s.buckets {
		b := &s.buckets[i]
		out[i] = BucketStats{
			Bucket:       s.labels[i],
			Steps:        b.steps,
			Clean:        b.clean,
			Overhead:     b.steps - b.clean - b.unmeasured,
			Unmeasured:   b.unmeasured,
			QueueSeconds: b.queue.quantiles(),
			StepSeconds:  b.step.quantiles(),
		}
		if b.steps > 0 {
			out[i].MeanBatchSize = float64(b.rows) / float64(b.steps)
			out[i].MeanPadding = b.padding / float64(b.steps)
		}
	}
	return out
}
