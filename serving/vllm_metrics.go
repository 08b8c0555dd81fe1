package serving

// A language model's series under vLLM's names too (vllm:num_requests_
// waiting, ...), with vLLM's model_name label: what Kubernetes'
// inference gateway (GAIE's endpoint picker), llm-d, KServe's dashboards
// and autoscalers read from a model server. The same observations feed
// both names; Options.VLLMMetrics (server.vllm_metrics) turns these off.

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// vllmMetrics are the series under vLLM's names.
type vllmMetrics struct {
	waiting, running, kvUsage, cacheInfo       *prometheus.GaugeVec
	prefixQueries, prefixHits, prompt, outputs *prometheus.CounterVec
	drafts, draftTokens, accepted              *prometheus.CounterVec
	ttft, tpot, e2e                            *prometheus.HistogramVec
}

func newVLLMMetrics() *vllmMetrics {
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, append([]string{"model_name"}, labels...))
	}
	count := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"model_name"})
	}
	hist := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: latencyBuckets}, []string{"model_name"})
	}
	return &vllmMetrics{
		waiting:       gauge("vllm:num_requests_waiting", "Generations waiting to run (vLLM's name; stepserve_generation_sequences{state=\"waiting\"})."),
		running:       gauge("vllm:num_requests_running", "Generations running in the batch (vLLM's name; stepserve_generation_sequences{state=\"running\"})."),
		kvUsage:       gauge("vllm:kv_cache_usage_perc", "The KV cache's share in use, 0 to 1 (vLLM's name; stepserve_generation_kv_cache_blocks used of all)."),
		cacheInfo:     gauge("vllm:cache_config_info", "1, with the KV cache's block_size and num_gpu_blocks as labels (vLLM's name).", "block_size", "num_gpu_blocks"),
		prefixQueries: count("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache (vLLM's name)."),
		prefixHits:    count("vllm:prefix_cache_hits_total", "Prompt tokens the prefix cache held (vLLM's name)."),
		prompt:        count("vllm:prompt_tokens_total", "Prompt tokens of the generations admitted (vLLM's name)."),
		outputs:       count("vllm:generation_tokens_total", "Tokens generated (vLLM's name)."),
		drafts:        count("vllm:spec_decode_num_drafts_total", "Drafts made by speculative decoding, one a sequence a step (vLLM's name)."),
		draftTokens:   count("vllm:spec_decode_num_draft_tokens_total", "Tokens drafted (vLLM's name; stepserve_generation_draft_tokens_total)."),
		accepted:      count("vllm:spec_decode_num_accepted_tokens_total", "Drafted tokens accepted (vLLM's name; stepserve_generation_draft_accepted_tokens_total)."),
		ttft:          hist("vllm:time_to_first_token_seconds", "Time from a generation's arrival to its first token (vLLM's name)."),
		tpot:          hist("vllm:time_per_output_token_seconds", "A generation's mean time between two tokens after the first (vLLM's name)."),
		e2e:           hist("vllm:e2e_request_latency_seconds", "A generation's time from arrival to its end (vLLM's name)."),
	}
}

func (v *vllmMetrics) collectors() []prometheus.Collector {
	return append(v.state(), v.counters()...)
}

// state are the scheduler's state gauges, which a step sets together.
func (v *vllmMetrics) state() []prometheus.Collector {
	return []prometheus.Collector{v.waiting, v.running, v.kvUsage}
}

// counters are the rest.
func (v *vllmMetrics) counters() []prometheus.Collector {
	return []prometheus.Collector{v.cacheInfo, v.prefixQueries, v.prefixHits, v.prompt, v.outputs, v.drafts, v.draftTokens, v.accepted, v.ttft, v.tpot, v.e2e}
}

// series are model's, its cache's configuration set.
func (v *vllmMetrics) series(model string, blockSize, blocks int) vllmSeries {
	v.cacheInfo.WithLabelValues(model, strconv.Itoa(blockSize), strconv.Itoa(blocks)).Set(1)
	return vllmSeries{waiting: v.waiting.WithLabelValues(model), running: v.running.WithLabelValues(model), kvUsage: v.kvUsage.WithLabelValues(model),
		prefixQueries: v.prefixQueries.WithLabelValues(model), prefixHits: v.prefixHits.WithLabelValues(model), prompt: v.prompt.WithLabelValues(model),
		outputs: v.outputs.WithLabelValues(model), drafts: v.drafts.WithLabelValues(model), draftTokens: v.draftTokens.WithLabelValues(model),
		accepted: v.accepted.WithLabelValues(model), ttft: v.ttft.WithLabelValues(model), tpot: v.tpot.WithLabelValues(model), e2e: v.e2e.WithLabelValues(model)}
}

// forget deletes model's series.
func (v *vllmMetrics) forget(model string) {
	for _, c := range v.collectors() {
		c.(interface {
			DeletePartialMatch(prometheus.Labels) int
		}).DeletePartialMatch(prometheus.Labels{"model_name": model})
	}
}

// vllmSeries are one model's series under vLLM's names.
type vllmSeries struct {
	waiting, running, kvUsage                  prometheus.Gauge
	prefixQueries, prefixHits, prompt, outputs prometheus.Counter
	drafts, draftTokens, accepted              prometheus.Counter
	ttft, tpot, e2e                            prometheus.Observer
}
