package serving

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the live set's own series: how long loads take, failovers,
// and readiness (collected from the set at scrape time).
type metrics struct {
	loadDuration *prometheus.GaugeVec
	failovers    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, set *Set) (*metrics, error) {
	m := &metrics{
		loadDuration: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stepserve_model_load_duration_seconds",
			Help: "How long the model's last load took, warm-up included.",
		}, []string{"model"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepserve_engine_failovers_total",
			Help: "Times a model's steps moved from its engine to the fallback engine because the device was unavailable.",
		}, []string{"model", "from", "to"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.loadDuration, m.failovers, &readyCollector{set: set, desc: readyDesc},
			&replicasCollector{set: set}, &adviceCollector{set: set}} {
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
		total, healthy := m.Replicas()
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
		a, err := m.Advise(len(m.Stats()))
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(bucketWorkDesc, prometheus.GaugeValue, a.PaddingNow, m.model.Name, "current")
		ch <- prometheus.MustNewConstMetric(bucketWorkDesc, prometheus.GaugeValue, a.PaddingAdvised, m.model.Name, "advised")
	}
}
