package serving

import (
	"sync"
	"time"

	"github.com/stepserve/stepserve/generation"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// metrics are the live set's own series: how long loads take, failovers,
// and readiness (collected from the set at scrape time).
type metrics struct {
	loadDuration *prometheus.GaugeVec
	failovers    *prometheus.CounterVec
	gen          genMetrics
}

// genMetrics are the language models' series.
type genMetrics struct {
	ttft, tpot, duration, batch  *prometheus.HistogramVec
	prompt, generated, preempted *prometheus.CounterVec
	prefixQueried, prefixHits    *prometheus.CounterVec
	drafted, accepted            *prometheus.CounterVec
	seqs, blocks                 *prometheus.GaugeVec
	vllm                         *vllmMetrics // the same under vLLM's names; nil when they are off
	// state guards the scheduler's state gauges (seqs, blocks and their
	// vLLM names): a step sets them together and a scrape reads them
	// together, so one scrape never shows two steps.
	state *sync.RWMutex
}

// genSeries are one language model's.
type genSeries struct {
	ttft, tpot, duration, batch              prometheus.Observer
	promptTokens, generated, preempted       prometheus.Counter
	prefixQueried, prefixHits                prometheus.Counter
	drafted, accepted                        prometheus.Counter
	running, waiting, blocksUsed, blocksFree prometheus.Gauge
	vllm                                     *vllmSeries // nil when vLLM's names are off
	state                                    *sync.RWMutex
}

// The observations both names take.

func (s *genSeries) firstToken(seconds float64) {
	s.ttft.Observe(seconds)
	if s.vllm != nil {
		s.vllm.ttft.Observe(seconds)
	}
}

func (s *genSeries) generatedToken() {
	s.generated.Inc()
	if s.vllm != nil {
		s.vllm.outputs.Inc()
	}
}

func (s *genSeries) admitted(promptTokens int) {
	s.promptTokens.Add(float64(promptTokens))
	if s.vllm != nil {
		s.vllm.prompt.Add(float64(promptTokens))
	}
}

func (s *genSeries) ended(seconds float64, tpot float64, tokens int) {
	s.duration.Observe(seconds)
	if tokens > 1 {
		s.tpot.Observe(tpot)
	}
	if s.vllm != nil {
		s.vllm.e2e.Observe(seconds)
		if tokens > 1 {
			s.vllm.tpot.Observe(tpot)
		}
	}
}

// latencyBuckets span a token's few milliseconds to a long generation's
// minutes.
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

func newGenMetrics() genMetrics {
	hist := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, append([]string{"model"}, labels...))
	}
	count := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"model"})
	}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"model", "state"})
	}
	return genMetrics{
		state: &sync.RWMutex{},
		ttft: hist("stepserve_generation_time_to_first_token_seconds",
			"Time from a generation's arrival to its first token (queueing and prefill).", latencyBuckets),
		tpot: hist("stepserve_generation_time_per_output_token_seconds",
			"A generation's mean time between two tokens after the first (its inter-token latency).", latencyBuckets),
		duration: hist("stepserve_generation_request_duration_seconds",
			"A generation's time from arrival to its end.", latencyBuckets),
		batch: hist("stepserve_generation_step_sequences",
			"Sequences each step of a language model computed (decodes and prompt chunks).", []float64{1, 2, 4, 8, 16, 32, 64, 128, 256}),
		prompt:    count("stepserve_generation_prompt_tokens_total", "Prompt tokens of the generations admitted."),
		generated: count("stepserve_generation_generated_tokens_total", "Tokens generated."),
		preempted: count("stepserve_generation_preemptions_total",
			"Running sequences sent back to wait because the KV cache ran out of blocks (recomputed later, their output unchanged)."),
		prefixQueried: count("stepserve_generation_prefix_cache_queried_tokens_total",
			"Tokens of the sequences admitted to a step (prompt, and the output of a preempted one), each looked up in the prefix cache."),
		prefixHits: count("stepserve_generation_prefix_cache_hit_tokens_total",
			"Of those, the tokens the prefix cache held: computed before, shared, not computed again."),
		drafted: count("stepserve_generation_draft_tokens_total",
			"Tokens drafted by prompt lookup (generation.speculative) and computed in a decode step to be verified."),
		accepted: count("stepserve_generation_draft_accepted_tokens_total",
			"Of those, the tokens the model drew too: kept without a step of their own (the acceptance rate is this over the drafted)."),
		seqs:   gauge("stepserve_generation_sequences", "A language model's sequences by state: running (in the batch) or waiting."),
		blocks: gauge("stepserve_generation_kv_cache_blocks", "A language model's KV cache blocks by state: used or free."),
	}
}

func (g *genMetrics) collectors() []prometheus.Collector {
	out := []prometheus.Collector{g.ttft, g.tpot, g.duration, g.batch, g.prompt, g.generated, g.preempted, g.prefixQueried, g.prefixHits,
		g.drafted, g.accepted}
	state := lockedCollectors{mu: g.state, cs: []prometheus.Collector{g.seqs, g.blocks}}
	if g.vllm != nil {
		out = append(out, g.vllm.counters()...)
		state.cs = append(state.cs, g.vllm.state()...)
	}
	return append(out, state)
}

// lockedCollectors collect cs together under mu's read lock.
type lockedCollectors struct {
	mu *sync.RWMutex
	cs []prometheus.Collector
}

func (l lockedCollectors) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range l.cs {
		c.Describe(ch)
	}
}

// DeletePartialMatch deletes the series matching labels from each.
func (l lockedCollectors) DeletePartialMatch(labels prometheus.Labels) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.cs {
		n += c.(interface {
			DeletePartialMatch(prometheus.Labels) int
		}).DeletePartialMatch(labels)
	}
	return n
}

// Collect sends each series as its value was under the lock: a gauge
// sent as it is would be read by the registry after the lock is let go.
func (l lockedCollectors) Collect(ch chan<- prometheus.Metric) {
	inner := make(chan prometheus.Metric, 64)
	go func() {
		for _, c := range l.cs {
			c.Collect(inner)
		}
		close(inner)
	}()
	var frozen []prometheus.Metric
	l.mu.RLock()
	for m := range inner {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			frozen = append(frozen, prometheus.NewInvalidMetric(m.Desc(), err))
			continue
		}
		frozen = append(frozen, frozenMetric{m.Desc(), &pb})
	}
	l.mu.RUnlock()
	for _, m := range frozen {
		ch <- m
	}
}

// frozenMetric is a series' value read at one moment.
type frozenMetric struct {
	desc *prometheus.Desc
	pb   *dto.Metric
}

func (f frozenMetric) Desc() *prometheus.Desc { return f.desc }

func (f frozenMetric) Write(out *dto.Metric) error {
	out.Label, out.Gauge, out.Counter, out.Untyped = f.pb.Label, f.pb.Gauge, f.pb.Counter, f.pb.Untyped
	out.Summary, out.Histogram, out.TimestampMs = f.pb.Summary, f.pb.Histogram, f.pb.TimestampMs
	return nil
}

// generation is model's series, created at zero so that alerts see them
// before the first generation; its KV cache has blocks of blockSize.
func (m *metrics) generation(model string, blockSize, blocks int) *genSeries {
	g := &m.gen
	s := &genSeries{
		ttft: g.ttft.WithLabelValues(model), tpot: g.tpot.WithLabelValues(model), duration: g.duration.WithLabelValues(model),
		batch: g.batch.WithLabelValues(model), promptTokens: g.prompt.WithLabelValues(model), generated: g.generated.WithLabelValues(model),
		preempted: g.preempted.WithLabelValues(model), prefixQueried: g.prefixQueried.WithLabelValues(model), prefixHits: g.prefixHits.WithLabelValues(model),
		drafted: g.drafted.WithLabelValues(model), accepted: g.accepted.WithLabelValues(model), running: g.seqs.WithLabelValues(model, "running"), waiting: g.seqs.WithLabelValues(model, "waiting"),
		blocksUsed: g.blocks.WithLabelValues(model, "used"), blocksFree: g.blocks.WithLabelValues(model, "free"), state: g.state,
	}
	if g.vllm != nil {
		v := g.vllm.series(model, blockSize, blocks)
		s.vllm = &v
	}
	return s
}

// observe records a step of the model's loop, and its scheduler's state.
func (s *genSeries) observe(step *generation.Step, _ time.Duration, st generation.State) {
	if n := len(step.Work); n > 0 {
		s.batch.Observe(float64(n))
	}
	if n := len(step.Preempted); n > 0 {
		s.preempted.Add(float64(n))
	}
	if step.PrefillTokens > 0 {
		s.prefixQueried.Add(float64(step.PrefillTokens))
		s.prefixHits.Add(float64(step.CachedTokens))
	}
	if step.DraftTokens > 0 {
		s.drafted.Add(float64(step.DraftTokens))
		s.accepted.Add(float64(step.AcceptedTokens))
		if v := s.vllm; v != nil {
			drafts := 0
			for _, w := range step.Work {
				if len(w.Draft) > 0 {
					drafts++
				}
			}
			v.drafts.Add(float64(drafts))
			v.draftTokens.Add(float64(step.DraftTokens))
			v.accepted.Add(float64(step.AcceptedTokens))
		}
	}
	used := st.BlocksTotal - st.BlocksFree
	s.state.Lock()
	defer s.state.Unlock()
	s.running.Set(float64(st.Running))
	s.waiting.Set(float64(st.Waiting))
	s.blocksUsed.Set(float64(used))
	s.blocksFree.Set(float64(st.BlocksFree))
	if v := s.vllm; v != nil {
		if step.PrefillTokens > 0 {
			v.prefixQueries.Add(float64(step.PrefillTokens))
			v.prefixHits.Add(float64(step.CachedTokens))
		}
		v.running.Set(float64(st.Running))
		v.waiting.Set(float64(st.Waiting))
		if st.BlocksTotal > 0 {
			v.kvUsage.Set(float64(used) / float64(st.BlocksTotal))
		}
	}
}

func newMetrics(reg prometheus.Registerer, set *Set, vllm bool) (*metrics, error) {
	m := &metrics{
		loadDuration: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stepserve_model_load_duration_seconds",
			Help: "How long the model's last load took, warm-up included.",
		}, []string{"model"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepserve_engine_failovers_total",
			Help: "Times a model's steps moved from its engine to the fallback engine because the device was unavailable.",
		}, []string{"model", "from", "to"}),
		gen: newGenMetrics(),
	}
	if vllm {
		m.gen.vllm = newVLLMMetrics()
	}
	if reg != nil {
		for _, c := range append([]prometheus.Collector{m.loadDuration, m.failovers, &readyCollector{set: set, desc: readyDesc},
			&replicasCollector{set: set}, &adviceCollector{set: set}}, m.gen.collectors()...) {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *metrics) loaded(model string, d time.Duration) {
	m.loadDuration.WithLabelValues(model).Set(d.Seconds())
}

// addFailover creates a model's failover series at zero, so that alerts
// see it before the first failover.
func (m *metrics) addFailover(model, from, to string) prometheus.Counter {
	return m.failovers.WithLabelValues(model, from, to)
}

func (m *metrics) forget(model string) {
	m.loadDuration.DeleteLabelValues(model)
	m.failovers.DeletePartialMatch(prometheus.Labels{"model": model})
	g := m.gen
	g.vllm = nil // its series go by model_name
	for _, c := range g.collectors() {
		c.(interface {
			DeletePartialMatch(prometheus.Labels) int
		}).DeletePartialMatch(prometheus.Labels{"model": model})
	}
	if m.gen.vllm != nil {
		m.gen.vllm.forget(model)
	}
}

var readyDesc = prometheus.NewDesc("stepserve_model_ready",
	"1 when the model takes requests (loaded, warmed up, its device up or failed over), 0 when it does not.",
	[]string{"model", "engine"}, nil)

// readyCollector exports stepserve_model_ready from every served model's
// readiness at scrape time, so the gauge can never disagree with
// /v2/health/ready (a worker dying flips both at once), and an unloaded
// model's series is gone with it.
type readyCollector struct {
	set  *Set
	desc *prometheus.Desc
}

func (c *readyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *readyCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.set.Models() {
		v := 0.0
		if m.Ready() {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, m.model.Name, m.engine)
	}
}

var (
	replicasDesc = prometheus.NewDesc("stepserve_model_replicas",
		"Replicas the model is loaded as on its engine (model.yaml's instances: devices x per_device).",
		[]string{"model", "engine"}, nil)
	replicasHealthyDesc = prometheus.NewDesc("stepserve_model_replicas_healthy",
		"Replicas of the model whose device is up now; the model is ready with at least instances.min_ready of them (or a failover engine).",
		[]string{"model", "engine"}, nil)
)

// replicasCollector exports every served model's replicas and how many are
// healthy, at scrape time, as readyCollector does readiness.
type replicasCollector struct{ set *Set }

func (c *replicasCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- replicasDesc
	ch <- replicasHealthyDesc
}

func (c *replicasCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.set.Models() {
		total, healthy := m.Backend().Replicas()
		ch <- prometheus.MustNewConstMetric(replicasDesc, prometheus.GaugeValue, float64(total), m.model.Name, m.engine)
		ch <- prometheus.MustNewConstMetric(replicasHealthyDesc, prometheus.GaugeValue, float64(healthy), m.model.Name, m.engine)
	}
}

var bucketWorkDesc = prometheus.NewDesc("stepserve_bucket_padding_work_ratio",
	"Fraction of the device work that is padding on the model's recent steps (decayed, half-life 1h): lists=\"current\" with its bucket lists, lists=\"advised\" with the lists GET /v2/models/{model}/buckets/advice gives for as many programs. Absent until the model has served a step.",
	[]string{"model", "lists"}, nil)

// adviceCollector exports, at scrape time, the padding of every model's
// recorded traffic with its current buckets and with the advised ones of
// the same program count: the gap between the two is what applying the
// advice would save.
type adviceCollector struct{ set *Set }

func (c *adviceCollector) Describe(ch chan<- *prometheus.Desc) { ch <- bucketWorkDesc }

func (c *adviceCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.set.Models() {
		a, err := m.Advise(len(m.Backend().Stats()))
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(bucketWorkDesc, prometheus.GaugeValue, a.PaddingNow, m.model.Name, "current")
		ch <- prometheus.MustNewConstMetric(bucketWorkDesc, prometheus.GaugeValue, a.PaddingAdvised, m.model.Name, "advised")
	}
}
