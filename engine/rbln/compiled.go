// Compiled programs: what the worker's compiler built for each bucket
// (compiler.py), read for /explain's programs and for the program
// metrics.

package rbln

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepserve/stepserve/engine"
)

// programsRequest asks for a model's compiled programs, one per bucket;
// the worker answers it on its main thread, while a step runs.
type programsRequest struct {
	header
	Model string `json:"model"`
}

func (*programsRequest) kind() string { return "programs" }

type programsReply struct {
	Programs []engine.ProgramReport `json:"programs"`
	Note     string                 `json:"note"`
}

// programsTimeout bounds a programs request: a worker building a graph
// may hold its interpreter, and then the last reports are answered.
const programsTimeout = 5 * time.Second

// Programs implements [engine.ProgramReporter]: the worker's reports, read
// now, or the last ones read where the worker does not answer in time.
func (p *program) Programs(ctx context.Context) []engine.ProgramReport {
	p.refreshPrograms(ctx)
	return p.cachedPrograms()
}

// cachedPrograms are the reports last read, each bucket's (one that was
// never read: its compiler, not built, nothing counted).
func (p *program) cachedPrograms() []engine.ProgramReport {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]engine.ProgramReport, len(p.shapes))
	for i, s := range p.shapes {
		if i < len(p.reports) && p.reports[i].Bucket != "" {
			out[i] = p.reports[i]
		} else {
			out[i] = engine.ProgramReport{Compiler: p.compiler, Graphs: engine.Unknown, GraphBreaks: engine.Unknown,
				Recompiles: engine.Unknown, HostOps: engine.Unknown, Note: p.compileNote}
		}
		out[i].Bucket, out[i].Device = s.Label(), p.Device()
		if out[i].Kind == "" {
			out[i].Kind = "step"
		}
	}
	return out
}

// refreshPrograms reads the worker's reports into the cache; a worker
// that does not answer in time leaves the cache as it is.
func (p *program) refreshPrograms(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, programsTimeout)
	defer cancel()
	seq := p.reportSeq.Add(1)
	var r programsReply
	if err := p.w.call(ctx, &programsRequest{Model: p.key}, &r); err != nil {
		p.w.logger.Debug("compiled programs not read", "model", p.model.Name, "err", err)
		p.stale.Store(true) // read again after the next step
		return
	}
	p.stale.Store(false)
	p.mu.Lock()
	defer p.mu.Unlock()
	// Reads overlap (a build's, /explain's, a recompile's): a reply is kept
	// only if no later-asked one was kept before it.
	if seq > p.reportsFrom {
		p.reports, p.reportsFrom = r.Programs, seq
		if r.Note != "" {
			p.compileNote = r.Note
		}
	}
}

// refreshLater rereads the reports once a step showed that a program
// changed (a recompile), or after a read that failed (a worker too busy
// to answer in time), without delaying the step; one read at a time.
func (p *program) refreshLater(x engine.Explain) {
	if (x.Recompiles <= 0 && !p.stale.Load()) || !p.refreshing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer p.refreshing.Store(false)
		p.refreshPrograms(context.Background())
	}()
}

// programCollector exports every loaded program's compiled programs as
// gauges, from the reports last read (a scrape never waits on a worker).
type programCollector struct {
	e                                                    *Engine
	graphs, breaks, recompiles, compileSeconds, findings *prometheus.Desc
}

func newProgramCollector(e *Engine) *programCollector {
	labels := []string{"model", "bucket", "kind", "device", "compiler"}
	return &programCollector{
		e: e,
		graphs: prometheus.NewDesc("stepserve_program_graphs",
			"Graphs the compiler captured for the bucket's step: 1 for a whole step, more with graph breaks or recompiles (GET /v2/models/{model}/explain, programs).",
			labels, nil),
		breaks: prometheus.NewDesc("stepserve_program_graph_breaks",
			"Graph breaks in the bucket's step: each falls back to the host on every step (served only with rbln.strict_warmup false).",
			labels, nil),
		recompiles: prometheus.NewDesc("stepserve_program_recompiles",
			"Graphs the compiler captured for the bucket after its first run (guard failures); each step that recompiled also counts in stepserve_step_signals_total{signal=\"recompile\"}.",
			labels, nil),
		compileSeconds: prometheus.NewDesc("stepserve_program_compile_seconds",
			"The bucket's first run, which built its program (0.1 s or so where the compiler's cache served it).",
			labels, nil),
		findings: prometheus.NewDesc("stepserve_step_audit_findings",
			"Findings of the step audit in the bucket's captured graphs, by rule of the documented step structure (created_in_step, float64, int64, mixed_float, input_layout, host_read, outputs).",
			append(labels, "rule"), nil),
	}
}

func (c *programCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.graphs, c.breaks, c.recompiles, c.compileSeconds, c.findings} {
		ch <- d
	}
}

func (c *programCollector) Collect(ch chan<- prometheus.Metric) {
	workers := c.e.started.Load()
	if workers == nil {
		return // none started: no program yet
	}
	for _, w := range *workers {
		w.mu.Lock()
		ps := make([]*program, 0, len(w.programs))
		for p := range w.programs {
			ps = append(ps, p)
		}
		w.mu.Unlock()
		// One series per model, bucket and kind on a device: where a worker
		// holds several programs of one model (per_device replicas, the old
		// and new versions through a reload), the newest that built the
		// bucket speaks for them, as they are built from the same model.
		slices.SortFunc(ps, func(a, b *program) int { return cmp.Compare(b.slot, a.slot) })
		seen := map[[3]string]bool{}
		for _, p := range ps {
			if !p.healthy.Load() {
				continue // its worker is down: its reports are a dead life's
			}
			for _, r := range p.cachedPrograms() {
				key := [3]string{p.model.Name, r.Bucket, r.Kind}
				if !r.Built || seen[key] {
					continue
				}
				seen[key] = true
				labels := []string{p.model.Name, r.Bucket, r.Kind, r.Device, r.Compiler}
				gauge := func(d *prometheus.Desc, n engine.Count) {
					if n.Known() {
						ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(n), labels...)
					}
				}
				gauge(c.graphs, r.Graphs)
				gauge(c.breaks, r.GraphBreaks)
				gauge(c.recompiles, r.Recompiles)
				if r.CompileSeconds != nil {
					ch <- prometheus.MustNewConstMetric(c.compileSeconds, prometheus.GaugeValue, *r.CompileSeconds, labels...)
				}
				if r.Audit != nil && r.Audit.Error == "" {
					// Every rule, 0 included, where the audit read the whole
					// graph; none where it could not (0 would read as clean).
					for _, rule := range engine.AuditRules {
						ch <- prometheus.MustNewConstMetric(c.findings, prometheus.GaugeValue, float64(r.Audit.ByRule[rule]), append(labels, rule)...)
					}
				}
			}
		}
	}
}
