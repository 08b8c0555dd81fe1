package triton

import (
	"time"

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

// StatsResponse is the statistics extension's response.
type StatsResponse struct {
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
	Success       DurationStat `json:"success"`
	Fail          DurationStat `json:"fail"`
	Queue         DurationStat `json:"queue"`
	ComputeInput  DurationStat `json:"compute_input"`
	ComputeInfer  DurationStat `json:"compute_infer"`
	ComputeOutput DurationStat `json:"compute_output"`
	CacheHit      DurationStat `json:"cache_hit"`
	CacheMiss     DurationStat `json:"cache_miss"`
}

// batchStats is Triton's InferBatchStatistics: the steps of one batch
// size.
type batchStats struct {
	BatchSize     uint64       `json:"batch_size"`
	ComputeInput  DurationStat `json:"compute_input"`
	ComputeInfer  DurationStat `json:"compute_infer"`
	ComputeOutput DurationStat `json:"compute_output"`
}

// DurationStat is Triton's StatisticDuration: a count, and the total time
// in nanoseconds.
type DurationStat struct {
	Count uint64 `json:"count"`
	Ns    uint64 `json:"ns"`
}

func durationOf(count int64, total time.Duration) DurationStat {
	return DurationStat{Count: uint64(max(count, 0)), Ns: uint64(max(total, 0))}
}

// TritonStats is the statistics of models, in the order given, as Triton
// reports them.
func TritonStats(ms ...*serving.Model) StatsResponse {
	out := StatsResponse{ModelStats: make([]modelStats, 0, len(ms))}
	for _, m := range ms {
		out.ModelStats = append(out.ModelStats, tritonModelStats(m))
	}
	return out
}

func tritonModelStats(m *serving.Model) modelStats {
	st := m.Statistics()
	d := func(x serving.Duration) DurationStat { return durationOf(x.Count, x.Total) }
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
