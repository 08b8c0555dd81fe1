package server

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/serving"
)

func TestRepositoryAPI(t *testing.T) {
	f := newSumMax(t)
	require.NoError(t, os.MkdirAll(filepath.Join(f.repo, "other"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(f.repo, "other", models.ConfigFile), []byte(enginetest.SumMaxYAML), 0o644))
	reg := prometheus.NewRegistry()
	s, err := New(Options{Models: f.set, ModelControl: true, Registerer: reg, Gatherer: reg})
	require.NoError(t, err)
	infer := []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`)

	w := do(t, s, "POST", "/v2/repository/index", nil)
	require.Equal(t, 200, w.Code)
	var index []serving.IndexEntry
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &index))
	assert.Equal(t, []serving.IndexEntry{{Name: "other", State: "UNAVAILABLE", Reason: "unloaded"}, {Name: "summax", Version: "1", State: "READY"}}, index)
	w = do(t, s, "POST", "/v2/repository/index", []byte(`{"ready":true}`))
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &index))
	assert.Len(t, index, 1)

	require.Equal(t, 200, do(t, s, "POST", "/v2/models/summax/infer", infer).Code)
	assert.Equal(t, 1, testutil.CollectAndCount(reg, "stepserve_request_duration_seconds"))

	w = do(t, s, "POST", "/v2/repository/models/summax/unload", nil)
	require.Equal(t, 200, w.Code, w.Body.String())
	assert.Equal(t, 404, do(t, s, "POST", "/v2/models/summax/infer", infer).Code)
	assert.Equal(t, 404, do(t, s, "GET", "/v2/models/summax/ready", nil).Code)
	assert.Equal(t, 200, do(t, s, "GET", "/v2/health/ready", nil).Code, "no model left is not a failure of readiness")
	assert.Zero(t, testutil.CollectAndCount(reg, "stepserve_requests_total", "stepserve_request_duration_seconds"), "unload deletes the model's series")

	w = do(t, s, "POST", "/v2/repository/models/summax/unload", nil)
	assert.Equal(t, 404, w.Code)
	assert.Contains(t, errorOf(t, w), `unload summax: serving: unknown model: "summax" is not loaded`)

	w = do(t, s, "POST", "/v2/repository/models/summax/load", nil)
	require.Equal(t, 200, w.Code, w.Body.String())
	assert.Equal(t, 200, do(t, s, "POST", "/v2/models/summax/infer", infer).Code)
	assert.Equal(t, 1.0, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", "success", "http")))

	w = do(t, s, "POST", "/v2/repository/models/nope/load", nil)
	assert.Equal(t, 404, w.Code)
	assert.Contains(t, errorOf(t, w), "failed to load 'nope', failed to poll from model repository: serving: unknown model: the repository has no nope/model.yaml")

	// "other" has no weights.
	w = do(t, s, "POST", "/v2/repository/models/other/load", nil)
	assert.Equal(t, 400, w.Code)
	assert.Contains(t, errorOf(t, w), `failed to load 'other', serving: model failed to load: `)
	assert.Contains(t, errorOf(t, w), models.WeightsFile)

	w = do(t, s, "POST", "/v2/repository/index", []byte(`[1]`))
	assert.Equal(t, 400, w.Code)
}

// TestIndexListsHubFolders: a Hugging Face folder served as the Hub has it
// (config.json, no model.yaml) is in the index like any model: READY
// while served, in the ready-only listing, UNAVAILABLE once unloaded, and
// loadable again by its name.
func TestIndexListsHubFolders(t *testing.T) {
	f := &fixture{repo: t.TempDir(), eng: &enginetest.Engine{Func: enginetest.SumMax}}
	require.NoError(t, enginetest.WriteSumMax(filepath.Join(f.repo, "summax")))
	hub := filepath.Join(f.repo, "tiny-xlmr")
	require.NoError(t, os.CopyFS(hub, os.DirFS("../model_repository/tiny-xlmr")))
	require.NoError(t, os.Remove(filepath.Join(hub, models.ConfigFile)), "the folder as the Hub ships it")
	f.set = liveSet(t, f.repo, f.eng)
	s, _ := controlServer(t, f)

	index := func(body []byte) []serving.IndexEntry {
		t.Helper()
		w := do(t, s, "POST", "/v2/repository/index", body)
		require.Equal(t, 200, w.Code, w.Body.String())
		var index []serving.IndexEntry
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &index))
		return index
	}
	ready := []serving.IndexEntry{{Name: "summax", Version: "1", State: "READY"}, {Name: "tiny-xlmr", Version: "1", State: "READY"}}
	assert.Equal(t, ready, index(nil))
	assert.Equal(t, ready, index([]byte(`{"ready":true}`)))

	require.Equal(t, 200, do(t, s, "POST", "/v2/repository/models/tiny-xlmr/unload", nil).Code)
	assert.Equal(t, []serving.IndexEntry{{Name: "summax", Version: "1", State: "READY"}, {Name: "tiny-xlmr", State: "UNAVAILABLE", Reason: "unloaded"}}, index(nil))
	w := do(t, s, "POST", "/v2/repository/models/tiny-xlmr/load", nil)
	require.Equal(t, 200, w.Code, w.Body.String())
	assert.Equal(t, ready, index(nil))
}

func TestRepositoryAPIOffByDefault(t *testing.T) {
	s, _ := newTestServer(t, newSumMax(t))
	for _, path := range []string{"/v2/repository/models/summax/load", "/v2/repository/models/summax/unload"} {
		w := do(t, s, "POST", path, nil)
		assert.Equal(t, 403, w.Code, path)
		assert.Contains(t, errorOf(t, w), "--server.enable_model_control", path)
	}
	assert.Equal(t, 200, do(t, s, "GET", "/v2/models/summax/ready", nil).Code, "the model stays loaded")
	// Listing only reads: it answers with model control off, POST or GET.
	for _, method := range []string{"POST", "GET"} {
		w := do(t, s, method, "/v2/repository/index", nil)
		require.Equal(t, 200, w.Code, method)
		assert.JSONEq(t, `[{"name":"summax","version":"1","state":"READY"}]`, w.Body.String())
	}
}

// TestIndexAuth: the listing asks for the repository token where one is
// set, else the inference token.
func TestIndexAuth(t *testing.T) {
	f := newSumMax(t)
	reg := prometheus.NewRegistry()
	s, err := New(Options{Models: f.set, InferenceTokens: []string{"inference-token-0123456789"}, Registerer: reg, Gatherer: reg})
	require.NoError(t, err)
	assert.Equal(t, 401, do(t, s, "GET", "/v2/repository/index", nil).Code)
	assert.Equal(t, 200, do(t, s, "GET", "/v2/repository/index", nil, "Authorization", "Bearer inference-token-0123456789").Code)
	s.SetTokens([]string{"inference-token-0123456789"}, []string{"repository-token-0123456789"})
	assert.Equal(t, 401, do(t, s, "GET", "/v2/repository/index", nil, "Authorization", "Bearer inference-token-0123456789").Code)
	assert.Equal(t, 200, do(t, s, "GET", "/v2/repository/index", nil, "Authorization", "Bearer repository-token-0123456789").Code)
}

func TestBucketsEndpoint(t *testing.T) {
	s, _ := newTestServer(t, newSumMax(t))
	require.Equal(t, 200, do(t, s, "POST", "/v2/models/summax/infer", []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`)).Code)
	for _, path := range []string{"/v2/models/summax/buckets", "/v2/models/summax/versions/1/buckets"} {
		w := do(t, s, "GET", path, nil)
		require.Equal(t, 200, w.Code)
		assert.Contains(t, w.Body.String(), `"bucket":"b1"`)
		assert.Contains(t, w.Body.String(), `"steps":1`)
	}
	assert.Equal(t, 404, do(t, s, "GET", "/v2/models/nope/buckets", nil).Code)
}

// TestMetadataDescription: model.yaml's description is in the model's
// metadata.
func TestMetadataDescription(t *testing.T) {
	f := newSumMax(t)
	path := filepath.Join(f.repo, "summax", models.ConfigFile)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, append(b, []byte("description: Sums and maxes of three numbers.\n")...), 0o644))
	require.NoError(t, f.set.Load(t.Context(), "summax"))
	s, _ := newTestServer(t, f)
	w := do(t, s, "GET", "/v2/models/summax", nil)
	require.Equal(t, 200, w.Code)
	assert.Contains(t, w.Body.String(), `"description":"Sums and maxes of three numbers."`)
}
