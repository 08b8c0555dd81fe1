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

// TestPrometheusFiresTheRecompileAlert runs a real Prometheus (Debian's)
// scraping a real stepserve every second with the shipped rules. The digits
// model warms up lazily, so the first step of each bucket recompiles, and
// StepserveRecompileInSteadyState must fire, as Prometheus's own
// /api/v1/alerts reports it.
func TestPrometheusFiresTheRecompileAlert(t *testing.T) {
	prom, err := exec.LookPath("prometheus")
	require.NoError(t, err, "Debian's prometheus package is needed (make deps)")
	repo := repository(t, func(name, y string) string {
		if name == "digits" {
			return y + "warmup: lazy\n"
		}
		return y
	})
	s := startServer(t, "--model_repository", repo)

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
`, rules, strings.TrimPrefix(s.base, "http://"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644))
	addr := freePort(t)
	cmd := exec.Command(prom, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr)
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	alerts := func() (alertsResponse, error) {
		var r alertsResponse
		resp, err := http.Get("http://" + addr + "/api/v1/alerts")
		if err != nil {
			return r, err
		}
		defer resp.Body.Close()
		return r, json.NewDecoder(resp.Body).Decode(&r)
	}
	require.Eventually(t, func() bool { _, err := alerts(); return err == nil }, 30*time.Second, 100*time.Millisecond, "prometheus did not start:\n%s", &logs)
	// Prometheus must have scraped the counter at 0 before the first step,
	// or increase() sees no rise (service discovery takes ~5s to start).
	require.Eventually(t, func() bool {
		q := url.QueryEscape(`stepserve_step_signals_total{model="digits",bucket="b1",signal="recompile"}`)
		resp, err := http.Get("http://" + addr + "/api/v1/query?query=" + q)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var v struct {
			Data struct {
				Result []struct{ Value []any }
			}
		}
		return json.NewDecoder(resp.Body).Decode(&v) == nil && len(v.Data.Result) == 1 && v.Data.Result[0].Value[1] == "0"
	}, 60*time.Second, 200*time.Millisecond, "prometheus never scraped stepserve:\n%s", &logs)
	r, err := alerts()
	require.NoError(t, err)
	for _, a := range r.Data.Alerts {
		assert.NotEqual(t, "StepserveRecompileInSteadyState", a.Labels["alertname"], "no recompile before any step")
	}

	start := time.Now()
	s.infer(t, "digits", digitRow) // bucket b1: compiled on first use
	var firing map[string]string
	require.Eventually(t, func() bool {
		r, err := alerts()
		if err != nil {
			return false
		}
		for _, a := range r.Data.Alerts {
			if a.Labels["alertname"] == "StepserveRecompileInSteadyState" && a.State == "firing" {
				firing = a.Labels
				return true
			}
		}
		return false
	}, 60*time.Second, 200*time.Millisecond, "the recompile alert did not fire; prometheus log:\n%s", &logs)
	t.Logf("StepserveRecompileInSteadyState firing %v after the first lazy step: %v", time.Since(start).Round(100*time.Millisecond), firing)
	assert.Equal(t, "digits", firing["model"])
	assert.Equal(t, "b1", firing["bucket"])
	assert.Equal(t, "cpu", firing["engine"])
}
