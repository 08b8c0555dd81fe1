package server

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/server/wire"
	"github.com/stepserve/stepserve/serving"
	"github.com/stepserve/stepserve/steps"
)

func do(t *testing.T, h http.Handler, method, path string, body []byte, headers ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, bytes.NewReader(body))
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

func errorOf(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	var e struct{ Error string }
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &e), w.Body.String())
	return e.Error
}

type response struct {
	ModelName    string `json:"model_name"`
	ModelVersion string `json:"model_version"`
	ID           string `json:"id"`
	Outputs      []struct {
		Name       string
		Datatype   string
		Shape      []int
		Data       []float32
		Parameters map[string]int
	}
}

func TestInferJSON(t *testing.T) {
	s, reg := newTestServer(t, newSumMax(t))
	for _, body := range []string{
		`{"id":"r1","inputs":[{"name":"x","datatype":"FP32","shape":[2,3],"data":[1,2,3,4,5,-6]}]}`,
		`{"id":"r1","inputs":[{"name":"x","datatype":"FP32","shape":[2,3],"data":[[1,2,3],[4,5,-6]]}],"outputs":[{"name":"y"}]}`,
	} {
		w := do(t, s, "POST", "/v2/models/summax/infer", []byte(body))
		require.Equal(t, http.StatusOK, w.Code, w.Body.String())
		assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
		var r response
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &r))
		assert.Equal(t, "summax", r.ModelName)
		assert.Equal(t, "1", r.ModelVersion)
		assert.Equal(t, "r1", r.ID)
		require.Len(t, r.Outputs, 1)
		assert.Equal(t, "y", r.Outputs[0].Name)
		assert.Equal(t, "FP32", r.Outputs[0].Datatype)
		assert.Equal(t, []int{2, 2}, r.Outputs[0].Shape)
		assert.Equal(t, []float32{6, 3, 3, 5}, r.Outputs[0].Data)
	}
	w := do(t, s, "POST", "/v2/models/summax/versions/1/infer", []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,1,1]}]}`))
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	assert.NotContains(t, w.Body.String(), `"id"`)

	assert.Equal(t, 3.0, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", "success", "http")))
	n, err := testutil.GatherAndCount(reg, "stepserve_request_duration_seconds")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
}

// binaryRequest builds a binary-tensor request for x.
func binaryRequest(header string, payload ...float32) ([]byte, string) {
	b := []byte(header)
	for _, v := range payload {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b, strconv.Itoa(len(header))
}

func TestInferBinary(t *testing.T) {
	s, _ := newTestServer(t, newSumMax(t))
	body, hl := binaryRequest(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"parameters":{"binary_data_size":12}}],"outputs":[{"name":"y","parameters":{"binary_data":true}}]}`, 1, 2, 7)
	w := do(t, s, "POST", "/v2/models/summax/infer", body, "Inference-Header-Content-Length", hl, "Content-Type", "application/octet-stream")
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	assert.Equal(t, "application/octet-stream", w.Header().Get("Content-Type"))
	n, err := strconv.Atoi(w.Header().Get("Inference-Header-Content-Length"))
	require.NoError(t, err)
	raw := w.Body.Bytes()
	var r response
	require.NoError(t, json.Unmarshal(raw[:n], &r))
	assert.Equal(t, 8, r.Outputs[0].Parameters["binary_data_size"])
	assert.Nil(t, r.Outputs[0].Data)
	require.Len(t, raw[n:], 8)
	assert.Equal(t, float32(10), math.Float32frombits(binary.LittleEndian.Uint32(raw[n:])))
	assert.Equal(t, float32(7), math.Float32frombits(binary.LittleEndian.Uint32(raw[n+4:])))

	// JSON input, every output binary through the request-level parameter.
	w = do(t, s, "POST", "/v2/models/summax/infer", []byte(`{"parameters":{"binary_data_output":true},"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,1,1]}]}`))
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	assert.NotEmpty(t, w.Header().Get("Inference-Header-Content-Length"))
}

func TestInferBadRequests(t *testing.T) {
	nan, hl := binaryRequest(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"parameters":{"binary_data_size":12}}]}`, 1, float32(math.NaN()), 2)
	short, shl := binaryRequest(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"parameters":{"binary_data_size":12}}]}`, 1, 2)
	lie, lhl := binaryRequest(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"parameters":{"binary_data_size":8}}]}`, 1, 2)
	extra, ehl := binaryRequest(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"parameters":{"binary_data_size":12}}]}`, 1, 2, 3, 4)
	x := func(shape, data string) string {
		return `{"inputs":[{"name":"x","datatype":"FP32","shape":` + shape + `,"data":` + data + `}]}`
	}
	tests := []struct {
		name    string
		path    string
		body    []byte
		headers []string
		status  int
		want    string
	}{
		{"malformed JSON", "", []byte(`{"inputs":[`), nil, 400, "malformed JSON"},
		{"empty body", "", nil, nil, 400, "empty request body"},
		{"NaN literal", "", []byte(x("[1,3]", "[1,NaN,2]")), nil, 400, "NaN is not a JSON number; values must be finite"},
		{"overflowing value", "", []byte(x("[1,3]", "[1,1e39,2]")), nil, 400, `input "x": element 1: 1e39 is not a finite FP32 value`},
		{"NaN in binary", "", nan, []string{"Inference-Header-Content-Length", hl}, 400, `input "x": element 1 is NaN; values must be finite`},
		{"no inputs", "", []byte(`{"inputs":[]}`), nil, 400, `request has no inputs; model summax takes "x" (FP32 [-1 3])`},
		{"unknown input", "", []byte(`{"inputs":[{"name":"z","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`), nil, 400, `unknown input "z"; model summax takes "x"`},
		{"duplicate input", "", []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]},{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`), nil, 400, `input "x" appears more than once`},
		{"wrong datatype", "", []byte(`{"inputs":[{"name":"x","datatype":"INT64","shape":[1,3],"data":[1,2,3]}]}`), nil, 400, `input "x": datatype INT64, want FP32`},
		{"unknown datatype", "", []byte(`{"inputs":[{"name":"x","datatype":"FLOAT","shape":[1,3],"data":[1,2,3]}]}`), nil, 400, `input "x": unknown datatype "FLOAT"`},
		{"wrong rank", "", []byte(x("[3]", "[1,2,3]")), nil, 400, `input "x": shape [3] has 1 dimensions, want 2`},
		{"wrong width", "", []byte(x("[1,4]", "[1,2,3,4]")), nil, 400, `input "x": shape [1 4], want [-1 3]: dimension 1 must be 3`},
		{"negative dim", "", []byte(x("[-1,3]", "[1,2,3]")), nil, 400, `dimension 0 is negative`},
		{"zero rows", "", []byte(x("[0,3]", "[]")), nil, 400, `the batch dimension must be at least 1`},
		{"huge declared shape", "", []byte(x("[1000000,3]", "[1,2,3]")), nil, 400, `declares 3000000 elements, more than a 78-byte body can carry`},
		{"shape over the element limit", "", []byte(x("[100000000,3]", "[1,2,3]")), nil, 400, `the inputs declare 300000000 elements, above the limit of 16777216 (server.max_request_elements)`},
		{"overflowing dim", "", []byte(x("[1e30,3]", "[1,2,3]")), nil, 400, `malformed request: inputs.shape must be an integer`},
		{"too few values", "", []byte(x("[2,3]", "[1,2,3]")), nil, 400, `input "x": shape [2 3] needs 6 values, data has 3`},
		{"too many values", "", []byte(x("[1,3]", "[1,2,3,4]")), nil, 400, `more values than the shape holds (3)`},
		{"string in data", "", []byte(x("[1,3]", `[1,"2",3]`)), nil, 400, `element 1 is a string; want FP32 numbers`},
		{"bool in data", "", []byte(x("[1,3]", `[1,true,3]`)), nil, 400, `true is a boolean`},
		{"null in data", "", []byte(x("[1,3]", `[1,null,3]`)), nil, 400, `element 1 is null`},
		{"no data", "", []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3]}]}`), nil, 400, `has no data; send data or binary_data_size`},
		{"unknown output", "", []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}],"outputs":[{"name":"w"}]}`), nil, 400, `unknown output "w"; model summax gives "y"`},
		{"bad binary_data param", "", []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}],"outputs":[{"name":"y","parameters":{"binary_data":"yes"}}]}`), nil, 400, `parameter binary_data must be true or false`},
		{"header length too big", "", []byte(`{}`), []string{"Inference-Header-Content-Length", "500"}, 400, `Inference-Header-Content-Length 500 exceeds the 2-byte body`},
		{"header length not a number", "", []byte(`{}`), []string{"Inference-Header-Content-Length", "ten"}, 400, `Inference-Header-Content-Length "ten" is not a non-negative integer`},
		{"binary shorter than declared", "", short, []string{"Inference-Header-Content-Length", shl}, 400, `binary_data_size is 12 bytes, but only 8 bytes of binary data remain`},
		{"binary size that lies", "", lie, []string{"Inference-Header-Content-Length", lhl}, 400, `binary_data_size is 8 bytes, but FP32 [1 3] needs 12`},
		{"binary data left over", "", extra, []string{"Inference-Header-Content-Length", ehl}, 400, `4 bytes of binary data follow`},
		{"body over the limit", "", []byte(x("[1,3]", "[1,2,3"+strings.Repeat(" ", 5000)+"]")), nil, 413, "exceeds the 4096-byte limit (server.max_body_bytes)"},
		{"unknown model", "/v2/models/nope/infer", []byte(x("[1,3]", "[1,2,3]")), nil, 404, `Request for unknown model: 'nope' is not found`},
		{"unknown version", "/v2/models/summax/versions/7/infer", []byte(x("[1,3]", "[1,2,3]")), nil, 404, `Request for unknown model: 'summax' version 7 is not found; it serves version 1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newSumMax(t)
			s, _ := newTestServer(t, f)
			path := tt.path
			if path == "" {
				path = "/v2/models/summax/infer"
			}
			w := do(t, s, "POST", path, tt.body, tt.headers...)
			assert.Equal(t, tt.status, w.Code, w.Body.String())
			assert.Contains(t, errorOf(t, w), tt.want)
			assert.Zero(t, f.steps(), "a bad request must never reach the model")
			if tt.status == 400 || tt.status == 413 {
				assert.Equal(t, 1.0, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", "invalid", "http")))
			}
		})
	}
}

func TestInferModelFailures(t *testing.T) {
	body := []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`)
	for _, tt := range []struct {
		err     error
		status  int
		outcome string
	}{
		{errors.New("device on fire"), 500, "error"},
		{fmt.Errorf("worker gone: %w", engine.ErrUnavailable), 503, "rejected"},
	} {
		f := newSumMax(t)
		f.program().Fail(tt.err)
		s, _ := newTestServer(t, f)
		w := do(t, s, "POST", "/v2/models/summax/infer", body)
		assert.Equal(t, tt.status, w.Code)
		assert.Contains(t, errorOf(t, w), tt.err.Error())
		assert.Equal(t, 1.0, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", tt.outcome, "http")))
	}

	f := newSumMax(t)
	f.program().SetHealthy(false)
	s, _ := newTestServer(t, f)
	w := do(t, s, "POST", "/v2/models/summax/infer", body)
	assert.Equal(t, 503, w.Code)
	assert.Equal(t, "1", w.Header().Get("Retry-After"))
	assert.Equal(t, "model summax is not ready", errorOf(t, w))
	assert.Equal(t, 1.0, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", "rejected", "http")))
}

func TestRequestParameters(t *testing.T) {
	f := newSumMax(t)
	s, _ := newTestServer(t, f)
	body := []byte(`{"parameters":{"priority":1,"timeout":1500},"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`)
	req, err := wire.DecodeRequest(body, -1, f.program().Model, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, serving.Params{Priority: 1, Timeout: 1500 * time.Microsecond}, req.ForModel().Params)
	w := do(t, s, "POST", "/v2/models/summax/infer", body)
	require.Equal(t, 200, w.Code, w.Body.String())

	w = do(t, s, "POST", "/v2/models/summax/infer", []byte(`{"parameters":{"timeout":-1},"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`))
	assert.Equal(t, 400, w.Code)
	assert.Contains(t, errorOf(t, w), "parameter timeout must be a non-negative integer, got -1 (microseconds)")
}

func TestExplainEndpoint(t *testing.T) {
	f := newSumMax(t)
	s, _ := newTestServer(t, f)
	f.eng.Explain = func() engine.Explain {
		return engine.Explain{Measured: true, Clean: true, H2D: 1, D2H: 1, Recompiles: 1}
	}
	require.Equal(t, 200, do(t, s, "POST", "/v2/models/summax/infer", []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[3,3],"data":[1,2,3,4,5,6,7,8,9]}]}`)).Code)
	w := do(t, s, "GET", "/v2/models/summax/explain", nil)
	require.Equal(t, 200, w.Code)
	var got struct {
		Name          string
		NonCleanSteps []steps.Record `json:"non_clean_steps"`
	}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &got))
	assert.Equal(t, "summax", got.Name)
	require.Len(t, got.NonCleanSteps, 1)
	assert.Equal(t, "b4", got.NonCleanSteps[0].Bucket)
	assert.Equal(t, 3, got.NonCleanSteps[0].Rows)
	assert.Equal(t, int64(1), got.NonCleanSteps[0].Signals["recompile"])
	assert.Equal(t, 404, do(t, s, "GET", "/v2/models/other/explain", nil).Code)
}

func TestHealthAndMetadata(t *testing.T) {
	f := newSumMax(t)
	s, _ := newTestServer(t, f)

	assert.Equal(t, 200, do(t, s, "GET", "/v2/health/live", nil).Code)
	assert.Equal(t, 200, do(t, s, "GET", "/v2/health/ready", nil).Code)
	assert.Equal(t, 200, do(t, s, "GET", "/v2/models/summax/ready", nil).Code)
	assert.Equal(t, 200, do(t, s, "GET", "/v2/models/summax/versions/1/ready", nil).Code)
	f.program().SetHealthy(false)
	assert.Equal(t, 503, do(t, s, "GET", "/v2/health/ready", nil).Code)
	assert.Equal(t, 503, do(t, s, "GET", "/v2/models/summax/ready", nil).Code)
	assert.Equal(t, 200, do(t, s, "GET", "/v2/health/live", nil).Code)
	f.program().SetHealthy(true)

	var meta struct {
		Name       string
		Version    string
		Extensions []string
	}
	require.NoError(t, json.Unmarshal(do(t, s, "GET", "/v2", nil).Body.Bytes(), &meta))
	assert.Equal(t, "stepserve", meta.Name)
	assert.Equal(t, "test", meta.Version)
	assert.Contains(t, meta.Extensions, "binary_tensor_data")

	w := do(t, s, "GET", "/v2/models/summax", nil)
	require.Equal(t, 200, w.Code)
	assert.JSONEq(t, `{"name":"summax","versions":["1"],"platform":"stepserve_mlp",
		"inputs":[{"name":"x","datatype":"FP32","shape":[-1,3]}],
		"outputs":[{"name":"y","datatype":"FP32","shape":[-1,2]}]}`, w.Body.String())
	assert.Equal(t, 200, do(t, s, "GET", "/v2/models/summax/versions/1", nil).Code)
	assert.Equal(t, 404, do(t, s, "GET", "/v2/models/summax/versions/2", nil).Code)
	w = do(t, s, "GET", "/v2/models/..%2F..%2Fetc/ready", nil)
	assert.Equal(t, 404, w.Code)
	assert.NotContains(t, w.Body.String(), "etc")

	w = do(t, s, "GET", "/v2/nothing", nil)
	assert.Equal(t, 404, w.Code)
	assert.Contains(t, errorOf(t, w), "no endpoint GET /v2/nothing")
	assert.Equal(t, 405, do(t, s, "GET", "/v2/models/summax/infer", nil).Code)

	w = do(t, s, "GET", "/metrics", nil)
	require.Equal(t, 200, w.Code)
	body, _ := io.ReadAll(w.Body)
	assert.Contains(t, string(body), `stepserve_requests_total{model="summax",outcome="success",protocol="http"} 0`)
}

// Inference requests the server routes itself answer exactly as the router
// would: same status, same body, auth included.
func TestDirectInferRouteAgreesWithRouter(t *testing.T) {
	for _, tokens := range [][]string{nil, {"s3cret"}} {
		s, err := New(Options{Models: newSumMax(t).set, InferenceTokens: tokens})
		require.NoError(t, err)
		body := `{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`
		for _, path := range []string{
			"/v2/models/summax/infer", "/v2/models/nosuch/infer", "/v2/models//infer",
			"/v2/models/summax/infer/", "/v2/models/sum%2Fmax/infer", "/v2/models/a/b/infer",
			"/v2/models/summax/versions/1/infer",
		} {
			for _, auth := range []string{"", "Bearer s3cret", "Bearer wrong"} {
				req := func() *http.Request {
					r := httptest.NewRequest("POST", path, strings.NewReader(body))
					if auth != "" {
						r.Header.Set("Authorization", auth)
					}
					return r
				}
				direct, routed := httptest.NewRecorder(), httptest.NewRecorder()
				s.ServeHTTP(direct, req())
				s.router.ServeHTTP(routed, req())
				assert.Equal(t, routed.Code, direct.Code, "%s %q", path, auth)
				assert.Equal(t, routed.Body.String(), direct.Body.String(), "%s %q", path, auth)
			}
		}
	}
}

// TestRequestLog: every inference request is logged at debug, or at info
// with log.requests, saying what it was and how it went.
func TestRequestLog(t *testing.T) {
	f := newSumMax(t)
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s, err := New(Options{Models: f.set, Logger: logger, LogRequests: true})
	require.NoError(t, err)
	do(t, s, "POST", "/v2/models/summax/infer", []byte(`{"id":"req-7","inputs":[{"name":"x","datatype":"FP32","shape":[2,3],"data":[1,2,3,4,5,6]}]}`))
	do(t, s, "POST", "/v2/models/summax/infer", []byte(`{"inputs":[{"name":"nope","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`))
	log := buf.String()
	assert.Regexp(t, `msg=request protocol=http method=POST path=/v2/models/summax/infer model=summax status=200 rows=2 bytes=\d+ took=\S+ id=req-7`, log)
	assert.Regexp(t, `msg=request protocol=http .* status=400 rows=0`, log)

	buf.Reset()
	s, err = New(Options{Models: f.set, Logger: logger})
	require.NoError(t, err)
	do(t, s, "POST", "/v2/models/summax/infer", []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`))
	assert.NotContains(t, buf.String(), "msg=request", "without log.requests, requests are debug lines")
}
