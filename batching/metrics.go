package batching

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the batchers' metrics, shared by every model's batcher and
// registered once.
type Metrics struct {
	queueDuration *prometheus.HistogramVec
	queueDepth    *prometheus.GaugeVec
	deferrals     *prometheus.CounterVec
}

// NewMetrics registers the batching metrics on reg (nil registers none).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		queueDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stepserve_queue_duration_seconds",
			Help:    "Time a request waited in the batcher's queue before its batch ran.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"model"}),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stepserve_queue_depth",
			Help: "Requests waiting in the batcher's queue.",
		}, []string{"model"}),
		deferrals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepserve_batch_token_deferrals_total",
			Help: "Requests that batching.max_batch_tokens kept out of the batch being formed: each started a later batch rather than pad that one to its length.",
		}, []string{"model"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.queueDuration, m.queueDepth, m.deferrals} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// Forget deletes a model's series, when it is unloaded.
func (m *Metrics) Forget(model string) {
	if m == nil {
		return
	}
	m.queueDuration.DeleteLabelValues(model)
	m.queueDepth.DeleteLabelValues(model)
	m.deferrals.DeleteLabelValues(model)
}

// modelMetrics is one model's children, resolved once; nil records nothing.
type modelMetrics struct {
	queueDuration prometheus.Observer
	queueDepth    prometheus.Gauge
	deferrals     prometheus.Counter
}

func (m *Metrics) forModel(model string) *modelMetrics {
	if m == nil {
		return nil
	}
	return &modelMetrics{
		queueDuration: m.queueDuration.WithLabelValues(model),
		queueDepth:    m.queueDepth.WithLabelValues(model),
		deferrals:     m.deferrals.WithLabelValues(model),
	}
}

func (m *modelMetrics) depth(n int) {
	if m != nil {
		m.queueDepth.Set(float64(n))
	}
}

func (m *modelMetrics) queued(d time.Duration) {
	if m != nil {
		m.queueDuration.Observe(d.Seconds())
	}
}

func (m *modelMetrics) deferred() {
	if m != nil {
		m.deferrals.Inc()
	}
}
