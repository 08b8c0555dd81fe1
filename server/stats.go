package server

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/stepserve/stepserve/serving"
)

// Triton's statistics extension: GET /v2/models/stats (every model) and
// GET /v2/models/{model}[/versions/{version}]/stats answer
// {"model_stats": [...]}, one entry per model version, with the field
// names of Triton's JSON and of the gRPC ModelStatisticsResponse, which
// the gRPC endpoint fills from the same values (tritonStats).
//
// Every figure is measured (serving.Statistics says how). cache_hit and
// cache_miss are there because Triton's clients read them (perf_analyzer
// does, unconditionally): stepserve has no response cache, so both are
// truly zero, not unmeasured. stepserve's own per-bucket view (verdicts,
// padding, latency percentiles) is GET .../buckets.

// statsResponse is the statistics extension's response.
type statsResponse struct {
	ModelStats []modelStats `json:"model_stats"`
}

// modelStats is one model version's statistics (Triton's ModelStatistics).
type modelStats struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	// LastInference is in milliseconds since the epoch; 0 before the
	// first request.
	LastInference  uint64       `json:"last_inference"`
	InferenceCount uint64       `json:"inference_count"`
	ExecutionCount uint64       `json:"execution_count"`
	InferenceStats inferStats   `json:"inference_stats"`
	BatchStats     []batchStats `json:"batch_stats"`
}

// inferStats is Triton's InferStatistics.
type inferStats struct {
	Success       durationStat `json:"success"`
	Fail          durationStat `json:"fail"`
	Queue         durationStat `json:"queue"`
	ComputeInput  durationStat `json:"compute_input"`
	ComputeInfer  durationStat `json:"compute_infer"`
	ComputeOutput durationStat `json:"compute_output"`
	CacheHit      durationStat `json:"cache_hit"`
	CacheMiss     durationStat `json:"cache_miss"`
}

// batchStats is Triton's InferBatchStatistics: the steps of one batch
// size.
type batchStats struct {
	BatchSize     uint64       `json:"batch_size"`
	ComputeInput  durationStat `json:"compute_input"`
	ComputeInfer  durationStat `json:"compute_infer"`
	ComputeOutput durationStat `json:"compute_output"`
}

// durationStat is Triton's StatisticDuration: a count, and the total time
// in nanoseconds.
type durationStat struct {
	Count uint64 `json:"count"`
	Ns    uint64 `json:"ns"`
}

func durationOf(count int64, total time.Duration) durationStat {
	return durationStat{Count: uint64(max(count, 0)), Ns: uint64(max(total, 0))}
}

// tritonStats is the statistics of models, in the order given, as Triton
// reports them.
func tritonStats(ms ...*serving.Model) statsResponse {
	out := statsResponse{ModelStats: make([]modelStats, 0, len(ms))}
	for _, m := range ms {
		out.ModelStats = append(out.ModelStats, tritonModelStats(m))
	}
	return out
}

func tritonModelStats(m *serving.Model) modelStats {
	st := m.Statistics()
	d := func(x serving.Duration) durationStat { return durationOf(x.Count, x.Total) }
	ms := modelStats{
		Name:           m.Model().Name,
		Version:        m.Model().Version,
		InferenceCount: uint64(st.InferenceCount),
		ExecutionCount: uint64(st.ExecutionCount),
		InferenceStats: inferStats{
			Success: d(st.Success), Fail: d(st.Fail), Queue: d(st.Queue),
			ComputeInput: d(st.ComputeInput), ComputeInfer: d(st.ComputeInfer), ComputeOutput: d(st.ComputeOutput),
		},
		BatchStats: make([]batchStats, 0, len(st.Batches)),
	}
	if !st.LastInference.IsZero() {
		ms.LastInference = uint64(st.LastInference.UnixMilli())
	}
	for _, b := range st.Batches {
		ms.BatchStats = append(ms.BatchStats, batchStats{BatchSize: uint64(b.BatchSize),
			ComputeInput: durationOf(b.Count, b.Input), ComputeInfer: durationOf(b.Count, b.Infer), ComputeOutput: durationOf(b.Count, b.Output)})
	}
	return ms
}

// statsModels are the models a statistics request names: every model
// served, by name, when name is empty; otherwise the one named, at
// version when that is not empty.
func (s *Core) statsModels(name, version string) ([]*serving.Model, error) {
	if name == "" {
		return s.opts.Models.Models(), nil // in name order
	}
	m, err := s.lookupName(name, version)
	if err != nil {
		return nil, err
	}
	return []*serving.Model{m}, nil
}

// stats answers the statistics extension for the model the route names,
// or for every model (GET /v2/models/stats).
func (s *adminAPI) stats(r *http.Request) (any, error) {
	ms, err := s.statsModels(chi.URLParam(r, "model"), chi.URLParam(r, "version"))
	if err != nil {
		return nil, err
	}
	return tritonStats(ms...), nil
}

// buckets summarises the model's steps per bucket: stepserve's own view.
func (s *oipAPI) buckets(r *http.Request) (any, error) {
	m, err := s.lookup(r)
	if err != nil {
		return nil, err
	}
	b := m.Stats()
	if b == nil {
		b = []serving.BucketStats{}
	}
	return map[string]any{"name": m.Model().Name, "version": m.Model().Version, "buckets": b}, nil
}

// bucketAdvice is GET .../buckets/advice?max_buckets=K: the bucket lists
// of at most K programs (default: as many as the model has now) that would
// have padded the steps it served least, with the padding of the current
// lists and of the advised ones on the same steps, and the model.yaml
// block to paste.
func (s *oipAPI) bucketAdvice(r *http.Request) (any, error) {
	m, err := s.lookup(r)
	if err != nil {
		return nil, err
	}
	k := len(m.Stats())
	if q := r.URL.Query().Get("max_buckets"); q != "" {
		if k, err = strconv.Atoi(q); err != nil || k < 1 || k > 4096 {
			return nil, badRequest(fmt.Sprintf("max_buckets: %q; want an integer in 1..4096, the most buckets (compiled programs) the advice may use", q))
		}
	}
	a, err := m.Advise(k)
	if err != nil {
		if errors.Is(err, serving.ErrNoTraffic) {
			return nil, &apiError{http.StatusConflict, fmt.Sprintf("model %s: %v", m.Model().Name, err)}
		}
		return nil, badRequest(err.Error())
	}
	return map[string]any{"name": m.Model().Name, "version": m.Model().Version, "max_buckets": k, "advice": a}, nil
}
