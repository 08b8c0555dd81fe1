package test

import (
	"encoding/json"
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
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
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
var npuOnly = []string{"stepserve_device_memory_bytes"}

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
	s := startServer(t, "--model_repository", repo, "--engine.failover", "cpufallback",
		"--rbln.env", "PYTHONPATH="+fake+",STEPSERVE_FAKE_RBLN_SCENARIO="+scenario)
	s.infer(t, "digits", digitRow)
	s.infer(t, "tiny-encoder", `{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":["hello"]}]}`)
	have := exported(t, s.get(t, "/metrics"))
	src, err := os.ReadFile("../../engine/rbln/metrics.go")
	require.NoError(t, err)
	for _, name := range npuOnly {
		require.Contains(t, string(src), `Name: "`+name+`"`, "engine/rbln registers %s", name)
		have[name] = true
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
}
