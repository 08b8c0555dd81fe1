package rbln

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	workerUp       *prometheus.GaugeVec
	workerRestarts *prometheus.CounterVec
	lateReplies    *prometheus.CounterVec
	deviceMemory   *prometheus.GaugeVec
	deviceEvents   *prometheus.GaugeVec
	memoryAge      *prometheus.GaugeVec
	modelReloads   *prometheus.CounterVec
	outputDropped  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, devices []string) (*metrics, error) {
	m := &metrics{
		workerUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stepserve_worker_up",
			Help: "1 while the device's rbln worker is running and answering, 0 while it is down or restarting.",
		}, []string{"device"}),
		workerRestarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepserve_worker_restarts_total",
			Help: "Times the device's rbln worker died or hung and was restarted.",
		}, []string{"device"}),
		lateReplies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepserve_worker_late_replies_total",
			Help: "Results from the device's rbln worker that came after their caller had given up (a memory poll or load that waited behind a compile), by request kind; dropped, never a restart.",
		}, []string{"device", "kind"}),
		deviceMemory: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stepserve_device_memory_bytes",
			Help: "Device memory per NPU and chiplet from torch.rbln.memory_stats_per_chiplet(), read after warm-up and periodically.",
		}, []string{"device", "npu", "chiplet", "kind"}),
		deviceEvents: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stepserve_device_allocator_events",
			Help: "The device allocator's event counts per NPU and chiplet since the worker started, from memory_stats_per_chiplet(): out-of-memory errors (event=ooms) and allocation retries after a cache flush (event=alloc_retries). Alert on increase().",
		}, []string{"device", "npu", "chiplet", "event"}),
		memoryAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "stepserve_device_memory_age_seconds",
			Help: "How old the device memory reading was when last polled: 0 when read live; while steps keep the device busy the worker answers with its last reading, refreshed between steps every 5 s.",
		}, []string{"device"}),
		modelReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepserve_worker_model_reloads_total",
			Help: "Models put back on the device's rbln worker after it restarted, by outcome (ok, failed); a model whose reloads keep failing is retried with a growing backoff.",
		}, []string{"device", "outcome"}),
		outputDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stepserve_worker_output_lines_dropped_total",
			Help: "Lines the device's rbln worker printed that were not logged: beyond the log's rate limit for worker output.",
		}, []string{"device"}),
	}
	for _, d := range devices {
		m.workerUp.WithLabelValues(d)
		m.workerRestarts.WithLabelValues(d)
		m.outputDropped.WithLabelValues(d)
		for _, o := range []string{"ok", "failed"} {
			m.modelReloads.WithLabelValues(d, o)
		}
		for _, kind := range []string{"load", "compile", "step", "unload", "memory"} {
			m.lateReplies.WithLabelValues(d, kind)
		}
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.workerUp, m.workerRestarts, m.lateReplies, m.deviceMemory, m.deviceEvents, m.memoryAge, m.modelReloads, m.outputDropped} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *metrics) up(device string, up bool) {
	v := 0.0
	if up {
		v = 1
	}
	m.workerUp.WithLabelValues(device).Set(v)
}

func (m *metrics) restarted(device string) { m.workerRestarts.WithLabelValues(device).Inc() }

func (m *metrics) reloaded(device, outcome string) {
	m.modelReloads.WithLabelValues(device, outcome).Inc()
}

func (m *metrics) dropped(device string, n int) {
	m.outputDropped.WithLabelValues(device).Add(float64(n))
}

func (m *metrics) lateReply(device, kind string) { m.lateReplies.WithLabelValues(device, kind).Inc() }

func (m *metrics) memory(device, npu, chiplet, kind string, bytes float64) {
	switch kind {
	case "num_ooms":
		m.deviceEvents.WithLabelValues(device, npu, chiplet, "ooms").Set(bytes)
	case "num_alloc_retries":
		m.deviceEvents.WithLabelValues(device, npu, chiplet, "alloc_retries").Set(bytes)
	default:
		m.deviceMemory.WithLabelValues(device, npu, chiplet, kind).Set(bytes)
	}
}
