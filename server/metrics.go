package server

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// outcomeLabels are the requests_total outcome labels, created at zero for every
// model so that rate() and alerts see them before the first event.
var outcomeLabels = [...]string{"success", "rejected", "timeout", "cancelled", "invalid", "error"}

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec

	// models holds each served model's series, resolved when it is added:
	// a request answered after its model was unloaded is not counted, so
	// that it never brings the deleted series back.
	mu     sync.RWMutex
	models map[string]*modelMetrics
}

type modelMetrics struct {
	outcomes [len(outcomeLabels)]prometheus.Counter
	duration prometheus.Observer
}

func newMetrics(reg prometheus.Registerer, b *budget) (*metrics, error) {
	m := &metrics{
		models: map[string]*modelMetrics{},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepserve_requests_total",
			Help: "Inference requests answered, by model and outcome.",
		}, []string{"model", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stepserve_request_duration_seconds",
			Help:    "Time from receiving an inference request to answering it.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"model"}),
	}
	inflight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "stepserve_inflight_bytes",
		Help: "Memory the requests in flight hold of the in-flight budget: bodies, tensors, outputs and responses not yet written, as bounded from their shapes.",
	}, func() float64 { return float64(b.used.Load()) })
	limit := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "stepserve_inflight_bytes_limit",
		Help: "The in-flight budget (server.max_inflight_bytes): requests that find it spent wait briefly, then get 503.",
	}, func() float64 { return float64(b.limit) })
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.duration, inflight, limit} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *metrics) addModel(name string) {
	mm := &modelMetrics{duration: m.duration.WithLabelValues(name)}
	for i, o := range outcomeLabels {
		mm.outcomes[i] = m.requests.WithLabelValues(name, o)
	}
	m.mu.Lock()
	m.models[name] = mm
	m.mu.Unlock()
}

func (m *metrics) forget(name string) {
	m.mu.Lock()
	delete(m.models, name)
	m.mu.Unlock()
	m.requests.DeletePartialMatch(prometheus.Labels{"model": name})
	m.duration.DeleteLabelValues(name)
}

func (m *metrics) observe(model string, status int, d time.Duration) {
	m.mu.RLock()
	mm := m.models[model]
	m.mu.RUnlock()
	if mm == nil {
		return // unloaded meanwhile
	}
	mm.outcomes[outcomeIndex(status)].Inc()
	mm.duration.Observe(d.Seconds())
}
