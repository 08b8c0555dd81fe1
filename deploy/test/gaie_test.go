package test

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	eppmetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/backend/metrics"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
)

// Kubernetes' inference gateway reads a live stepserve: the endpoint
// picker's own scraping and mapping code (GAIE v1.5.0's
// pkg/epp/backend/metrics, the last release that holds it; the picker
// moved to llm-d's router since), configured for vLLM's metric names as
// GAIE's model-server protocol gives them, parses stepserve's /metrics
// under load: 24 streamed generations on a model of max_num_seqs 4 read
// back as 4 running and the rest waiting, as stepserve_generation_
// sequences says them in the same scrape, the KV cache's use as
// stepserve_generation_kv_cache_blocks says it, and the cache's block
// size and blocks.
func TestInferenceGatewayReadsTheModelServer(t *testing.T) {
	repo := repository(t, func(name, yaml string) string {
		if name != "tiny-llama" {
			return yaml
		}
		yaml = strings.Replace(yaml, "max_num_seqs: 16", "max_num_seqs: 4", 1)
		return strings.Replace(yaml, "kv_cache_blocks: 128", "kv_cache_blocks: 600\n  block_size: 16", 1)
	})
	s := startServer(t, "--model_repository", repo, "--engine.cpu_threads", "1")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 24 {
		body, _ := json.Marshal(map[string]any{"model": "tiny-llama", "prompt": strings.Repeat("a long prompt ", 4+i%4), "max_tokens": 700,
			"ignore_eos": true, "stream": true})
		req, _ := http.NewRequestWithContext(ctx, "POST", s.base+"/v1/completions", strings.NewReader(string(body)))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("generation %d: %d %s", i, resp.StatusCode, b)
		}
		go func() { io.Copy(io.Discard, resp.Body); resp.Body.Close() }()
	}

	client, err := eppmetrics.NewPodMetricsClientImpl(logr.Discard(), eppmetrics.Config{
		ModelServerMetricsScheme: "http", ModelServerMetricsPath: "/metrics",
		TotalQueuedRequestsMetric: "vllm:num_requests_waiting", TotalRunningRequestsMetric: "vllm:num_requests_running",
		KVCacheUsagePercentageMetric: "vllm:kv_cache_usage_perc", CacheInfoMetric: "vllm:cache_config_info"})
	require.NoError(t, err)
	// One scrape, read both by the picker's code (served again from a
	// replay of the same text) and as stepserve's own series. The loop
	// sets a step's gauges one after another, so a scrape can catch
	// stepserve's names and vLLM's a step apart: read until one agrees
	// with itself (a mapping that never does fails below).
	parser := expfmt.NewTextParser(model.LegacyValidation)
	var got *fwkdl.Metrics
	var seqs, blocks map[string]float64
	deadline := time.Now().Add(30 * time.Second)
	for {
		text := s.get(t, "/metrics")
		replay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			io.WriteString(w, text)
		}))
		host := strings.TrimPrefix(replay.URL, "http://")
		got, err = client.FetchMetrics(ctx, &fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: "stepserve-0", Namespace: "test"},
			Address: host, MetricsHost: host}, fwkdl.NewMetrics())
		replay.Close()
		require.NoError(t, err)
		families, err := parser.TextToMetricFamilies(strings.NewReader(text))
		require.NoError(t, err)
		seqs, blocks = ownSeries(families, "stepserve_generation_sequences"), ownSeries(families, "stepserve_generation_kv_cache_blocks")
		loaded := got.RunningRequestsSize == 4 && got.WaitingQueueSize > 0
		consistent := seqs["running"] == float64(got.RunningRequestsSize) && seqs["waiting"] == float64(got.WaitingQueueSize) &&
			blocks["used"] > 0 && math.Abs(blocks["used"]/(blocks["used"]+blocks["free"])-got.KVCacheUsagePercent) < 1e-9
		if loaded && consistent {
			break
		}
		if time.Now().After(deadline) {
			require.True(t, loaded, "the picker read %d running and %d waiting; want 4 and some", got.RunningRequestsSize, got.WaitingQueueSize)
			break // the assertions below say what disagreed in every scrape
		}
		time.Sleep(20 * time.Millisecond)
	}
	assert.Equal(t, seqs["running"], float64(got.RunningRequestsSize))
	assert.Equal(t, seqs["waiting"], float64(got.WaitingQueueSize))
	require.Positive(t, blocks["used"])
	assert.InDelta(t, blocks["used"]/(blocks["used"]+blocks["free"]), got.KVCacheUsagePercent, 1e-9, "the KV cache's use as the picker reads it")
	assert.Equal(t, 16, got.CacheBlockSize)
	assert.Equal(t, 600, got.CacheNumBlocks)
	cancel()
}

// ownSeries is a stepserve gauge family's values for tiny-llama, by state.
func ownSeries(families map[string]*dto.MetricFamily, family string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range families[family].GetMetric() {
		var name, state string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "model":
				name = l.GetValue()
			case "state":
				state = l.GetValue()
			}
		}
		if name == "tiny-llama" {
			out[state] = m.GetGauge().GetValue()
		}
	}
	return out
}
