package test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

type alertsResponse struct {
	Data struct {
		Alerts []struct {
			Labels map[string]string
			State  string
		}
	}
}

// prom is a real Prometheus (Debian's) scraping one stepserve every
// second with the shipped rules.
type prom struct {
	addr string
	logs *strings.Builder
}

func startPrometheus(t *testing.T, s *server) *prom {
	t.Helper()
	return startPrometheusWith(t, s, nil)
}

// startPrometheusWith is startPrometheus with target labels on the
// server's series, as Kubernetes' service discovery would add them
// (namespace, pod, service).
func startPrometheusWith(t *testing.T, s *server, labels map[string]string) *prom {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	require.NoError(t, err, "Debian's prometheus package is needed (make deps)")
	dir := t.TempDir()
	rules, err := filepath.Abs("../helm/stepserve/files/stepserve-rules.yaml")
	require.NoError(t, err)
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: stepserve
    static_configs:
      - targets: [%q]
        labels: %s
`, rules, strings.TrimPrefix(s.base, "http://"), targetLabelsJSON(labels))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644))
	p := &prom{addr: freePort(t), logs: &strings.Builder{}}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+p.addr)
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	require.Eventually(t, func() bool { _, err := p.alerts(); return err == nil }, 30*time.Second, 100*time.Millisecond, "prometheus did not start:\n%s", p.logs)
	return p
}

func targetLabelsJSON(labels map[string]string) string {
	if labels == nil {
		labels = map[string]string{}
	}
	b, _ := json.Marshal(labels)
	return string(b)
}

// sample is one series of an instant query's answer.
type sample struct {
	Labels map[string]string
	Value  float64
}

// query is expr's value now.
func (p *prom) query(t *testing.T, expr string) []sample {
	t.Helper()
	resp, err := http.Get("http://" + p.addr + "/api/v1/query?query=" + url.QueryEscape(expr))
	require.NoError(t, err)
	defer resp.Body.Close()
	var v struct {
		Status, Error string
		Data          struct {
			Result []struct {
				Metric map[string]string
				Value  []any
			}
		}
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
	require.Equal(t, "success", v.Status, "%s: %s", expr, v.Error)
	out := make([]sample, 0, len(v.Data.Result))
	for _, r := range v.Data.Result {
		f, err := strconv.ParseFloat(r.Value[1].(string), 64)
		require.NoError(t, err)
		out = append(out, sample{r.Metric, f})
	}
	return out
}

func (p *prom) alerts() (alertsResponse, error) {
	var r alertsResponse
	resp, err := http.Get("http://" + p.addr + "/api/v1/alerts")
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	return r, json.NewDecoder(resp.Body).Decode(&r)
}

// scraped waits until Prometheus holds series at value (a counter must
// be scraped at 0 before it rises, or increase() sees no rise).
func (p *prom) scraped(t *testing.T, series, value string) {
	t.Helper()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + p.addr + "/api/v1/query?query=" + url.QueryEscape(series))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var v struct {
			Data struct {
				Result []struct{ Value []any }
			}
		}
		return json.NewDecoder(resp.Body).Decode(&v) == nil && len(v.Data.Result) == 1 && v.Data.Result[0].Value[1] == value
	}, 60*time.Second, 200*time.Millisecond, "prometheus never scraped %s at %s:\n%s", series, value, p.logs)
}

// firing waits for alert name to fire with labels (among its own) and
// returns its labels.
func (p *prom) firing(t *testing.T, name string, labels map[string]string) map[string]string {
	t.Helper()
	var got map[string]string
	require.Eventually(t, func() bool {
		r, err := p.alerts()
		if err != nil {
			return false
		}
	alerts:
		for _, a := range r.Data.Alerts {
			if a.Labels["alertname"] != name || a.State != "firing" {
				continue
			}
			for k, v := range labels {
				if a.Labels[k] != v {
					continue alerts
				}
			}
			got = a.Labels
			return true
		}
		return false
	}, 60*time.Second, 200*time.Millisecond, "%s%v did not fire; prometheus log:\n%s", name, labels, p.logs)
	return got
}

// TestPrometheusFiresTheRecompileAlert runs a real Prometheus (Debian's)
// scraping a real stepserve every second with the shipped rules. The digits
// model warms up lazily, so the first step of each bucket recompiles, and
// StepserveRecompileInSteadyState must fire, as Prometheus's own
// /api/v1/alerts reports it.
func TestPrometheusFiresTheRecompileAlert(t *testing.T) {
	repo := repository(t, func(name, y string) string {
		if name == "digits" {
			return y + "warmup: lazy\n"
		}
		return y
	})
	s := startServer(t, "--model_repository", repo)
	p := startPrometheus(t, s)
	p.scraped(t, `stepserve_step_signals_total{model="digits",bucket="b1",signal="recompile"}`, "0")
	r, err := p.alerts()
	require.NoError(t, err)
	for _, a := range r.Data.Alerts {
		assert.NotEqual(t, "StepserveRecompileInSteadyState", a.Labels["alertname"], "no recompile before any step")
	}

	start := time.Now()
	s.infer(t, "digits", digitRow) // bucket b1: compiled on first use
	firing := p.firing(t, "StepserveRecompileInSteadyState", map[string]string{"model": "digits"})
	t.Logf("StepserveRecompileInSteadyState firing %v after the first lazy step: %v", time.Since(start).Round(100*time.Millisecond), firing)
	assert.Equal(t, "digits", firing["model"])
	assert.Equal(t, "b1", firing["bucket"])
	assert.Equal(t, "cpu", firing["engine"])
}

// TestPrometheusFiresOnRealCompilerSignals: the torch engine compiling
// with inductor in the torch 2.x root (make torch2-root), strict warm-up
// off, serving two torch modules of the kinds a real compiler catches: one
// whose guard stops holding (it recompiles every step) and one that reads a
// value on the host (its graph breaks: a CPU fallback every step, and a
// host_read audit finding). Dynamo counts each, not a double, and the
// shipped alerts fire in a real Prometheus.
func TestPrometheusFiresOnRealCompilerSignals(t *testing.T) {
	python := os.Getenv("TORCH2_PYTHON")
	if python == "" {
		t.Skip("TORCH2_PYTHON is unset: make test runs this in the torch 2.x root (make torch2-root)")
	}
	repo := t.TempDir()
	modules := map[string]string{
		"counting": "    def __init__(self):\n        super().__init__()\n        self.calls = 0\n\n    def forward(self, x):\n        self.calls += 1\n        return x * self.calls\n",
		"hostread": "    def forward(self, x):\n        y = x * 2\n        if float(y.max()) > 1:\n            y = y + 1\n        return y\n",
	}
	for name, body := range modules {
		dir := filepath.Join(repo, name)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "model.py"), []byte("import torch\n\n\nclass M(torch.nn.Module):\n"+body+"\n\ndef build(config):\n    return M()\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "model.yaml"), []byte(`architecture: torch
torch: {module: model.py, factory: build}
inputs: [{name: x, datatype: FP32, shape: [-1, 64]}]
outputs: [{name: y, datatype: FP32, shape: [-1, 64]}]
buckets: {batch: [1]}
engine: torch
`), 0o644))
	}
	s := startServer(t, "--model_repository", repo, "--rbln.python", python, "--rbln.torch_compile", "inductor",
		"--rbln.strict_warmup=false")
	explain := s.get(t, "/v2/models/hostread/explain")
	assert.Contains(t, explain, `"compiler":"inductor"`)
	assert.Contains(t, explain, `"graph_breaks":1`)
	assert.Contains(t, explain, `"line":"hostread/model.py:7"`)
	p := startPrometheus(t, s)
	for _, m := range []string{"counting", "hostread"} {
		for _, signal := range []string{"recompile", "cpu_fallback"} {
			p.scraped(t, fmt.Sprintf(`stepserve_step_signals_total{model=%q,bucket="b1",signal=%q}`, m, signal), "0")
		}
	}
	row := `{"inputs":[{"name":"x","datatype":"FP32","shape":[1,64],"data":[` + strings.Repeat("1,", 63) + `1]}]}`
	for range 3 {
		s.infer(t, "counting", row)
		s.infer(t, "hostread", row)
	}
	p.firing(t, "StepserveRecompileInSteadyState", map[string]string{"model": "counting", "engine": "torch"})
	p.firing(t, "StepserveCPUFallback", map[string]string{"model": "hostread", "engine": "torch"})
	p.firing(t, "StepserveStepAuditFindings", map[string]string{"model": "hostread", "engine": "torch", "rule": "host_read"})
	metrics := s.get(t, "/metrics")
	assert.Regexp(t, `stepserve_program_recompiles\{[^}]*model="counting"[^}]*\} [1-9]`, metrics)
	assert.Regexp(t, `stepserve_program_graph_breaks\{[^}]*model="hostread"[^}]*\} 1`, metrics)
	explain = s.get(t, "/v2/models/counting/explain")
	assert.Contains(t, explain, "recompile_reasons")
	assert.Contains(t, explain, "calls")
}
