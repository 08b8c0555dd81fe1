package server

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// control is a fake ModelControl over a mutable repository.
type control struct {
	models  map[string]Model
	onDisk  []string
	loadErr error
}

func (c *control) Models() []Model {
	var out []Model
	for _, m := range c.models {
		out = append(out, m)
	}
	return out
}

func (c *control) Model(name string) (Model, bool) { m, ok := c.models[name]; return m, ok }

func (c *control) Index(context.Context) ([]IndexEntry, error) {
	var out []IndexEntry
	for _, n := range c.onDisk {
		e := IndexEntry{Name: n, State: "UNAVAILABLE", Reason: "unloaded"}
		if _, ok := c.models[n]; ok {
			e = IndexEntry{Name: n, Version: "1", State: "READY"}
		}
		out = append(out, e)
	}
	return out, nil
}

func (c *control) Load(_ context.Context, name string) error {
	if name != "summax" {
		return fmt.Errorf("%w: no such directory", ErrUnknownModel)
	}
	if c.loadErr != nil {
		return fmt.Errorf("%w: %v", ErrBadModel, c.loadErr)
	}
	c.models[name] = newSumMax()
	return nil
}

func (c *control) Unload(_ context.Context, name string) error {
	if _, ok := c.models[name]; !ok {
		return fmt.Errorf("%w: %q is not loaded", ErrUnknownModel, name)
	}
	delete(c.models, name)
	return nil
}

func TestRepositoryAPI(t *testing.T) {
	c := &control{models: map[string]Model{"summax": newSumMax()}, onDisk: []string{"other", "summax"}}
	reg := prometheus.NewRegistry()
	s, err := New(Options{Models: c, Control: c, Registerer: reg, Gatherer: reg})
	require.NoError(t, err)
	infer := []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`)

	w := do(t, s, "POST", "/v2/repository/index", nil)
	require.Equal(t, 200, w.Code)
	var index []IndexEntry
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &index))
	assert.Equal(t, []IndexEntry{{Name: "other", State: "UNAVAILABLE", Reason: "unloaded"}, {Name: "summax", Version: "1", State: "READY"}}, index)
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
	assert.Contains(t, errorOf(t, w), `unload summax: unknown model: "summax" is not loaded`)

	w = do(t, s, "POST", "/v2/repository/models/summax/load", nil)
	require.Equal(t, 200, w.Code, w.Body.String())
	assert.Equal(t, 200, do(t, s, "POST", "/v2/models/summax/infer", infer).Code)
	assert.Equal(t, 1.0, testutil.ToFloat64(s.metrics.requests.WithLabelValues("summax", "success")))

	w = do(t, s, "POST", "/v2/repository/models/nope/load", nil)
	assert.Equal(t, 404, w.Code)
	assert.Contains(t, errorOf(t, w), "load nope: unknown model: no such directory")

	c.loadErr = fmt.Errorf(`weights.safetensors: tensor "layers.0.bias" is missing`)
	w = do(t, s, "POST", "/v2/repository/models/summax/load", nil)
	assert.Equal(t, 400, w.Code)
	assert.Contains(t, errorOf(t, w), `model failed to load: weights.safetensors: tensor "layers.0.bias" is missing`)

	w = do(t, s, "POST", "/v2/repository/index", []byte(`[1]`))
	assert.Equal(t, 400, w.Code)
}

func TestRepositoryAPIOffByDefault(t *testing.T) {
	s, _ := newTestServer(t, newSumMax())
	for _, path := range []string{"/v2/repository/index", "/v2/repository/models/summax/load", "/v2/repository/models/summax/unload"} {
		w := do(t, s, "POST", path, nil)
		assert.Equal(t, 403, w.Code, path)
		assert.Contains(t, errorOf(t, w), "--server.enable_model_control", path)
	}
	assert.Equal(t, 200, do(t, s, "GET", "/v2/models/summax/ready", nil).Code, "the model stays loaded")
}

func TestStatsEndpoint(t *testing.T) {
	s, _ := newTestServer(t, newSumMax())
	w := do(t, s, "GET", "/v2/models/summax/stats", nil)
	require.Equal(t, 200, w.Code)
	assert.Contains(t, w.Body.String(), `"bucket":"b1"`)
	assert.Contains(t, w.Body.String(), `"steps":7`)
	assert.Equal(t, 404, do(t, s, "GET", "/v2/models/nope/stats", nil).Code)
}
