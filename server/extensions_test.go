package server

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// GET /v2 lists the extensions the server implements, and /v2/ answers
// the same.
func TestServerMetadataListsTheExtensions(t *testing.T) {
	s, _ := newTestServer(t, newSumMax(t))
	for _, path := range []string{"/v2", "/v2/"} {
		w := do(t, s, "GET", path, nil)
		require.Equal(t, 200, w.Code, path)
		var meta struct {
			Name       string
			Extensions []string
		}
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &meta))
		assert.Equal(t, "stepserve", meta.Name)
		assert.Subset(t, meta.Extensions, []string{"binary_tensor_data", "classification", "model_repository", "schedule_policy", "system_shared_memory"}, path)
		for _, no := range []string{"cuda_shared_memory", "trace", "sequence", "parameters"} {
			assert.NotContains(t, meta.Extensions, no, path)
		}
	}
}

// The endpoints of extensions stepserve does not implement answer 501
// naming the extension, whatever the method.
func TestUnsupportedExtensionsAnswer501(t *testing.T) {
	s, _ := newTestServer(t, newSumMax(t))
	for _, tt := range []struct{ method, path, extension string }{
		{"POST", "/v2/cudasharedmemory/region/r0/register", "cuda_shared_memory"},
		{"GET", "/v2/cudasharedmemory", "cuda_shared_memory"},
		{"GET", "/v2/cudasharedmemory/elsewhere", "cuda_shared_memory"},
		{"GET", "/v2/trace/setting", "trace"},
		{"POST", "/v2/trace/setting", "trace"},
		{"GET", "/v2/models/summax/trace/setting", "trace"},
		{"POST", "/v2/models/summax/trace/setting", "trace"},
	} {
		w := do(t, s, tt.method, tt.path, []byte(`{}`))
		assert.Equal(t, 501, w.Code, "%s %s", tt.method, tt.path)
		assert.Contains(t, errorOf(t, w), "the "+tt.extension+" extension is not supported", "%s %s", tt.method, tt.path)
	}
}

// An output's binary_data overrides the request's binary_data_output,
// both ways, as in Triton.
func TestOutputBinaryDataOverridesTheRequestDefault(t *testing.T) {
	s, _ := newTestServer(t, newSumMax(t))
	body := func(params, output string) []byte {
		return []byte(`{"parameters":` + params + `,"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}],"outputs":[` + output + `]}`)
	}
	for _, tt := range []struct {
		name, params, output string
		binary               bool
	}{
		{"output false over request true", `{"binary_data_output":true}`, `{"name":"y","parameters":{"binary_data":false}}`, false},
		{"output true over request false", `{"binary_data_output":false}`, `{"name":"y","parameters":{"binary_data":true}}`, true},
		{"request true, output silent", `{"binary_data_output":true}`, `{"name":"y"}`, true},
		{"request silent, output silent", `{}`, `{"name":"y"}`, false},
	} {
		w := do(t, s, "POST", "/v2/models/summax/infer", body(tt.params, tt.output))
		require.Equal(t, 200, w.Code, "%s: %s", tt.name, w.Body.String())
		hl := w.Header().Get("Inference-Header-Content-Length")
		if !tt.binary {
			assert.Empty(t, hl, tt.name)
			assert.JSONEq(t, `{"model_name":"summax","model_version":"1","outputs":[{"name":"y","datatype":"FP32","shape":[1,2],"data":[6,3]}]}`, w.Body.String(), tt.name)
			continue
		}
		n, err := strconv.Atoi(hl)
		require.NoError(t, err, tt.name)
		assert.JSONEq(t, `{"model_name":"summax","model_version":"1","outputs":[{"name":"y","datatype":"FP32","shape":[1,2],"parameters":{"binary_data_size":8}}]}`, w.Body.String()[:n], tt.name)
		assert.Len(t, w.Body.Bytes()[n:], 8, tt.name)
	}
}

// CUDA shared memory answers as a Triton without GPUs does: no region
// to list, unregistering succeeds (Triton's example clients unregister
// everything at start and at exit), a region named is not found.
func TestCUDASharedMemoryAsWithoutGPUs(t *testing.T) {
	s, _ := newTestServer(t, newSumMax(t))
	w := do(t, s, "GET", "/v2/cudasharedmemory/status", nil)
	assert.Equal(t, 200, w.Code)
	assert.JSONEq(t, `[]`, w.Body.String())
	for _, path := range []string{"/v2/cudasharedmemory/unregister", "/v2/cudasharedmemory/region/r0/unregister"} {
		w = do(t, s, "POST", path, []byte(`{}`))
		assert.Equal(t, 200, w.Code, path)
	}
	w = do(t, s, "GET", "/v2/cudasharedmemory/region/r0/status", nil)
	assert.Equal(t, 404, w.Code)
	assert.Contains(t, errorOf(t, w), `Unable to find cuda shared memory region: "r0"`)
}
