package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// adapterRule is one rule of deploy/prometheus/adapter-rules.yaml, in
// prometheus-adapter's configuration format.
type adapterRule struct {
	SeriesQuery string `json:"seriesQuery"`
	Resources   struct {
		Overrides map[string]struct {
			Resource string `json:"resource"`
		} `json:"overrides"`
	} `json:"resources"`
	Name struct {
		Matches string `json:"matches"`
		As      string `json:"as"`
	} `json:"name"`
	MetricsQuery string `json:"metricsQuery"`
}

func adapterRules(t *testing.T) []adapterRule {
	t.Helper()
	b, err := os.ReadFile("../prometheus/adapter-rules.yaml")
	require.NoError(t, err)
	var doc struct {
		Rules []adapterRule `json:"rules"`
	}
	require.NoError(t, yaml.UnmarshalStrict(b, &doc))
	require.NotEmpty(t, doc.Rules)
	return doc.Rules
}

var seriesName = regexp.MustCompile(`^(?:([a-zA-Z_:][a-zA-Z0-9_:]*)\{|\{__name__="([^"]+)")`)

// series is the metric name the rule's seriesQuery selects.
func (r adapterRule) series() string {
	m := seriesName.FindStringSubmatch(r.SeriesQuery)
	if m == nil {
		return ""
	}
	return m[1] + m[2]
}

// servedAs is the custom metric's name, as the adapter derives it:
// name.matches applied to the series' name, replaced by name.as.
func (r adapterRule) servedAs() string {
	re := regexp.MustCompile(r.Name.Matches)
	return re.ReplaceAllString(r.series(), r.Name.As)
}

// query is the PromQL the adapter runs for the pods named, as its
// metricsQuery template expands (<<.Series>>, <<.LabelMatchers>>,
// <<.GroupBy>>).
func (r adapterRule) query(namespace string, pods ...string) string {
	return strings.NewReplacer("<<.Series>>", r.series(),
		"<<.LabelMatchers>>", `namespace="`+namespace+`",pod=~"`+strings.Join(pods, "|")+`"`,
		"<<.GroupBy>>", "pod").Replace(r.MetricsQuery)
}

// TestAutoscalingQueriesReadTheServer: the queries autoscaling runs, KEDA's
// triggers as the chart renders them and prometheus-adapter's rules as the
// adapter expands them, asked of a real Prometheus scraping a loaded
// stepserve (with the target labels Kubernetes' discovery gives a pod of
// release rel), read what stepserve's own series say in the same
// evaluation: the generations waiting, the KV cache's use, the queue.
func TestAutoscalingQueriesReadTheServer(t *testing.T) {
	repo := repository(t, func(name, yaml string) string {
		if name != "tiny-llama" {
			return yaml
		}
		return strings.Replace(yaml, "max_num_seqs: 16", "max_num_seqs: 4", 1)
	})
	s := startServer(t, "--model_repository", repo, "--engine.cpu_threads", "1")
	p := startPrometheusWith(t, s, map[string]string{"namespace": "default", "service": "rel-stepserve", "pod": "rel-stepserve-0"})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Twelve clients each sending generation after generation (a bounded
	// number), so that 4 run and the rest wait through several scrapes.
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, _ := json.Marshal(map[string]any{"model": "tiny-llama", "prompt": strings.Repeat("a prompt ", 4+i%4), "max_tokens": 700,
				"ignore_eos": true, "stream": true})
			for range 200 {
				req, _ := http.NewRequestWithContext(ctx, "POST", s.base+"/v1/completions", bytes.NewReader(body))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return // the test is over
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}

	// What each signal is, in stepserve's own names.
	own := map[string]string{
		"requestsWaiting": `sum(stepserve_generation_sequences{state="waiting"})`,
		"kvCacheUsage":    `max(sum by (model) (stepserve_generation_kv_cache_blocks{state="used"}) / sum by (model) (stepserve_generation_kv_cache_blocks))`,
		"queueDepth":      `sum(stepserve_queue_depth)`,
	}
	r := render(t, "--set", "autoscaling.enabled=true,autoscaling.driver=keda", "--set", "autoscaling.signals={queueDepth,requestsWaiting,kvCacheUsage}")
	queries := map[string]string{}
	for _, tr := range r.scaled["spec"].(map[string]any)["triggers"].([]any) {
		md := tr.(map[string]any)["metadata"].(map[string]any)
		queries["keda "+tr.(map[string]any)["name"].(string)] = md["query"].(string)
	}
	signal := map[string]string{"keda queue-depth": "queueDepth", "keda requests-waiting": "requestsWaiting", "keda kv-cache-usage": "kvCacheUsage"}
	for _, rule := range adapterRules(t) {
		name := "adapter " + rule.servedAs()
		queries[name] = rule.query("default", "rel-stepserve-0")
		for sig, n := range map[string]string{"queueDepth": "stepserve_queue_depth", "requestsWaiting": "vllm_num_requests_waiting", "kvCacheUsage": "vllm_kv_cache_usage_perc"} {
			if rule.servedAs() == n {
				signal[name] = sig
			}
		}
	}
	require.Len(t, queries, 6, "three triggers and three rules: %v", queries)

	// Wait for the scheduler to hold some waiting, as Prometheus saw it.
	require.Eventually(t, func() bool {
		v := p.query(t, own["requestsWaiting"])
		return len(v) == 1 && v[0].Value > 0
	}, 60*time.Second, 200*time.Millisecond, "no generation ever waited; prometheus log:\n%s", p.logs)
	for name, q := range queries {
		sig := signal[name]
		require.NotEmpty(t, sig, name)
		// Both sides in one evaluation: the same scrape. The loop sets
		// a step's gauges one after another, so a scrape can catch
		// stepserve's and vLLM's names a step apart; the next scrapes
		// agree, where a query reading the wrong series never does.
		diff := fmt.Sprintf(`(%s) - on() (%s)`, q, own[sig])
		var got []sample
		agree := func() bool {
			got = p.query(t, diff)
			return len(got) == 1 && math.Abs(got[0].Value) < 1e-9
		}
		for deadline := time.Now().Add(10 * time.Second); !agree() && time.Now().Before(deadline); {
			time.Sleep(250 * time.Millisecond)
		}
		require.Len(t, got, 1, "%s (%s) reads no series", name, q)
		assert.InDelta(t, 0, got[0].Value, 1e-9, "%s: %s against %s, in every scrape for 10 s", name, q, own[sig])
		if strings.HasPrefix(name, "adapter") {
			v := p.query(t, q)
			require.Len(t, v, 1)
			assert.Equal(t, "rel-stepserve-0", v[0].Labels["pod"], "the adapter's metric is the pod's")
		}
		if sig != "queueDepth" {
			v := p.query(t, q)
			assert.Positive(t, v[0].Value, "%s reads the load", name)
		}
	}
	cancel()
}
