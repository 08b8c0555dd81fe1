package core

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// OutcomeLabels are the requests_total outcome labels, created at zero for every
// model so that rate() and alerts see them before the first event.
var OutcomeLabels = [...]string{"success", "rejected", "timeout", "cancelled", "invalid", "error"}

// The protocol label of the request metrics: the index of each in
// protocolLabels.
const (
	ProtocolHTTP = iota
	ProtocolGRPC
	ProtocolOpenAI    // OpenAI's API (server/openai)
	ProtocolTEI       // TEI's API (server/tei)
	ProtocolAnthropic // Anthropic's Messages API (server/anthropic)
	ProtocolTGI       // Hugging Face text-generation-inference's API (server/tgi)
)

var ProtocolLabels = [...]string{"http", "grpc", "openai", "tei", "anthropic", "tgi"}

type Metrics struct {
	Requests *prometheus.CounterVec
	duration *prometheus.HistogramVec

	// models holds each served model's series, resolved when it is added:
	// a request answered after its model was unloaded is not counted, so
	// that it never brings the deleted series back.
	mu     sync.RWMutex
	models map[string]*modelMetrics
	// served says which protocols are served: a model's series are
	// created, at zero, for those only.
	served [len(ProtocolLabels)]bool
}

// modelMetrics are one model's series, per protocol; nil for a protocol
// not served.
type modelMetrics struct {
	outcomes [len(ProtocolLabels)][len(OutcomeLabels)]prometheus.Counter
	duration [len(ProtocolLabels)]prometheus.Observer
}

func NewMetrics(reg prometheus.Registerer, b *Budget) (*Metrics, error) {
	m := &Metrics{
		models: map[string]*modelMetrics{},
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepserve_requests_total",
			Help: "Inference requests answered, by model, outcome and protocol (http, grpc, openai, tei, anthropic, tgi).",
		}, []string{"model", "outcome", "protocol"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stepserve_request_duration_seconds",
			Help:    "Time from receiving an inference request to answering it, by model and protocol (http, grpc, openai, tei, anthropic, tgi).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"model", "protocol"}),
	}
	m.served[ProtocolHTTP] = true
	inflight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "stepserve_inflight_bytes",
		Help: "Memory the requests in flight hold of the in-flight budget: bodies, tensors, outputs and responses not yet written, as bounded from their shapes.",
	}, func() float64 { return float64(b.used.Load()) })
	limit := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "stepserve_inflight_bytes_limit",
		Help: "The in-flight budget (server.max_inflight_bytes): requests that find it spent wait briefly, then get 503.",
	}, func() float64 { return float64(b.limit) })
	if reg != nil {
		for _, c := range []prometheus.Collector{m.Requests, m.duration, inflight, limit} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *Metrics) AddModel(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mm := &modelMetrics{}
	for p, served := range m.served {
		if served {
			m.addSeries(mm, name, p)
		}
	}
	m.models[name] = mm
}

// addSeries creates a model's series for protocol p.
func (m *Metrics) addSeries(mm *modelMetrics, name string, p int) {
	mm.duration[p] = m.duration.WithLabelValues(name, ProtocolLabels[p])
	for i, o := range OutcomeLabels {
		mm.outcomes[p][i] = m.Requests.WithLabelValues(name, o, ProtocolLabels[p])
	}
}

// Serve adds protocol p to those served, with its series for every model.
func (m *Metrics) Serve(p int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.served[p] {
		return
	}
	m.served[p] = true
	for name, mm := range m.models {
		m.addSeries(mm, name, p)
	}
}

func (m *Metrics) forget(name string) {
	m.mu.Lock()
	delete(m.models, name)
	m.mu.Unlock()
	m.Requests.DeletePartialMatch(prometheus.Labels{"model": name})
	m.duration.DeletePartialMatch(prometheus.Labels{"model": name})
}

func (m *Metrics) Observe(protocol int, model string, status int, d time.Duration) {
	m.mu.RLock()
	mm := m.models[model]
	m.mu.RUnlock()
	if mm == nil || mm.duration[protocol] == nil {
		return // unloaded meanwhile
	}
	mm.outcomes[protocol][outcomeIndex(status)].Inc()
	mm.duration[protocol].Observe(d.Seconds())
}
