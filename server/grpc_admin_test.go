package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/server/core"
	pb "github.com/stepserve/stepserve/server/inferencepb"
)

func TestGRPCRepository(t *testing.T) {
	f := newSumMax(t)
	reg := prometheus.NewRegistry()
	s, err := New(Options{Models: f.set, ModelControl: true, Registerer: reg})
	require.NoError(t, err)
	c, _ := grpcClients(t, s)
	ctx := context.Background()

	idx, err := c.RepositoryIndex(ctx, &pb.RepositoryIndexRequest{})
	require.NoError(t, err)
	require.Len(t, idx.Models, 1)
	assert.Equal(t, "summax", idx.Models[0].Name)
	assert.Equal(t, "1", idx.Models[0].Version)
	assert.Equal(t, "READY", idx.Models[0].State)

	_, err = c.RepositoryIndex(ctx, &pb.RepositoryIndexRequest{RepositoryName: "other"})
	code, msg := codeOf(err)
	assert.Equal(t, codes.InvalidArgument, code)
	assert.Contains(t, msg, "stepserve serves one model repository")

	// Triton's client always sends unload_dependents.
	_, err = c.RepositoryModelUnload(ctx, &pb.RepositoryModelUnloadRequest{ModelName: "summax",
		Parameters: map[string]*pb.ModelRepositoryParameter{"unload_dependents": {ParameterChoice: &pb.ModelRepositoryParameter_BoolParam{BoolParam: false}}}})
	require.NoError(t, err)
	_, err = c.ModelInfer(ctx, typedX([]int64{1, 3}, 1, 2, 3))
	code, _ = codeOf(err)
	assert.Equal(t, codes.NotFound, code)
	assert.Zero(t, testutil.CollectAndCount(reg, "stepserve_requests_total"), "unload deletes the model's series")
	idx, err = c.RepositoryIndex(ctx, &pb.RepositoryIndexRequest{Ready: true})
	require.NoError(t, err)
	assert.Empty(t, idx.Models)
	// The repository holds it, unloaded: not ready, as Triton answers,
	// rather than unknown.
	mr, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "summax"})
	require.NoError(t, err)
	assert.False(t, mr.Ready)
	_, err = c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "nope"})
	code, _ = codeOf(err)
	assert.Equal(t, codes.NotFound, code, "a name the repository does not hold")
	_, err = c.RepositoryModelUnload(ctx, &pb.RepositoryModelUnloadRequest{ModelName: "summax"})
	code, msg = codeOf(err)
	assert.Equal(t, codes.NotFound, code)
	assert.Contains(t, msg, `unload summax: serving: unknown model: "summax" is not loaded`)

	strParam := func(s string) *pb.ModelRepositoryParameter {
		return &pb.ModelRepositoryParameter{ParameterChoice: &pb.ModelRepositoryParameter_StringParam{StringParam: s}}
	}
	_, err = c.RepositoryModelLoad(ctx, &pb.RepositoryModelLoadRequest{ModelName: "summax",
		Parameters: map[string]*pb.ModelRepositoryParameter{"config": strParam(`{"input":[]}`)}})
	code, msg = codeOf(err)
	assert.Equal(t, codes.InvalidArgument, code)
	assert.Contains(t, msg, `failed to load 'summax', load config: input: cannot be changed at load`)
	_, err = c.RepositoryModelLoad(ctx, &pb.RepositoryModelLoadRequest{ModelName: "summax",
		Parameters: map[string]*pb.ModelRepositoryParameter{"file:1/model.onnx": strParam("x")}})
	code, msg = codeOf(err)
	assert.Equal(t, codes.InvalidArgument, code)
	assert.Contains(t, msg, `failed to load 'summax', load parameter "file:1/model.onnx": model files sent with the load are not supported`)
	_, err = c.RepositoryModelLoad(ctx, &pb.RepositoryModelLoadRequest{ModelName: "summax",
		Parameters: map[string]*pb.ModelRepositoryParameter{"config": strParam(`{"max_batch_size":2}`)}})
	require.NoError(t, err, "a config's scheduling keys apply, as over HTTP")
	_, err = c.RepositoryModelLoad(ctx, &pb.RepositoryModelLoadRequest{ModelName: "summax"})
	require.NoError(t, err)
	resp, err := c.ModelInfer(ctx, typedX([]int64{1, 3}, 1, 2, 3))
	require.NoError(t, err)
	assert.Equal(t, [][]byte{fp32(6, 3)}, resp.RawOutputContents)
	assert.Equal(t, 1.0, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", "success", "grpc")), "a loaded model's grpc series are back")
	_, err = c.RepositoryModelLoad(ctx, &pb.RepositoryModelLoadRequest{ModelName: "nope"})
	code, _ = codeOf(err)
	assert.Equal(t, codes.NotFound, code)

	// Model control off: the index answers, as Triton's and HTTP's do;
	// loading and unloading are refused with PermissionDenied, as HTTP's
	// 403.
	s2, _ := newTestServer(t, newSumMax(t))
	c2, _ := grpcClients(t, s2)
	idx, err = c2.RepositoryIndex(ctx, &pb.RepositoryIndexRequest{Ready: true})
	require.NoError(t, err)
	require.Len(t, idx.Models, 1)
	assert.Equal(t, "summax", idx.Models[0].Name)
	assert.Equal(t, "READY", idx.Models[0].State)
	_, err = c2.RepositoryModelLoad(ctx, &pb.RepositoryModelLoadRequest{ModelName: "summax"})
	code, msg = codeOf(err)
	assert.Equal(t, codes.PermissionDenied, code)
	assert.Contains(t, msg, "model control is disabled")
	_, err = c2.RepositoryModelUnload(ctx, &pb.RepositoryModelUnloadRequest{ModelName: "summax"})
	code, _ = codeOf(err)
	assert.Equal(t, codes.PermissionDenied, code)
}

// The index takes the token HTTP's index takes: with model control off,
// the inference token unless the repository API has one.
func TestGRPCRepositoryIndexTokens(t *testing.T) {
	const tok, repoTok = "token-0123456789abcdef", "repo-token-0123456789"
	bearer := func(t string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+t)
	}
	for _, tc := range []struct {
		name     string
		opts     Options
		accepted string
		refused  []string
	}{
		{"inference token only", Options{InferenceTokens: []string{tok}}, tok, []string{"", repoTok}},
		{"both tokens", Options{InferenceTokens: []string{tok}, RepositoryTokens: []string{repoTok}}, repoTok, []string{"", tok}},
		{"model control", Options{ModelControl: true, InferenceTokens: []string{tok}, RepositoryTokens: []string{repoTok}}, repoTok, []string{"", tok}},
	} {
		tc.opts.Models = newSumMax(t).set
		s, err := New(tc.opts)
		require.NoError(t, err, tc.name)
		c, _ := grpcClients(t, s)
		idx, err := c.RepositoryIndex(bearer(tc.accepted), &pb.RepositoryIndexRequest{})
		require.NoError(t, err, tc.name)
		assert.Len(t, idx.Models, 1, tc.name)
		for _, refused := range tc.refused {
			_, err := c.RepositoryIndex(bearer(refused), &pb.RepositoryIndexRequest{})
			code, _ := codeOf(err)
			assert.Equal(t, codes.Unauthenticated, code, "%s: %q", tc.name, refused)
			assert.Equal(t, 401, do(t, s, "GET", "/v2/repository/index", nil, "Authorization", "Bearer "+refused).Code, "%s: HTTP agrees, %q", tc.name, refused)
		}
		assert.Equal(t, 200, do(t, s, "GET", "/v2/repository/index", nil, "Authorization", "Bearer "+tc.accepted).Code, "%s: HTTP agrees", tc.name)
	}
}

// The request metrics carry protocol: both protocols' series exist at
// zero once gRPC is served, and each counts its own requests.
func TestGRPCMetricsProtocolLabel(t *testing.T) {
	s, reg := newTestServer(t, newSumMax(t))
	n, err := testutil.GatherAndCount(reg, "stepserve_requests_total")
	require.NoError(t, err)
	assert.Equal(t, len(core.OutcomeLabels), n, "http only, until gRPC is served")
	c, _ := grpcClients(t, s)
	n, err = testutil.GatherAndCount(reg, "stepserve_requests_total")
	require.NoError(t, err)
	assert.Equal(t, 2*len(core.OutcomeLabels), n)
	_, err = c.ModelInfer(context.Background(), typedX([]int64{1, 3}, 1, 2, 3))
	require.NoError(t, err)
	require.Equal(t, 200, do(t, s, "POST", "/v2/models/summax/infer", []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`)).Code)
	_, err = c.ModelInfer(context.Background(), typedX([]int64{1, 4}, 1, 2, 3, 4))
	require.Error(t, err)
	assert.Equal(t, 1.0, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", "success", "grpc")))
	assert.Equal(t, 1.0, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", "success", "http")))
	assert.Equal(t, 1.0, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", "invalid", "grpc")))
	n, err = testutil.GatherAndCount(reg, "stepserve_request_duration_seconds")
	require.NoError(t, err)
	assert.Equal(t, 2, n, "a duration series per protocol")
}

// ModelConfig and ModelStatistics answer the documents the HTTP API
// serves, parsed into the protocol's messages: the two protocols agree.
func TestGRPCModelConfigAndStatistics(t *testing.T) {
	s, _ := newTestServer(t, newSumMax(t))
	c, _ := grpcClients(t, s)
	ctx := context.Background()
	_, err := c.ModelInfer(ctx, typedX([]int64{1, 3}, 1, 2, 3))
	require.NoError(t, err)

	cfg, err := c.ModelConfig(ctx, &pb.ModelConfigRequest{Name: "summax"})
	require.NoError(t, err)
	assert.Equal(t, "summax", cfg.Config.Name)
	assert.Equal(t, int32(4), cfg.Config.MaxBatchSize, "the largest batch bucket")
	assert.Equal(t, pb.DataType_TYPE_FP32, cfg.Config.Input[0].DataType)
	assert.Equal(t, []int64{3}, cfg.Config.Input[0].Dims)
	assert.Equal(t, pb.ModelInput_FORMAT_NONE, cfg.Config.Input[0].Format, "the format the HTTP document names, as the protocol's enum")
	assert.Equal(t, []int32{1, 4}, cfg.Config.GetDynamicBatching().GetPreferredBatchSize())
	w := do(t, s, "GET", "/v2/models/summax/config", nil)
	require.Equal(t, 200, w.Code)
	var httpCfg map[string]any
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &httpCfg))
	assert.EqualValues(t, httpCfg["max_batch_size"], cfg.Config.MaxBatchSize, "gRPC and HTTP serve the same configuration")

	st, err := c.ModelStatistics(ctx, &pb.ModelStatisticsRequest{Name: "summax"})
	require.NoError(t, err)
	require.Len(t, st.ModelStats, 1)
	assert.Equal(t, uint64(1), st.ModelStats[0].InferenceCount)
	assert.Equal(t, uint64(1), st.ModelStats[0].InferenceStats.Success.Count)
	assert.Positive(t, st.ModelStats[0].InferenceStats.Success.Ns)
	all, err := c.ModelStatistics(ctx, &pb.ModelStatisticsRequest{})
	require.NoError(t, err)
	assert.Len(t, all.ModelStats, 1, "every model when none is named")

	_, err = c.ModelConfig(ctx, &pb.ModelConfigRequest{Name: "nope"})
	code, _ := codeOf(err)
	assert.Equal(t, codes.NotFound, code)
	_, err = c.ModelStatistics(ctx, &pb.ModelStatisticsRequest{Name: "nope"})
	code, _ = codeOf(err)
	assert.Equal(t, codes.NotFound, code)
}

// TestGRPCClassification: an output asked for with the classification
// parameter comes back as its top classes, as over HTTP.
func TestGRPCClassification(t *testing.T) {
	s, _ := newTestServer(t, newSumMax(t))
	c, _ := grpcClients(t, s)
	req := typedX([]int64{1, 3}, 1, 2, 3) // y = [sum 6, max 3]
	req.Outputs = []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "y", Parameters: map[string]*pb.InferParameter{"classification": {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: 2}}}}}
	resp, err := c.ModelInfer(context.Background(), req)
	require.NoError(t, err)
	require.Len(t, resp.Outputs, 1)
	assert.Equal(t, "BYTES", resp.Outputs[0].Datatype)
	assert.Equal(t, []int64{1, 2}, resp.Outputs[0].Shape)
	// Raw, as Triton serializes BYTES: each element's length (4 bytes,
	// little-endian), then the element.
	assert.Equal(t, [][]byte{[]byte("\x03\x00\x00\x006:0\x03\x00\x00\x003:1")}, resp.RawOutputContents)
	assert.Nil(t, resp.Outputs[0].Contents)
}

// TestGRPCTraceSetting: Triton's TraceSetting RPC reads and changes the
// settings the HTTP trace endpoints do, behind the repository token.
func TestGRPCTraceSetting(t *testing.T) {
	const repoTok = "repo-token-0123456789"
	f := newSumMax(t)
	tracer := trace.New(trace.Options{Dir: t.TempDir()})
	s, err := New(Options{Models: f.set, RepositoryTokens: []string{repoTok}, Tracer: tracer})
	require.NoError(t, err)
	c, _ := grpcClients(t, s)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+repoTok)
	val := func(v ...string) *pb.TraceSettingRequest_SettingValue {
		return &pb.TraceSettingRequest_SettingValue{Value: v}
	}

	_, err = c.TraceSetting(context.Background(), &pb.TraceSettingRequest{})
	code, _ := codeOf(err)
	assert.Equal(t, codes.Unauthenticated, code, "the repository token guards it")

	got, err := c.TraceSetting(ctx, &pb.TraceSettingRequest{})
	require.NoError(t, err)
	assert.Equal(t, []string{"OFF"}, got.Settings["trace_level"].GetValue())

	got, err = c.TraceSetting(ctx, &pb.TraceSettingRequest{ModelName: "summax",
		Settings: map[string]*pb.TraceSettingRequest_SettingValue{"trace_level": val("TIMESTAMPS"), "trace_count": val("5")}})
	require.NoError(t, err)
	assert.Equal(t, []string{"TIMESTAMPS"}, got.Settings["trace_level"].GetValue())
	assert.Equal(t, []string{"5"}, got.Settings["trace_count"].GetValue())
	assert.Equal(t, "TIMESTAMPS", tracer.Settings("summax")["trace_level"].([]string)[0], "the tracer HTTP reads is the one changed")
	assert.Equal(t, "OFF", tracer.Settings("")["trace_level"].([]string)[0], "the global settings stay")

	// A setting without values clears the model's override.
	got, err = c.TraceSetting(ctx, &pb.TraceSettingRequest{ModelName: "summax",
		Settings: map[string]*pb.TraceSettingRequest_SettingValue{"trace_level": val()}})
	require.NoError(t, err)
	assert.Equal(t, []string{"OFF"}, got.Settings["trace_level"].GetValue())

	_, err = c.TraceSetting(ctx, &pb.TraceSettingRequest{Settings: map[string]*pb.TraceSettingRequest_SettingValue{"trace_level": val("LOUD")}})
	code, msg := codeOf(err)
	assert.Equal(t, codes.InvalidArgument, code)
	assert.Contains(t, msg, "trace_level")
	_, err = c.TraceSetting(ctx, &pb.TraceSettingRequest{ModelName: "nosuch"})
	code, _ = codeOf(err)
	assert.Equal(t, codes.NotFound, code)
}

// TestGRPCLogSettings: Triton's LogSettings RPC reads and changes the
// settings GET and POST /v2/logging do, refuses what they refuse with the
// same messages, and changes nothing when it refuses.
func TestGRPCLogSettings(t *testing.T) {
	s, level, _ := newLoggingServer(t, Options{})
	c, _ := grpcClients(t, s)
	ctx := context.Background()
	type value = pb.LogSettingsRequest_SettingValue
	boolean := func(b bool) *value {
		return &value{ParameterChoice: &pb.LogSettingsRequest_SettingValue_BoolParam{BoolParam: b}}
	}
	u32 := func(n uint32) *value {
		return &value{ParameterChoice: &pb.LogSettingsRequest_SettingValue_Uint32Param{Uint32Param: n}}
	}
	str := func(s string) *value {
		return &value{ParameterChoice: &pb.LogSettingsRequest_SettingValue_StringParam{StringParam: s}}
	}
	update := func(settings map[string]*value) (core.LogSettings, error) {
		resp, err := c.LogSettings(ctx, &pb.LogSettingsRequest{Settings: settings})
		if err != nil {
			return core.LogSettings{}, err
		}
		// The settings by the names and of the types HTTP's JSON has.
		doc := map[string]any{}
		for k, v := range resp.Settings {
			switch p := v.GetParameterChoice().(type) {
			case *pb.LogSettingsResponse_SettingValue_BoolParam:
				doc[k] = p.BoolParam
			case *pb.LogSettingsResponse_SettingValue_Uint32Param:
				doc[k] = p.Uint32Param
			case *pb.LogSettingsResponse_SettingValue_StringParam:
				doc[k] = p.StringParam
			}
		}
		b, err := json.Marshal(doc)
		require.NoError(t, err)
		return logSettingsOf(t, string(b)), nil
	}
	httpSettings := func() core.LogSettings {
		return logSettingsOf(t, do(t, s, "GET", "/v2/logging", nil).Body.String())
	}

	got, err := update(nil)
	require.NoError(t, err)
	assert.Equal(t, core.LogSettings{LogInfo: true, LogWarnings: true, LogErrors: true, LogFormat: "text"}, got)
	assert.Equal(t, httpSettings(), got, "gRPC and HTTP report the same settings")

	got, err = update(map[string]*value{"log_verbose_level": u32(2)})
	require.NoError(t, err)
	assert.Equal(t, core.LogSettings{LogInfo: true, LogWarnings: true, LogErrors: true, LogVerboseLevel: 2, LogFormat: "text"}, got)
	assert.Equal(t, slog.LevelDebug, level.Level())
	assert.Equal(t, httpSettings(), got)
	got, err = update(map[string]*value{"log_info": {}}) // no value, as tritonclient sends None: no change
	require.NoError(t, err)
	assert.Equal(t, uint32(2), got.LogVerboseLevel)
	got, err = update(map[string]*value{"log_verbose_level": u32(0), "log_warnings": boolean(false), "log_file": str(""), "log_format": str("text")})
	require.NoError(t, err)
	assert.Equal(t, core.LogSettings{LogErrors: true, LogFormat: "text"}, got)
	assert.Equal(t, slog.LevelError, level.Level())
	_, err = update(map[string]*value{"log_info": boolean(true)})
	require.NoError(t, err)
	assert.Equal(t, slog.LevelInfo, level.Level())

	for _, tt := range []struct {
		settings map[string]*value
		code     codes.Code
		want     string
	}{
		{map[string]*value{"log_info": boolean(true), "log_warnings": boolean(false)}, codes.InvalidArgument, "these settings cannot hold together (log_info true)"},
		{map[string]*value{"log_file": str("/var/log/stepserve.log")}, codes.InvalidArgument, "log_file cannot be set: stepserve logs to standard error"},
		{map[string]*value{"log_format": str("ISO8601")}, codes.InvalidArgument, `log_format cannot change at run time: the log is "text"`},
		{map[string]*value{"log_verbose": u32(1)}, codes.InvalidArgument, `unknown log setting "log_verbose"; the settings are log_file, log_info`},
		{map[string]*value{"log_info": str("yes")}, codes.InvalidArgument, "log setting log_info must be true or false"},
		{map[string]*value{"log_verbose_level": boolean(true)}, codes.InvalidArgument, "log setting log_verbose_level must be a non-negative integer"},
		{map[string]*value{"log_file": u32(1)}, codes.InvalidArgument, "log setting log_file must be a string"},
		{map[string]*value{"log_file": str(strings.Repeat("x", 5000))}, codes.ResourceExhausted, "log settings are at most 4096 bytes"},
	} {
		_, err := update(tt.settings)
		code, msg := codeOf(err)
		assert.Equal(t, tt.code, code, "%v", tt.settings)
		assert.Contains(t, msg, tt.want)
		assert.Equal(t, slog.LevelInfo, level.Level(), "%s changed nothing", tt.want)
	}
}

// LogSettings is an administrator's RPC, guarded as /v2/logging: the
// repository token, closed while only inference has one, and
// Unimplemented without a log level to control.
func TestGRPCLogSettingsAccess(t *testing.T) {
	bearer := func(t string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+t)
	}
	s, level, _ := newLoggingServer(t, Options{InferenceTokens: []string{"infer-token-0123456789"}, RepositoryTokens: []string{"admin-token-0123456789"}})
	c, _ := grpcClients(t, s)
	req := &pb.LogSettingsRequest{Settings: map[string]*pb.LogSettingsRequest_SettingValue{
		"log_verbose_level": {ParameterChoice: &pb.LogSettingsRequest_SettingValue_Uint32Param{Uint32Param: 1}}}}
	for _, ctx := range []context.Context{context.Background(), bearer("infer-token-0123456789")} {
		_, err := c.LogSettings(ctx, req)
		code, _ := codeOf(err)
		assert.Equal(t, codes.Unauthenticated, code)
	}
	assert.Equal(t, slog.LevelInfo, level.Level())
	_, err := c.LogSettings(bearer("admin-token-0123456789"), req)
	require.NoError(t, err)
	assert.Equal(t, slog.LevelDebug, level.Level())

	s, _, _ = newLoggingServer(t, Options{InferenceTokens: []string{"infer-token-0123456789"}})
	c, _ = grpcClients(t, s)
	_, err = c.LogSettings(bearer("infer-token-0123456789"), &pb.LogSettingsRequest{})
	code, msg := codeOf(err)
	assert.Equal(t, codes.PermissionDenied, code, "never more open than inference")
	assert.Equal(t, core.AdminClosedMsg, msg)
	assert.Equal(t, 403, do(t, s, "GET", "/v2/logging", nil, "Authorization", "Bearer infer-token-0123456789").Code, "as HTTP")

	s, _ = newTestServer(t, newSumMax(t))
	c, _ = grpcClients(t, s)
	_, err = c.LogSettings(context.Background(), &pb.LogSettingsRequest{})
	code, msg = codeOf(err)
	assert.Equal(t, codes.Unimplemented, code)
	assert.Contains(t, msg, "the logging extension is not available")
}
