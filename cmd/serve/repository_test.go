package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// copyDigits puts the shipped digits model into a fresh repository under
// name, with extra appended to its model.yaml.
func copyDigits(t *testing.T, repo, name, extra string) {
	dir := filepath.Join(repo, name)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	yaml, err := os.ReadFile("../../model_repository/digits/model.yaml")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.yaml"), append(yaml, extra...), 0o644))
	for _, f := range []string{"weights.safetensors", "labels.txt"} {
		b, err := os.ReadFile(filepath.Join("../../model_repository/digits", f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
}

func status(t *testing.T, method, url string) int {
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

func TestRepositoryAPILoadUnload(t *testing.T) {
	repo := t.TempDir()
	copyDigits(t, repo, "digits", "")
	p := start(t, "--model_repository", repo, "--server.enable_model_control")
	digits := heldout(t)
	classifyOne(t, p.base, digits[0])
	assert.Equal(t, 1.0, metricSum(t, scrape(t, p.base), "stepserve_model_ready", `model="digits"`))

	// A second model appears on disk and is loaded at run time.
	copyDigits(t, repo, "digits2", "")
	resp, body := post(t, p.base+"/v2/repository/models/digits2/load", nil)
	require.Equal(t, 200, resp.StatusCode, string(body))
	assert.Equal(t, 200, status(t, "GET", p.base+"/v2/models/digits2/ready"))
	resp, body = post(t, p.base+"/v2/models/digits2/infer", jsonRequest("a", digits[:2]))
	require.Equal(t, 200, resp.StatusCode, string(body))

	resp, body = post(t, p.base+"/v2/repository/index", nil)
	require.Equal(t, 200, resp.StatusCode)
	assert.JSONEq(t, `[{"name":"digits","version":"1","state":"READY"},{"name":"digits2","version":"1","state":"READY"}]`, string(body))

	// Unloading drains and deletes the model's series.
	resp, body = post(t, p.base+"/v2/repository/models/digits/unload", nil)
	require.Equal(t, 200, resp.StatusCode, string(body))
	assert.Equal(t, 404, status(t, "GET", p.base+"/v2/models/digits/ready"))
	resp, _ = post(t, p.base+"/v2/models/digits/infer", jsonRequest("a", digits[:1]))
	assert.Equal(t, 404, resp.StatusCode)
	m := scrape(t, p.base)
	for _, name := range []string{"stepserve_model_ready", "stepserve_steps_total", "stepserve_requests_total", "stepserve_queue_depth", "stepserve_batch_size_count"} {
		assert.NotContains(t, m, name+`{model="digits"`, name)
		assert.Contains(t, m, `model="digits2"`)
	}
	assert.Equal(t, 200, status(t, "GET", p.base+"/v2/health/ready"))
	resp, body = post(t, p.base+"/v2/repository/index", []byte(`{"ready":true}`))
	require.Equal(t, 200, resp.StatusCode)
	assert.JSONEq(t, `[{"name":"digits2","version":"1","state":"READY"}]`, string(body))

	// And comes back.
	resp, body = post(t, p.base+"/v2/repository/models/digits/load", nil)
	require.Equal(t, 200, resp.StatusCode, string(body))
	assert.Equal(t, digits[0].label, classifyOne(t, p.base, digits[0]))
	assert.Equal(t, 1.0, metricSum(t, scrape(t, p.base), "stepserve_model_ready", `model="digits"`))

	// Bad repository content is a 400 naming the problem; the model that
	// was serving keeps serving.
	require.NoError(t, os.WriteFile(filepath.Join(repo, "digits", "weights.safetensors"), []byte("short"), 0o644))
	resp, body = post(t, p.base+"/v2/repository/models/digits/load", nil)
	assert.Equal(t, 400, resp.StatusCode)
	assert.Contains(t, string(body), "weights.safetensors")
	assert.Contains(t, string(body), "shorter than the 8-byte header length")
	assert.Equal(t, 200, status(t, "GET", p.base+"/v2/models/digits/ready"))
	resp, body = post(t, p.base+"/v2/repository/index", nil)
	require.Equal(t, 200, resp.StatusCode)
	var index []struct{ Name, State, Reason string }
	require.NoError(t, json.Unmarshal(body, &index))
	assert.Equal(t, "READY", index[0].State)

	resp, body = post(t, p.base+"/v2/repository/models/missing/load", nil)
	assert.Equal(t, 404, resp.StatusCode)
	assert.Contains(t, string(body), "the repository has no missing/model.yaml")
	resp, body = post(t, p.base+"/v2/repository/models/..%2Fetc/load", nil)
	assert.Equal(t, 404, resp.StatusCode)
	assert.False(t, strings.Contains(string(body), "passwd"))
}
