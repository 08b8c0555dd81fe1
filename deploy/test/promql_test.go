package test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// expressions are every PromQL expression stepserve ships: the alert rules
// and the dashboard's queries, by where they come from.
func expressions(t *testing.T) map[string]string {
	out := map[string]string{}
	b, err := os.ReadFile("../helm/stepserve/files/stepserve-rules.yaml")
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert, Expr string
				For         string
				Labels      map[string]string
				Annotations map[string]string
			}
		}
	}
	require.NoError(t, yaml.UnmarshalStrict(b, &rules))
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out["alert "+r.Alert] = r.Expr
		}
	}
	// The Grafana-managed rules (generated from the same rules) query
	// what the Prometheus rules do, every one.
	b, err = os.ReadFile("../helm/stepserve/files/grafana-alerts.json")
	require.NoError(t, err)
	var grafana struct {
		Groups []struct {
			Rules []struct {
				Title string
				Data  []struct {
					RefID string `json:"refId"`
					Model struct{ Expr string }
				}
			}
		}
	}
	require.NoError(t, json.Unmarshal(b, &grafana))
	n := 0
	for _, g := range grafana.Groups {
		for _, r := range g.Rules {
			n++
			require.NotEmpty(t, r.Data, r.Title)
			assert.Equal(t, "A", r.Data[0].RefID, r.Title)
			assert.Equal(t, strings.TrimSpace(out["alert "+r.Title]), r.Data[0].Model.Expr, "Grafana's %s asks what Prometheus's does", r.Title)
			out["Grafana alert "+r.Title] = r.Data[0].Model.Expr
		}
	}
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				alerts++
			}
		}
	}
	assert.Equal(t, alerts, n, "a Grafana rule for every Prometheus alert")

	b, err = os.ReadFile("../helm/stepserve/files/dashboard.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	require.NoError(t, json.Unmarshal(b, &dash))
	// Grafana's variables become what Grafana substitutes.
	vars := strings.NewReplacer("$__rate_interval", "5m", "$model", ".*")
	for _, p := range dash.Panels {
		for i, tg := range p.Targets {
			out[p.Title+" #"+string(rune('A'+i))] = vars.Replace(tg.Expr)
		}
	}
	require.Greater(t, len(out), 25)
	return out
}

// metricNames parses expr and returns the metric names its selectors name.
func metricNames(t *testing.T, where, expr string) []string {
	e, err := parser.ParseExpr(expr)
	require.NoError(t, err, "%s: %s", where, expr)
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok && vs.Name != "" {
			names = append(names, vs.Name)
		}
		return nil
	})
	return names
}

var typeLine = regexp.MustCompile(`^# TYPE (\S+) (\S+)$`)

// exported lists every series name a running server exports, with the
// _bucket, _sum and _count series of histograms.
func exported(t *testing.T, metrics string) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(metrics, "\n") {
		m := typeLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		out[m[1]] = true
		if m[2] == "histogram" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[m[1]+s] = true
			}
		}
	}
	return out
}

// npuOnly are the metrics only an rbln worker on an NPU exports, which no
// server here can run: each is checked by name against its registration
// in engine/rbln instead.
var npuOnly = []string{"stepserve_device_memory_bytes", "stepserve_device_memory_age_seconds", "stepserve_device_allocator_events"}

// compiledOnly are the metrics of compiled programs (engine/rbln's
// compiled.go), which a worker exports once Dynamo counted something:
// where no torch 2.x root runs the test, checked by name.
var compiledOnly = []string{"stepserve_program_graph_breaks", "stepserve_program_recompiles", "stepserve_program_compile_seconds", "stepserve_step_audit_findings"}

// TestQueriesNameExportedMetrics parses every expression in the rules and
// the dashboard and checks that each stepserve metric it names is exported
// by a real server: digits on the torch engine (a real worker on the CPU,
// with the torch_rbln test double for explain) with CPU failover, and the
// encoder on the CPU engine.
func TestQueriesNameExportedMetrics(t *testing.T) {
	dir := t.TempDir()
	scenario := filepath.Join(dir, "scenario.json")
	require.NoError(t, os.WriteFile(scenario, []byte(`{"verdict":{"clean":true,"reasons":[]},"dump":{}}`), 0o644))
	fake, err := filepath.Abs("../../engine/rbln/worker/testdata/fake_torch_rbln")
	require.NoError(t, err)
	repo := repository(t, func(name, y string) string {
		if name == "digits" {
			return strings.Replace(y, "engine: cpu", "engine: torch", 1)
		}
		return y
	})
	args := []string{"--model_repository", repo, "--engine.failover", "cpufallback",
		"--rbln.env", "PYTHONPATH=" + fake + ",STEPSERVE_FAKE_RBLN_SCENARIO=" + scenario}
	compiled := os.Getenv("TORCH2_PYTHON")
	if compiled != "" {
		// The worker on torch 2.x compiles digits with inductor: the
		// compiled programs' gauges are exported, with their labels.
		args = append(args, "--rbln.python", compiled, "--rbln.torch_compile", "inductor")
	}
	s := startServer(t, args...)
	s.infer(t, "digits", digitRow)
	s.infer(t, "tiny-encoder", `{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":["hello"]}]}`)
	have := exported(t, s.get(t, "/metrics"))
	src, err := os.ReadFile("../../engine/rbln/metrics.go")
	require.NoError(t, err)
	for _, name := range npuOnly {
		require.Contains(t, string(src), `Name: "`+name+`"`, "engine/rbln registers %s", name)
		have[name] = true
	}
	if compiled == "" {
		// Without the torch 2.x root (make torch2-root) the worker compiles
		// nothing: the compiled programs' gauges are checked by name
		// against their registration.
		src, err := os.ReadFile("../../engine/rbln/compiled.go")
		require.NoError(t, err)
		for _, name := range compiledOnly {
			require.Contains(t, string(src), `"`+name+`"`, "engine/rbln registers %s", name)
			have[name] = true
		}
	}

	used := map[string]bool{}
	var missing []string
	for where, expr := range expressions(t) {
		for _, name := range metricNames(t, where, expr) {
			if !strings.HasPrefix(name, "stepserve_") {
				continue // the NPU exporter's, joined on the dashboard
			}
			used[name] = true
			if !have[name] {
				missing = append(missing, where+": "+name)
			}
		}
	}
	sort.Strings(missing)
	assert.Empty(t, missing, "queries name metrics the server does not export")

	// And the other way: every stepserve family appears somewhere.
	var unused []string
	for name := range have {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		if strings.HasPrefix(name, "stepserve_") && !used[name] && !used[base] && !used[base+"_bucket"] && !used[base+"_sum"] && !used[base+"_count"] {
			unused = append(unused, name)
		}
	}
	sort.Strings(unused)
	assert.Empty(t, unused, "exported metrics no alert or panel shows")

	// The labels the queries select and group by are labels the metrics
	// carry: a label renamed or removed (or one a query expects and the
	// server never added) fails here, not on a dashboard.
	labels := exportedLabels(s.get(t, "/metrics"))
	var wrong []string
	for where, expr := range expressions(t) {
		wrong = append(wrong, labelsNotExported(t, where, expr, labels)...)
	}
	sort.Strings(wrong)
	assert.Empty(t, wrong, "queries name labels the metrics do not carry")
	assert.True(t, labels["stepserve_requests_total"]["protocol"], "requests carry their protocol")
}

// sampleLine is one sample of the text exposition format: its name and
// its label pairs.
var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+$`)

var labelName = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"`)

// exportedLabels maps every series name a server exports to the label
// names its samples carry.
func exportedLabels(metrics string) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for _, line := range strings.Split(metrics, "\n") {
		m := sampleLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if out[m[1]] == nil {
			out[m[1]] = map[string]bool{}
		}
		for _, l := range labelName.FindAllStringSubmatch(m[2], -1) {
			out[m[1]][l[1]] = true
		}
	}
	return out
}

// targetLabels are the labels Prometheus adds to every series it scrapes.
var targetLabels = map[string]bool{"instance": true, "job": true, "pod": true, "namespace": true, "container": true, "service": true, "endpoint": true}

// labelsNotExported lists the labels expr selects on, or groups a
// stepserve metric by, that the metrics it reads do not carry.
func labelsNotExported(t *testing.T, where, expr string, exported map[string]map[string]bool) []string {
	e, err := parser.ParseExpr(expr)
	require.NoError(t, err, "%s: %s", where, expr)
	var wrong []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			have, ok := exported[n.Name]
			if !ok || !strings.HasPrefix(n.Name, "stepserve_") {
				return nil // a name check's concern, or another exporter's
			}
			for _, m := range n.LabelMatchers {
				if m.Name != "__name__" && !have[m.Name] && !targetLabels[m.Name] {
					wrong = append(wrong, fmt.Sprintf("%s: %s{%s}", where, n.Name, m.Name))
				}
			}
		case *parser.AggregateExpr:
			if n.Without {
				return nil
			}
			// The labels of the metrics aggregated, when they are all
			// stepserve's and nothing renames labels on the way.
			union, ours := map[string]bool{}, true
			parser.Inspect(n.Expr, func(m parser.Node, _ []parser.Node) error {
				switch m := m.(type) {
				case *parser.VectorSelector:
					have, ok := exported[m.Name]
					ours = ours && ok && strings.HasPrefix(m.Name, "stepserve_")
					for l := range have {
						union[l] = true
					}
				case *parser.Call:
					ours = ours && !strings.HasPrefix(m.Func.Name, "label_")
				}
				return nil
			})
			if !ours {
				return nil
			}
			for _, l := range n.Grouping {
				if !union[l] && !targetLabels[l] {
					wrong = append(wrong, fmt.Sprintf("%s: by (%s)", where, l))
				}
			}
		}
		return nil
	})
	return wrong
}
