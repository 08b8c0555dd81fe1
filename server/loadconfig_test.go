package server

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loadBody is a repository load request carrying config, as tritonclient's
// load_model(config=...) sends it.
func loadBody(t *testing.T, config string) []byte {
	b, err := json.Marshal(map[string]any{"parameters": map[string]any{"config": config}})
	require.NoError(t, err)
	return b
}

// TestLoadWithConfig: a load's config applies Triton's scheduling keys over
// model.yaml (batch buckets, the batching policy, instances) after checking
// them as model.yaml is checked; any other key, model files, or a config
// that is not JSON is refused naming what, and nothing is loaded.
func TestLoadWithConfig(t *testing.T) {
	f := newSumMax(t)
	reg := prometheus.NewRegistry()
	s, err := New(Options{Models: f.set, ModelControl: true, Registerer: reg, Gatherer: reg})
	require.NoError(t, err)

	w := do(t, s, "POST", "/v2/repository/models/summax/load", loadBody(t, `{"name":"summax","max_batch_size":8,
		"dynamic_batching":{"preferred_batch_size":[2,4],"max_queue_delay_microseconds":"1500","priority_levels":3,"default_priority_level":2,
		"default_queue_policy":{"default_timeout_microseconds":250000,"max_queue_size":7}},
		"instance_group":[{"count":2,"kind":"KIND_CPU"}]}`))
	require.Equal(t, 200, w.Code, w.Body.String())
	m, ok := f.set.Model("summax")
	require.True(t, ok)
	cfg := m.Model().Config
	assert.Equal(t, []int{2, 4, 8}, cfg.Buckets.Batch, "preferred sizes and max_batch_size are the batch buckets")
	assert.Equal(t, "1.5ms", cfg.Batching.MaxQueueDelay.String())
	assert.Equal(t, 3, *cfg.Batching.PriorityLevels)
	assert.Equal(t, 2, *cfg.Batching.DefaultPriorityLevel)
	assert.Equal(t, "250ms", cfg.Batching.DefaultTimeout.String())
	assert.Equal(t, 7, *cfg.Batching.MaxQueueSize)
	assert.Equal(t, 2, cfg.Instances.PerDevice)
	infer := []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[8,3],"data":[1,2,3,1,2,3,1,2,3,1,2,3,1,2,3,1,2,3,1,2,3,1,2,3]}]}`)
	assert.Equal(t, 200, do(t, s, "POST", "/v2/models/summax/infer", infer).Code)

	w = do(t, s, "POST", "/v2/repository/models/summax/load", loadBody(t, `{"max_batch_size":2}`))
	require.Equal(t, 200, w.Code, w.Body.String())
	m, _ = f.set.Model("summax")
	assert.Equal(t, []int{1, 2}, m.Model().Config.Buckets.Batch, "max_batch_size alone keeps model.yaml's smaller buckets")

	for _, tc := range []struct{ name, body, want string }{
		{"other key", string(loadBody(t, `{"input":[{"name":"x"}]}`)), "failed to load 'summax', load config: input: cannot be changed at load (it is model.yaml's); stepserve applies name, max_batch_size, dynamic_batching and instance_group"},
		{"wrong name", string(loadBody(t, `{"name":"other"}`)), `load config: name: must be "summax", the model being loaded`},
		{"unknown batching key", string(loadBody(t, `{"dynamic_batching":{"preserve_ordering":true}}`)), "load config: dynamic_batching.preserve_ordering: cannot be set at load"},
		{"two groups", string(loadBody(t, `{"instance_group":[{"count":1},{"count":1}]}`)), "load config: instance_group: give one group"},
		{"preferred above max", string(loadBody(t, `{"max_batch_size":4,"dynamic_batching":{"preferred_batch_size":[8]}}`)), "preferred_batch_size 8 exceeds max_batch_size 4"},
		{"invalid policy", string(loadBody(t, `{"dynamic_batching":{"priority_levels":2,"default_priority_level":5}}`)), "default_priority_level"},
		{"not json", string(loadBody(t, `{"max_batch_size":`)), "load parameter config is not a JSON object"},
		{"config not a string", `{"parameters":{"config":{"max_batch_size":2}}}`, `load parameter "config" must be a string`},
		{"files", `{"parameters":{"file:1/model.onnx":"AAAA"}}`, `load parameter "file:1/model.onnx": model files sent with the load are not supported`},
		{"unknown parameter", `{"parameters":{"flavour":"x"}}`, `load parameter "flavour" is not supported; want config`},
		{"not parameters", `{"config":"{}"}`, `load request: want {"parameters": {...}}`},
		{"config twice", `{"parameters":{"config":"{\"max_batch_size\":4}","config":"{}"}}`, `load parameter "config" is given twice`},
		{"parameters twice", `{"parameters":{},"parameters":{"config":"{}"}}`, `load request: "parameters" is given twice`},
		{"parameters in two spellings", `{"parameters":{"config":"{}"},"Parameters":{"config":"{\"max_batch_size\":4}"}}`, `load request: want {"parameters": {...}}; "Parameters" is not a key of it`},
		{"something after the object", `{"parameters":{"config":"{}"},"Parameters":{"config":"{\"max_batch_size\":4}"}} 1`, `load request: want one JSON object {"parameters": {...}}; something follows it`},
	} {
		w := do(t, s, "POST", "/v2/repository/models/summax/load", []byte(tc.body))
		assert.Equal(t, 400, w.Code, tc.name)
		msg := errorOf(t, w)
		assert.Contains(t, msg, tc.want, tc.name)
		assert.True(t, strings.HasPrefix(msg, "failed to load 'summax', "), "%s: Triton's words first: %s", tc.name, msg)
	}
	m, _ = f.set.Model("summax")
	assert.Equal(t, []int{1, 2}, m.Model().Config.Buckets.Batch, "a refused load leaves the model served as it was")
}

// TestLoadConfigIsProtoJSON: the config is read by protobuf's JSON rules,
// as Triton reads it: integers (64-bit ones included) as numbers or
// strings, enums by name or number, fields by their proto or
// lowerCamelCase names, null as left out. A value of the wrong kind, an
// enum value the proto does not have and a field stepserve does not take
// are refused naming the field and what it takes.
func TestLoadConfigIsProtoJSON(t *testing.T) {
	f := newSumMax(t)
	reg := prometheus.NewRegistry()
	s, err := New(Options{Models: f.set, ModelControl: true, Registerer: reg, Gatherer: reg})
	require.NoError(t, err)
	load := func(config string) *httptest.ResponseRecorder {
		return do(t, s, "POST", "/v2/repository/models/summax/load", loadBody(t, config))
	}

	w := load(`{"name":"summax","max_batch_size":"8","maxBatchSize":null,
		"dynamic_batching":{"preferredBatchSize":["2",4],"max_queue_delay_microseconds":"1500","priority_levels":"3","defaultPriorityLevel":"2",
		"default_queue_policy":{"default_timeout_microseconds":"250000","maxQueueSize":"7"}},
		"instance_group":[{"count":"2","kind":"KIND_CPU"}]}`)
	require.Equal(t, 200, w.Code, w.Body.String())
	m, ok := f.set.Model("summax")
	require.True(t, ok)
	cfg := m.Model().Config
	assert.Equal(t, []int{2, 4, 8}, cfg.Buckets.Batch)
	assert.Equal(t, "1.5ms", cfg.Batching.MaxQueueDelay.String())
	assert.Equal(t, 3, *cfg.Batching.PriorityLevels)
	assert.Equal(t, 2, *cfg.Batching.DefaultPriorityLevel)
	assert.Equal(t, "250ms", cfg.Batching.DefaultTimeout.String())
	assert.Equal(t, 7, *cfg.Batching.MaxQueueSize)
	assert.Equal(t, 2, cfg.Instances.PerDevice)

	w = load(`{"max_batch_size":2,"instance_group":[{"count":1,"kind":2}]}`)
	require.Equal(t, 200, w.Code, "an enum by its number: %s", w.Body.String())
	m, _ = f.set.Model("summax")
	assert.Equal(t, []int{1, 2}, m.Model().Config.Buckets.Batch)
	assert.Equal(t, 1, m.Model().Config.Instances.PerDevice)

	const (
		int32s  = "want a 32-bit integer (a number, or a string holding one)"
		uint64s = "want a non-negative 64-bit integer (a number, or a string holding one)"
		kinds   = "want one of KIND_AUTO, KIND_GPU, KIND_CPU, KIND_MODEL (or its number)"
	)
	for _, tc := range []struct{ name, config, want string }{
		{"words for a number", `{"max_batch_size":"eight"}`, `load config: max_batch_size: ` + int32s + `; got "eight"`},
		{"a fraction", `{"max_batch_size":2.5}`, `load config: max_batch_size: ` + int32s + `; got 2.5`},
		{"past 32 bits", `{"max_batch_size":"4294967296"}`, `load config: max_batch_size: ` + int32s + `; got "4294967296"`},
		{"negative unsigned", `{"dynamic_batching":{"max_queue_delay_microseconds":-1}}`, `load config: dynamic_batching.max_queue_delay_microseconds: ` + uint64s + `; got -1`},
		{"a list of words", `{"dynamic_batching":{"preferred_batch_size":["two"]}}`, `load config: dynamic_batching.preferred_batch_size: want a list, each a 32-bit integer`},
		{"an enum name the proto lacks", `{"instance_group":[{"kind":"KIND_TPU"}]}`, `load config: instance_group[0].kind: ` + kinds + `; got "KIND_TPU"`},
		{"an enum number the proto lacks", `{"instance_group":[{"kind":9}]}`, `load config: instance_group[0].kind: ` + kinds + `; got 9`},
		{"a name that is not a string", `{"name":7}`, `load config: name: want a string; got 7`},
		{"an unknown field", `{"max_batch_sise":8}`, `load config: max_batch_sise: cannot be changed at load (it is model.yaml's); stepserve applies name, max_batch_size, dynamic_batching and instance_group`},
		{"an unknown nested field", `{"dynamic_batching":{"max_queue_delay_microsecond":100}}`, `load config: dynamic_batching.max_queue_delay_microsecond: cannot be set at load; ` +
			`stepserve takes preferred_batch_size, max_queue_delay_microseconds, priority_levels, default_priority_level and default_queue_policy`},
		{"an unknown group field", `{"instance_group":[{"count":1,"rate_limiter":{}}]}`, `load config: instance_group[0].rate_limiter: cannot be set at load; stepserve takes name, kind, count and gpus`},
		{"a list for an object", `{"dynamic_batching":[1]}`, `load config: dynamic_batching: want an object; got [1]`},
		{"both spellings", `{"max_batch_size":2,"maxBatchSize":4}`, `load config: max_batch_size: given twice (as max_batch_size and maxBatchSize)`},
		{"one key twice", `{"max_batch_size":2,"max_batch_size":4}`, `load config: max_batch_size: given twice`},
		{"a nested key twice", `{"dynamic_batching":{"priority_levels":2,"priority_levels":3}}`, `load config: dynamic_batching.priority_levels: given twice`},
		{"a group's key twice", `{"instance_group":[{"count":1,"count":2}]}`, `load config: instance_group[0].count: given twice`},
		{"a zero batch", `{"max_batch_size":"0"}`, `load config: max_batch_size: want a positive integer; got 0`},
	} {
		w := load(tc.config)
		assert.Equal(t, 400, w.Code, tc.name)
		msg := errorOf(t, w)
		assert.True(t, strings.HasPrefix(msg, "failed to load 'summax', "+tc.want), "%s: %s", tc.name, msg)
	}
	m, _ = f.set.Model("summax")
	assert.Equal(t, []int{1, 2}, m.Model().Config.Buckets.Batch, "a refused load leaves the model served as it was")
}

// TestSharedMemoryParametersAreRefused: a tensor that names a
// shared-memory region that is not registered gets 400 naming it, never
// its data inline with 200.
func TestSharedMemoryParametersAreRefused(t *testing.T) {
	s, _ := newTestServer(t, newSumMax(t))
	for _, body := range []string{
		`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"parameters":{"shared_memory_region":"in0","shared_memory_byte_size":12}}]}`,
		`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}],"outputs":[{"name":"y","parameters":{"shared_memory_region":"out0","shared_memory_byte_size":8}}]}`,
	} {
		w := do(t, s, "POST", "/v2/models/summax/infer", []byte(body))
		assert.Equal(t, 400, w.Code)
		assert.Contains(t, errorOf(t, w), "Unable to find shared memory region: ")
	}
}
