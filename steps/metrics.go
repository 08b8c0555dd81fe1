package steps

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
)

// Metrics are the step metrics of every model, registered once.
type Metrics struct {
	batchSize       *prometheus.HistogramVec
	padding         *prometheus.HistogramVec
	stepDuration    *prometheus.HistogramVec
	deviceDuration  *prometheus.HistogramVec
	steps           *prometheus.CounterVec
	signals         *prometheus.CounterVec
	hostBounceBytes *prometheus.CounterVec
	transfers       *prometheus.CounterVec
	compileDuration *prometheus.GaugeVec
	deviceSteps     *prometheus.CounterVec
}

// NewMetrics registers the step metrics on reg (nil registers none).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	bucketLabels := []string{"model", "bucket", "engine"}
	m := &Metrics{
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stepserve_batch_size",
			Help:    "Rows per step, before padding to the bucket.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}, []string{"model"}),
		padding: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stepserve_padding_ratio",
			Help:    "Padded elements over bucket elements (rows x sequence positions), per step.",
			Buckets: []float64{0, .1, .25, .5, .75, .9},
		}, []string{"model", "bucket"}),
		stepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stepserve_step_duration_seconds",
			Help:    "Time of one step: copy in, the compiled graph, copy out.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, bucketLabels),
		deviceDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "stepserve_step_device_seconds",
			Help:    "Time of one step's body where the engine measures it apart from the host's work: a worker's step body (copy in, graph, copy out, inside the worker), the CPU engine's compute. Absent where not measured; the step duration less this is host overhead.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, bucketLabels),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepserve_steps_total",
			Help: "Steps run, by explain verdict: clean (no signal, exactly one copy each way); overhead when any signal fired; unmeasured when the engine could not run explain or count the step's copies.",
		}, append(bucketLabels, "verdict")),
		signals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepserve_step_signals_total",
			Help: "Explain signals seen in steps: cpu_fallback, recompile, host_bounce, v2v_slow, extra_h2d, extra_d2h, missing_h2d, missing_d2h.",
		}, append(bucketLabels, "signal")),
		hostBounceBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepserve_host_bounce_bytes_total",
			Help: "Bytes moved by hidden host round trips inside steps.",
		}, bucketLabels),
		transfers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepserve_transfers_total",
			Help: "Host-device transfers performed by steps, by direction.",
		}, append(bucketLabels, "direction")),
		compileDuration: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stepserve_bucket_compile_duration_seconds",
			Help: "How long the bucket's program took to compile at load, its first warm-up run included (torch.compile builds the graph then).",
		}, bucketLabels),
		deviceSteps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepserve_device_steps_total",
			Help: "Steps run per device the model is loaded on (model.yaml's instances): how the batches spread over its replicas.",
		}, []string{"model", "engine", "device"}),
	}
	if reg != nil {
		for _, c := range m.collectors() {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.batchSize, m.padding, m.stepDuration, m.deviceDuration, m.steps, m.signals,
		m.hostBounceBytes, m.transfers, m.compileDuration, m.deviceSteps}
}

// Forget deletes every series of model, when it is unloaded.
func (m *Metrics) Forget(model string) {
	if m == nil {
		return
	}
	for _, c := range m.collectors() {
		c.(interface {
			DeletePartialMatch(prometheus.Labels) int
		}).DeletePartialMatch(prometheus.Labels{"model": model})
	}
}

// bucketMetrics are one bucket's children, resolved at start so that a step
// records without label lookups.
type bucketMetrics struct {
	padding               prometheus.Observer
	duration              prometheus.Observer
	device                *lazyObserver
	clean, overhead       prometheus.Counter
	unmeasured            prometheus.Counter
	signals               [numSignals]prometheus.Counter
	bounceBytes, h2d, d2h prometheus.Counter
	compile               prometheus.Gauge
}

type runnerMetrics struct {
	batchSize prometheus.Observer
	buckets   []bucketMetrics
	// device counts the steps on the runner's device; nil when it has
	// none.
	device prometheus.Counter
}

func (m *Metrics) forRunner(model, engine, device string, shapes []bucketing.Shape) *runnerMetrics {
	if m == nil {
		return nil
	}
	r := &runnerMetrics{batchSize: m.batchSize.WithLabelValues(model)}
	if device != "" {
		r.device = m.deviceSteps.WithLabelValues(model, engine, device)
	}
	for _, s := range shapes {
		l := s.Label()
		b := bucketMetrics{
			padding:     m.padding.WithLabelValues(model, l),
			duration:    m.stepDuration.WithLabelValues(model, l, engine),
			device:      &lazyObserver{vec: m.deviceDuration, labels: [3]string{model, l, engine}},
			clean:       m.steps.WithLabelValues(model, l, engine, "clean"),
			overhead:    m.steps.WithLabelValues(model, l, engine, "overhead"),
			unmeasured:  m.steps.WithLabelValues(model, l, engine, "unmeasured"),
			bounceBytes: m.hostBounceBytes.WithLabelValues(model, l, engine),
			h2d:         m.transfers.WithLabelValues(model, l, engine, "h2d"),
			d2h:         m.transfers.WithLabelValues(model, l, engine, "d2h"),
			compile:     m.compileDuration.WithLabelValues(model, l, engine),
		}
		for _, sig := range Signals() {
			b.signals[sig] = m.signals.WithLabelValues(model, l, engine, sig.String())
		}
		r.buckets = append(r.buckets, b)
	}
	return r
}

// forDevice is r for a sibling runner on device: the same series, but its
// own device's step count.
func (r *runnerMetrics) forDevice(m *Metrics, model, engine, device string) *runnerMetrics {
	if r == nil {
		return nil
	}
	s := *r
	s.device = nil
	if device != "" {
		s.device = m.deviceSteps.WithLabelValues(model, engine, device)
	}
	return &s
}

func (r *runnerMetrics) observe(bucket int, o *Observation) {
	if r == nil {
		return
	}
	b := &r.buckets[bucket]
	r.batchSize.Observe(float64(o.Rows))
	if r.device != nil {
		r.device.Inc()
	}
	b.padding.Observe(o.Padding)
	b.duration.Observe(o.Duration.Seconds())
	if ns := o.Explain.DeviceNS; ns.Known() {
		b.device.observe(float64(ns) / 1e9)
	}
	switch {
	case o.Verdict.Unmeasured:
		b.unmeasured.Inc()
	case o.Verdict.Clean:
		b.clean.Inc()
	default:
		b.overhead.Inc()
	}
	for s, n := range o.Verdict.Fired {
		if n > 0 {
			b.signals[s].Add(float64(n))
		}
	}
	if x := o.Explain; x.HostBounceBytes.Known() && x.HostBounceBytes > 0 {
		b.bounceBytes.Add(float64(x.HostBounceBytes))
	}
	if o.Explain.H2D.Known() {
		b.h2d.Add(float64(o.Explain.H2D))
	}
	if o.Explain.D2H.Known() {
		b.d2h.Add(float64(o.Explain.D2H))
	}
}

// explainLog keeps the last non-clean reports of one model.
type explainLog struct {
	mu      sync.Mutex
	records []Record
	next    int
	size    int
}

// Record is a non-clean step, for the explain endpoint.
type Record struct {
	Time    time.Time        `json:"time"`
	Bucket  string           `json:"bucket"`
	Rows    int              `json:"rows"`
	Explain any              `json:"explain"`
	Signals map[string]int64 `json:"signals"`
}

func (l *explainLog) add(o *Observation) {
	sig := make(map[string]int64)
	for s, n := range o.Verdict.Fired {
		if n > 0 {
			sig[Signal(s).String()] = n
		}
	}
	r := Record{Time: time.Now(), Bucket: o.Bucket.Label(), Rows: o.Rows, Explain: o.Explain, Signals: sig}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.records) < l.size {
		l.records = append(l.records, r)
		return
	}
	l.records[l.next] = r
	l.next = (l.next + 1) % l.size
}

// list returns the records, newest first.
func (l *explainLog) list() []Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Record, 0, len(l.records))
	for i := range l.records {
		j := (l.next - 1 - i + 2*len(l.records)) % len(l.records)
		out = append(out, l.records[j])
	}
	return out
}

// lazyObserver is a histogram's child resolved on its first observation:
// an engine that never measures a value exports no series for it, rather
// than an empty one that reads as measured.
type lazyObserver struct {
	vec    *prometheus.HistogramVec
	labels [3]string
	ready  atomic.Bool
	mu     sync.Mutex
	o      prometheus.Observer
}

func (l *lazyObserver) observe(v float64) {
	if !l.ready.Load() {
		l.mu.Lock()
		if l.o == nil {
			l.o = l.vec.WithLabelValues(l.labels[:]...)
		}
		l.ready.Store(true)
		l.mu.Unlock()
	}
	l.o.Observe(v)
}

// Recorder records, on the step series, steps a caller runs without a
// Runner: a language model's decode and prefill programs, which its
// generation loop packs and runs itself.
type Recorder struct{ r *runnerMetrics }

// Recorder is a recorder of model's steps on engine's device, over its
// buckets shapes; nil when m is.
func (m *Metrics) Recorder(model, engine, device string, shapes []bucketing.Shape) *Recorder {
	if m == nil {
		return nil
	}
	return &Recorder{r: m.forRunner(model, engine, device, shapes)}
}

// Observe records a step of bucket: rows real of the bucket's, padding
// the share of its elements that were padding, and its explain report;
// it returns the report's verdict.
func (r *Recorder) Observe(bucket, rows int, padding float64, d time.Duration, x engine.Explain) Verdict {
	v := Check(&x)
	if r != nil && bucket >= 0 && bucket < len(r.r.buckets) {
		r.r.observe(bucket, &Observation{Rows: rows, Explain: x, Verdict: v, Duration: d, Padding: padding})
	}
	return v
}
