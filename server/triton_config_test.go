package server

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/triton"
	"github.com/stepserve/stepserve/serving"
)

// shippedOnFakes serves the shipped model repository with fake engines
// named as the models name theirs (cpu for digits and tiny-encoder, torch
// for digits-cnn): what is configured, not what is computed.
func shippedOnFakes(t *testing.T) *Server {
	t.Helper()
	set, err := serving.New(serving.Options{Repository: "../model_repository", DefaultEngine: "cpu",
		Engines: map[string]serving.Engine{
			"cpu":   {Engine: &enginetest.Engine{Label: "cpu", Devices: []string{"cpu"}}},
			"torch": {Engine: &enginetest.Engine{Label: "torch", Devices: []string{"cpu"}}},
		}})
	require.NoError(t, err)
	t.Cleanup(func() { set.Close() })
	require.NoError(t, set.LoadAll(context.Background()))
	require.NoError(t, set.Warmup(context.Background()))
	s, err := New(Options{Models: set})
	require.NoError(t, err)
	return s
}

func getConfig(t *testing.T, s *Server, path string) string {
	t.Helper()
	w := do(t, s, "GET", path, nil)
	require.Equal(t, 200, w.Code, "%s: %s", path, w.Body.String())
	var c triton.ModelConfig
	dec := json.NewDecoder(strings.NewReader(w.Body.String()))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&c), path)
	return w.Body.String()
}

func TestModelConfigOfTheShippedModels(t *testing.T) {
	s := shippedOnFakes(t)
	batching := `"dynamic_batching":{"preferred_batch_size":[1,4,16,32],"max_queue_delay_microseconds":0,"preserve_ordering":false,
		"priority_levels":1,"default_priority_level":1,
		"default_queue_policy":{"timeout_action":"REJECT","default_timeout_microseconds":0,"allow_timeout_override":true,"max_queue_size":1024}}`
	tail := `"model_transaction_policy":{"decoupled":false},"response_cache":{"enable":false}`
	for _, tt := range []struct{ path, want string }{
		{"/v2/models/digits/config", `{"name":"digits","platform":"stepserve_mlp","backend":"stepserve",
			"version_policy":{"latest":{"num_versions":1}},"max_batch_size":32,
			"input":[{"name":"pixels","data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":[64],"is_shape_tensor":false,"optional":false}],
			"output":[{"name":"probabilities","data_type":"TYPE_FP32","dims":[10],"label_filename":"labels.txt","is_shape_tensor":false}],
			` + batching + `,
			"instance_group":[{"name":"digits_cpu","kind":"KIND_CPU","count":1,"passive":false}],
			"parameters":{"stepserve.engine":{"string_value":"cpu"},"stepserve.devices":{"string_value":"cpu"},
				"stepserve.architecture":{"string_value":"mlp"},"stepserve.buckets.batch":{"string_value":"1,4,16,32"},
				"stepserve.device_dtype":{"string_value":"float16"},"stepserve.warmup":{"string_value":"eager"},
				"stepserve.instances.min_ready":{"string_value":"1"}},
			` + tail + `}`},
		{"/v2/models/digits-cnn/versions/1/config", `{"name":"digits-cnn","platform":"pytorch_libtorch","backend":"pytorch",
			"version_policy":{"latest":{"num_versions":1}},"max_batch_size":32,
			"input":[{"name":"image","data_type":"TYPE_FP32","format":"FORMAT_NCHW","dims":[1,8,8],"is_shape_tensor":false,"optional":false}],
			"output":[{"name":"probabilities","data_type":"TYPE_FP32","dims":[10],"label_filename":"labels.txt","is_shape_tensor":false}],
			` + batching + `,
			"instance_group":[{"name":"digits-cnn_cpu","kind":"KIND_CPU","count":1,"passive":false}],
			"parameters":{"stepserve.engine":{"string_value":"torch"},"stepserve.devices":{"string_value":"cpu"},
				"stepserve.architecture":{"string_value":"torch"},"stepserve.buckets.batch":{"string_value":"1,4,16,32"},
				"stepserve.device_dtype":{"string_value":"float16"},"stepserve.warmup":{"string_value":"eager"},
				"stepserve.instances.min_ready":{"string_value":"1"}},
			` + tail + `}`},
		{"/v2/models/tiny-encoder/config", `{"name":"tiny-encoder","platform":"stepserve_encoder","backend":"stepserve",
			"version_policy":{"latest":{"num_versions":1}},"max_batch_size":64,
			"input":[{"name":"text","data_type":"TYPE_STRING","format":"FORMAT_NONE","dims":[],"is_shape_tensor":false,"optional":false}],
			"output":[{"name":"embedding","data_type":"TYPE_FP32","dims":[128],"is_shape_tensor":false}],
			` + strings.Replace(batching, "[1,4,16,32]", "[1,4,16,64]", 1) + `,
			"instance_group":[{"name":"tiny-encoder_cpu","kind":"KIND_CPU","count":1,"passive":false}],
			"parameters":{"stepserve.engine":{"string_value":"cpu"},"stepserve.devices":{"string_value":"cpu"},
				"stepserve.architecture":{"string_value":"encoder"},"stepserve.buckets.batch":{"string_value":"1,4,16,64"},
				"stepserve.buckets.seq":{"string_value":"32,64,128"},
				"stepserve.device_dtype":{"string_value":"float16"},"stepserve.warmup":{"string_value":"eager"},
				"stepserve.instances.min_ready":{"string_value":"1"}},
			` + tail + `}`},
	} {
		assert.JSONEq(t, tt.want, getConfig(t, s, tt.path), tt.path)
	}
	assert.Equal(t, 404, do(t, s, "GET", "/v2/models/nope/config", nil).Code)
	assert.Equal(t, 404, do(t, s, "GET", "/v2/models/digits/versions/2/config", nil).Code)
}

// The batching policy as served (model.yaml over the server's defaults),
// replicas grouped by device, an optional input, and the failover
// engine's standby replica.
func TestModelConfigOfAPlacedModel(t *testing.T) {
	repo := t.TempDir()
	dir := filepath.Join(repo, "summax")
	require.NoError(t, enginetest.WriteSumMax(dir))
	yaml := enginetest.SumMaxYAML + `engine: rbln
batching: {max_queue_delay: 2500us, priority_levels: 3, default_priority_level: 2, default_timeout: 1.5ms, max_queue_size: 10}
instances: {devices: [0, 1], per_device: 2, min_ready: 3}
`
	require.NoError(t, os.WriteFile(filepath.Join(dir, models.ConfigFile), []byte(yaml), 0o644))
	set, err := serving.New(serving.Options{Repository: repo, DefaultEngine: "cpu", Failover: "cpu",
		Engines: map[string]serving.Engine{
			"rbln": {Engine: &enginetest.Engine{Label: "rbln", Devices: []string{"0", "1"}}},
			"cpu":  {Engine: &enginetest.Engine{Label: "cpu", Devices: []string{"cpu"}}},
		}})
	require.NoError(t, err)
	t.Cleanup(func() { set.Close() })
	require.NoError(t, set.LoadAll(context.Background()))
	require.NoError(t, set.Warmup(context.Background()))
	s, err := New(Options{Models: set})
	require.NoError(t, err)

	var c triton.ModelConfig
	require.NoError(t, json.Unmarshal([]byte(getConfig(t, s, "/v2/models/summax/config")), &c))
	assert.Equal(t, &triton.DynamicBatching{PreferredBatchSize: []int32{1, 4}, MaxQueueDelayMicroseconds: 2500, PriorityLevels: 3, DefaultPriorityLevel: 2,
		DefaultQueuePolicy: triton.QueuePolicy{TimeoutAction: "REJECT", DefaultTimeoutMicroseconds: 1500, AllowTimeoutOverride: true, MaxQueueSize: 10}}, c.DynamicBatching)
	assert.Equal(t, int32(4), c.MaxBatchSize)
	assert.Equal(t, []triton.InstanceGroup{
		{Name: "summax_rbln0", Kind: "KIND_MODEL", Count: 2},
		{Name: "summax_rbln1", Kind: "KIND_MODEL", Count: 2},
		{Name: "summax_failover_cpu", Kind: "KIND_CPU", Count: 1, Passive: true},
	}, c.InstanceGroup)
	assert.Equal(t, "rbln", c.Parameters["stepserve.engine"].StringValue)
	assert.Equal(t, "cpu", c.Parameters["stepserve.failover_engine"].StringValue)
	assert.Equal(t, "0,1,0,1", c.Parameters["stepserve.devices"].StringValue, "a device per replica, as placed")
	assert.Equal(t, "3", c.Parameters["stepserve.instances.min_ready"].StringValue)
}
