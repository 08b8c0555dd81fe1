package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stepserve/stepserve/engine"
	pb "github.com/stepserve/stepserve/server/inferencepb"
)

// grpcClients serves s's gRPC API on an in-memory listener until the test
// ends and returns its clients.
func grpcClients(t *testing.T, s *Server) (pb.GRPCInferenceServiceClient, healthpb.HealthClient) {
	t.Helper()
	ln := bufconn.Listen(1 << 20)
	s.GRPCServer() // built before the clients are handed out
	done := make(chan error, 1)
	go func() { done <- s.ServeGRPC(ln) }()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	require.NoError(t, err)
	t.Cleanup(func() {
		conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.StopGRPC(ctx)
		<-done
	})
	return pb.NewGRPCInferenceServiceClient(conn), healthpb.NewHealthClient(conn)
}

// fp32 packs values as little-endian FP32, raw contents' layout.
func fp32(vs ...float32) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

func typedX(shape []int64, vs ...float32) *pb.ModelInferRequest {
	return &pb.ModelInferRequest{ModelName: "summax", Inputs: []*pb.ModelInferRequest_InferInputTensor{
		{Name: "x", Datatype: "FP32", Shape: shape, Contents: &pb.InferTensorContents{Fp32Contents: vs}}}}
}

func rawX(shape []int64, raw []byte) *pb.ModelInferRequest {
	return &pb.ModelInferRequest{ModelName: "summax",
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: shape}},
		RawInputContents: [][]byte{raw}}
}

// codeOf is err's gRPC code and message.
func codeOf(err error) (codes.Code, string) {
	st, _ := status.FromError(err)
	return st.Code(), st.Message()
}

func TestGRPCServerAndModelRPCs(t *testing.T) {
	s, _ := newTestServer(t, newSumMax(t))
	c, _ := grpcClients(t, s)
	ctx := context.Background()

	live, err := c.ServerLive(ctx, &pb.ServerLiveRequest{})
	require.NoError(t, err)
	assert.True(t, live.Live)
	ready, err := c.ServerReady(ctx, &pb.ServerReadyRequest{})
	require.NoError(t, err)
	assert.True(t, ready.Ready)
	md, err := c.ServerMetadata(ctx, &pb.ServerMetadataRequest{})
	require.NoError(t, err)
	assert.Equal(t, "stepserve", md.Name)
	assert.Equal(t, "test", md.Version)
	httpMD, _ := s.c.ServerMetadata(nil)
	assert.Equal(t, httpMD.(map[string]any)["extensions"], md.Extensions, "the extensions GET /v2 lists")
	assert.NotEmpty(t, md.Extensions)

	mr, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "summax"})
	require.NoError(t, err)
	assert.True(t, mr.Ready)
	mr, err = c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "summax", Version: "1"})
	require.NoError(t, err)
	assert.True(t, mr.Ready)
	_, err = c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "nope"})
	code, msg := codeOf(err)
	assert.Equal(t, codes.NotFound, code)
	assert.Equal(t, `Request for unknown model: 'nope' is not found`, msg)
	_, err = c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "summax", Version: "7"})
	code, msg = codeOf(err)
	assert.Equal(t, codes.NotFound, code)
	assert.Equal(t, `Request for unknown model: 'summax' version 7 is not found; it serves version 1`, msg)

	meta, err := c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: "summax"})
	require.NoError(t, err)
	assert.Equal(t, "summax", meta.Name)
	assert.Equal(t, []string{"1"}, meta.Versions)
	assert.Equal(t, "stepserve_mlp", meta.Platform)
	require.Len(t, meta.Inputs, 1)
	assert.Equal(t, "x", meta.Inputs[0].Name)
	assert.Equal(t, "FP32", meta.Inputs[0].Datatype)
	assert.Equal(t, []int64{-1, 3}, meta.Inputs[0].Shape)
	require.Len(t, meta.Outputs, 1)
	assert.Equal(t, []int64{-1, 2}, meta.Outputs[0].Shape)
	_, err = c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: "nope"})
	code, _ = codeOf(err)
	assert.Equal(t, codes.NotFound, code)

}

func TestGRPCModelNotReady(t *testing.T) {
	f := newSumMax(t)
	s, reg := newTestServer(t, f)
	c, h := grpcClients(t, s)
	ctx := context.Background()
	f.program().SetHealthy(false)

	mr, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "summax"})
	require.NoError(t, err)
	assert.False(t, mr.Ready, "not ready is an answer, not an error")
	ready, err := c.ServerReady(ctx, &pb.ServerReadyRequest{})
	require.NoError(t, err)
	assert.False(t, ready.Ready)
	for svc, want := range map[string]healthpb.HealthCheckResponse_ServingStatus{
		"": healthpb.HealthCheckResponse_NOT_SERVING, "inference.GRPCInferenceService": healthpb.HealthCheckResponse_NOT_SERVING,
		"ready": healthpb.HealthCheckResponse_NOT_SERVING, "live": healthpb.HealthCheckResponse_SERVING,
	} {
		hr, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		require.NoError(t, err, svc)
		assert.Equal(t, want, hr.Status, "service %q", svc)
	}
	_, err = c.ModelInfer(ctx, typedX([]int64{1, 3}, 1, 2, 3))
	code, msg := codeOf(err)
	assert.Equal(t, codes.Unavailable, code)
	assert.Equal(t, "model summax is not ready", msg)
	assert.Equal(t, 1.0, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", "rejected", "grpc")))
	_ = reg

	f.program().SetHealthy(true)
	hr, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: ""})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, hr.Status, "readiness is read at each check")
	_, err = h.Check(ctx, &healthpb.HealthCheckRequest{Service: "nope"})
	code, _ = codeOf(err)
	assert.Equal(t, codes.NotFound, code)
}

// Outputs are raw whichever form the inputs take and whatever the
// parameters ask, as Triton answers: its clients read raw_output_contents
// only.
func TestGRPCInferTypedAndRaw(t *testing.T) {
	f := newSumMax(t)
	s, _ := newTestServer(t, f)
	c, _ := grpcClients(t, s)
	ctx := context.Background()

	// Typed contents in, raw contents out (Triton's
	// grpc_explicit_*_content_client sends typed contents and reads raw).
	req := typedX([]int64{2, 3}, 1, 2, 3, 4, 5, -6)
	req.Id = "r1"
	resp, err := c.ModelInfer(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, "summax", resp.ModelName)
	assert.Equal(t, "1", resp.ModelVersion)
	assert.Equal(t, "r1", resp.Id)
	require.Len(t, resp.Outputs, 1)
	out := resp.Outputs[0]
	assert.Equal(t, "y", out.Name)
	assert.Equal(t, "FP32", out.Datatype)
	assert.Equal(t, []int64{2, 2}, out.Shape)
	assert.Nil(t, out.Contents)
	assert.Equal(t, [][]byte{fp32(6, 3, 3, 5)}, resp.RawOutputContents)

	// Raw in, raw out (what Triton's clients send and read).
	resp, err = c.ModelInfer(ctx, rawX([]int64{2, 3}, fp32(1, 2, 3, 4, 5, -6)))
	require.NoError(t, err)
	require.Len(t, resp.RawOutputContents, 1)
	assert.Equal(t, fp32(6, 3, 3, 5), resp.RawOutputContents[0])
	assert.Nil(t, resp.Outputs[0].Contents)
	assert.Equal(t, []int64{2, 2}, resp.Outputs[0].Shape)

	// binary_data_output and binary_data are checked, and choose nothing.
	b := func(v bool) map[string]*pb.InferParameter {
		return map[string]*pb.InferParameter{"binary_data": {ParameterChoice: &pb.InferParameter_BoolParam{BoolParam: v}}}
	}
	for _, v := range []bool{true, false} {
		req = typedX([]int64{1, 3}, 1, 2, 3)
		req.Parameters = map[string]*pb.InferParameter{"binary_data_output": {ParameterChoice: &pb.InferParameter_BoolParam{BoolParam: v}}}
		resp, err = c.ModelInfer(ctx, req)
		require.NoError(t, err)
		assert.Equal(t, [][]byte{fp32(6, 3)}, resp.RawOutputContents, "binary_data_output %v", v)
		req = rawX([]int64{1, 3}, fp32(1, 2, 3))
		req.Outputs = []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "y", Parameters: b(v)}}
		resp, err = c.ModelInfer(ctx, req)
		require.NoError(t, err)
		assert.Equal(t, [][]byte{fp32(6, 3)}, resp.RawOutputContents, "binary_data %v", v)
		assert.Nil(t, resp.Outputs[0].Contents)
	}

	// A batch larger than the largest bucket (4) runs in parts, as over HTTP.
	vs := make([]float32, 9*3)
	for i := range vs {
		vs[i] = float32(i % 3)
	}
	resp, err = c.ModelInfer(ctx, typedX([]int64{9, 3}, vs...))
	require.NoError(t, err)
	assert.Equal(t, []int64{9, 2}, resp.Outputs[0].Shape)
	require.Len(t, resp.RawOutputContents, 1)
	assert.Equal(t, bytes.Repeat(fp32(3, 2), 9), resp.RawOutputContents[0])

	// Priority and timeout travel as Triton's clients send them.
	req = typedX([]int64{1, 3}, 1, 2, 3)
	req.ModelVersion = "1"
	req.Parameters = map[string]*pb.InferParameter{
		"priority": {ParameterChoice: &pb.InferParameter_Uint64Param{Uint64Param: 1}},
		"timeout":  {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: 5_000_000}},
	}
	_, err = c.ModelInfer(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, 8.0, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", "success", "grpc")))
	assert.Zero(t, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", "success", "http")))
}

// Every bad request gets the code its HTTP status maps to and the HTTP
// path's message, naming the input or field, and never reaches the model.
func TestGRPCInferErrors(t *testing.T) {
	b := func(v bool) *pb.InferParameter {
		return &pb.InferParameter{ParameterChoice: &pb.InferParameter_BoolParam{BoolParam: v}}
	}
	str := func(v string) *pb.InferParameter {
		return &pb.InferParameter{ParameterChoice: &pb.InferParameter_StringParam{StringParam: v}}
	}
	i64 := func(v int64) *pb.InferParameter {
		return &pb.InferParameter{ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: v}}
	}
	with := func(r *pb.ModelInferRequest, edit func(r *pb.ModelInferRequest)) *pb.ModelInferRequest {
		edit(r)
		return r
	}
	tests := []struct {
		name string
		req  *pb.ModelInferRequest
		code codes.Code
		want string
	}{
		{"unknown input", with(typedX([]int64{1, 3}, 1, 2, 3), func(r *pb.ModelInferRequest) { r.Inputs[0].Name = "w" }),
			codes.InvalidArgument, `unknown input "w"; model summax takes "x" (FP32 [-1 3])`},
		{"no inputs", &pb.ModelInferRequest{ModelName: "summax"}, codes.InvalidArgument, `request has no inputs`},
		{"repeated input", with(typedX([]int64{1, 3}, 1, 2, 3), func(r *pb.ModelInferRequest) { r.Inputs = append(r.Inputs, r.Inputs[0]) }),
			codes.InvalidArgument, `input "x" appears more than once`},
		{"wrong datatype", with(typedX([]int64{1, 3}, 1, 2, 3), func(r *pb.ModelInferRequest) { r.Inputs[0].Datatype = "INT64" }),
			codes.InvalidArgument, `input "x": datatype INT64, want FP32`},
		{"unknown datatype", with(typedX([]int64{1, 3}, 1, 2, 3), func(r *pb.ModelInferRequest) { r.Inputs[0].Datatype = "FLOAT" }),
			codes.InvalidArgument, `input "x": `},
		{"wrong shape", typedX([]int64{1, 4}, 1, 2, 3, 4), codes.InvalidArgument, `input "x": shape [1 4], want [-1 3]: dimension 1 must be 3`},
		{"rank over the limit", typedX(make([]int64, 17), 1), codes.InvalidArgument, `input "x": the shape has more than 16 dimensions`},
		{"too few values", typedX([]int64{2, 3}, 1, 2, 3), codes.InvalidArgument, `input "x": shape [2 3] needs 6 values, contents has 3`},
		{"too many values", typedX([]int64{1, 3}, 1, 2, 3, 4), codes.InvalidArgument, `input "x": shape [1 3] needs 3 values, contents has 4`},
		{"values in the wrong field", with(typedX([]int64{1, 3}), func(r *pb.ModelInferRequest) {
			r.Inputs[0].Contents = &pb.InferTensorContents{Int64Contents: []int64{1, 2, 3}}
		}), codes.InvalidArgument, `input "x": contents hold int64_contents, but a FP32 input's values go in fp32_contents`},
		{"not finite", typedX([]int64{1, 3}, 1, float32(math.NaN()), 3), codes.InvalidArgument, `input "x": element 1 is NaN; values must be finite`},
		{"not finite, raw", rawX([]int64{1, 3}, fp32(1, 2, float32(math.Inf(1)))), codes.InvalidArgument, `input "x": element 2 is +Inf; values must be finite`},
		{"no contents", typedX([]int64{1, 3}), codes.InvalidArgument, `input "x": has no contents; send contents or raw_input_contents`},
		{"raw and typed", with(rawX([]int64{1, 3}, fp32(1, 2, 3)), func(r *pb.ModelInferRequest) {
			r.Inputs[0].Contents = &pb.InferTensorContents{Fp32Contents: []float32{1, 2, 3}}
		}), codes.InvalidArgument, `input "x": has both contents and raw_input_contents; send one`},
		{"raw size that lies", rawX([]int64{1, 3}, fp32(1, 2)), codes.InvalidArgument, `input "x": raw_input_contents is 8 bytes, but FP32 [1 3] needs 12`},
		{"raw count", with(rawX([]int64{1, 3}, fp32(1, 2, 3)), func(r *pb.ModelInferRequest) { r.RawInputContents = append(r.RawInputContents, nil) }),
			codes.InvalidArgument, `raw_input_contents has 2 entries for 1 inputs`},
		{"huge declared shape", typedX([]int64{1 << 20, 3}, 1, 2, 3), codes.InvalidArgument, `input "x": shape [1048576 3] declares 3145728 elements, more than a`},
		{"over the element limit", typedX([]int64{1 << 30, 3}, 1, 2, 3), codes.InvalidArgument, `above the limit of 16777216 (server.max_request_elements)`},
		{"negative priority", with(typedX([]int64{1, 3}, 1, 2, 3), func(r *pb.ModelInferRequest) { r.Parameters = map[string]*pb.InferParameter{"priority": i64(-1)} }),
			codes.InvalidArgument, `parameter priority must be a non-negative integer, got -1`},
		{"timeout as a string", with(typedX([]int64{1, 3}, 1, 2, 3), func(r *pb.ModelInferRequest) { r.Parameters = map[string]*pb.InferParameter{"timeout": str("soon")} }),
			codes.InvalidArgument, `parameter timeout must be a non-negative integer, got "soon" (microseconds)`},
		{"binary_data not a bool", with(typedX([]int64{1, 3}, 1, 2, 3), func(r *pb.ModelInferRequest) {
			r.Outputs = []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "y", Parameters: map[string]*pb.InferParameter{"binary_data": str("yes")}}}
		}), codes.InvalidArgument, `output "y": parameter binary_data must be true or false, got "yes"`},
		{"unknown output", with(typedX([]int64{1, 3}, 1, 2, 3), func(r *pb.ModelInferRequest) {
			r.Outputs = []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "w", Parameters: map[string]*pb.InferParameter{"binary_data": b(true)}}}
		}), codes.InvalidArgument, `unknown output "w"; model summax gives "y"`},
		{"unknown model", with(typedX([]int64{1, 3}, 1, 2, 3), func(r *pb.ModelInferRequest) { r.ModelName = "nope" }), codes.NotFound, `Request for unknown model: 'nope' is not found`},
		{"unknown version", with(typedX([]int64{1, 3}, 1, 2, 3), func(r *pb.ModelInferRequest) { r.ModelVersion = "7" }), codes.NotFound, `Request for unknown model: 'summax' version 7 is not found`},
		{"message over max_body_bytes", rawX([]int64{1000, 3}, make([]byte, 12000)), codes.ResourceExhausted, `larger than max`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newSumMax(t)
			s, _ := newTestServer(t, f)
			c, _ := grpcClients(t, s)
			_, err := c.ModelInfer(context.Background(), tt.req)
			code, msg := codeOf(err)
			assert.Equal(t, tt.code, code, msg)
			assert.Contains(t, msg, tt.want)
			assert.Zero(t, f.steps(), "a bad request must never reach the model")
			if tt.code == codes.InvalidArgument {
				assert.Equal(t, 1.0, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", "invalid", "grpc")))
			}
			assert.Eventually(t, func() bool { return s.c.Budget.InUse() == 0 }, time.Second, time.Millisecond, "the budget is given back")
		})
	}
}

func TestGRPCModelFailures(t *testing.T) {
	for _, tt := range []struct {
		err     error
		code    codes.Code
		outcome string
	}{
		{errors.New("device on fire"), codes.Internal, "error"},
		{fmt.Errorf("worker gone: %w", engine.ErrUnavailable), codes.Unavailable, "rejected"},
	} {
		f := newSumMax(t)
		f.program().Fail(tt.err)
		s, _ := newTestServer(t, f)
		c, _ := grpcClients(t, s)
		_, err := c.ModelInfer(context.Background(), typedX([]int64{1, 3}, 1, 2, 3))
		code, msg := codeOf(err)
		assert.Equal(t, tt.code, code)
		assert.Contains(t, msg, tt.err.Error())
		assert.Equal(t, 1.0, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", tt.outcome, "grpc")))
	}
}

// A client's deadline and its going away are the HTTP path's 504 and 499.
func TestGRPCDeadlineAndCancel(t *testing.T) {
	set, eng, gate := gatedSumMax(t)
	s, err := New(Options{Models: set, MaxInflightBytes: 1 << 30})
	require.NoError(t, err)
	c, _ := grpcClients(t, s)
	g := make(chan struct{})
	gate.Store(&g)
	held := make(chan error, 1)
	go func() { _, err := c.ModelInfer(context.Background(), typedX([]int64{1, 3}, 1, 2, 3)); held <- err }()
	require.Eventually(t, func() bool { return eng.Last().Steps() > 4 }, 5*time.Second, time.Millisecond, "the held step started")

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err = c.ModelInfer(ctx, typedX([]int64{1, 3}, 1, 2, 3))
	cancel()
	code, _ := codeOf(err)
	assert.Equal(t, codes.DeadlineExceeded, code)

	ctx, cancel = context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	_, err = c.ModelInfer(ctx, typedX([]int64{1, 3}, 1, 2, 3))
	code, _ = codeOf(err)
	assert.Equal(t, codes.Canceled, code)

	gate.Store(nil)
	close(g)
	require.NoError(t, <-held)
	// The timed-out request is counted as timeout; the cancelled one as
	// cancelled, or as success when it was in the batch that the held step
	// was forming as its client left (as over HTTP).
	count := func(o string) float64 {
		return testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", o, "grpc"))
	}
	assert.Eventually(t, func() bool {
		return count("timeout") == 1 && count("cancelled")+count("success") == 2
	}, 5*time.Second, time.Millisecond, "the server counts what the client saw")
}

// The response bound and the in-flight budget apply as over HTTP, and a
// request holds its share until its response is sent.
func TestGRPCLimits(t *testing.T) {
	s, _ := boundedServer(t, 2048, 1<<20)
	c, _ := grpcClients(t, s)
	ctx := context.Background()
	vs := make([]float32, 300*3)
	_, err := c.ModelInfer(ctx, typedX([]int64{300, 3}, vs...))
	code, msg := codeOf(err)
	assert.Equal(t, codes.ResourceExhausted, code)
	assert.Contains(t, msg, "above server.max_response_bytes (2 KiB)")

	s, _ = boundedServer(t, 1<<20, 1<<20)
	c, _ = grpcClients(t, s)
	vs = make([]float32, 30000*3)
	_, err = c.ModelInfer(ctx, typedX([]int64{30000, 3}, vs...))
	code, msg = codeOf(err)
	assert.Equal(t, codes.ResourceExhausted, code)
	assert.Contains(t, msg, "more than the server's whole in-flight budget of 1 MiB (server.max_inflight_bytes)")

	// Budget spent by others: ResourceExhausted, with a retry pushback
	// when there is room for the stream but not for its message...
	s.c.BudgetWait = 10 * time.Millisecond
	s.c.Budget.TryTake(1<<20 - 8<<10)
	var trailer metadata.MD
	_, err = c.ModelInfer(ctx, typedX([]int64{1, 3}, 1, 2, 3), grpc.Trailer(&trailer))
	code, msg = codeOf(err)
	assert.Equal(t, codes.ResourceExhausted, code)
	assert.Contains(t, msg, "the server is busy")
	assert.Equal(t, []string{"1000"}, trailer.Get("grpc-retry-pushback-ms"))
	// ... and refused as it opens when there is not even that.
	s.c.Budget.TryTake(8 << 10)
	_, err = c.ModelInfer(ctx, typedX([]int64{1, 3}, 1, 2, 3))
	code, msg = codeOf(err)
	assert.Equal(t, codes.ResourceExhausted, code)
	assert.Contains(t, msg, "the server is busy")
	s.c.Budget.Give(1 << 20)

	resp, err := c.ModelInfer(ctx, typedX([]int64{1, 3}, 1, 2, 3))
	require.NoError(t, err)
	assert.Equal(t, [][]byte{fp32(6, 3)}, resp.RawOutputContents)
	assert.Eventually(t, func() bool { return s.c.Budget.InUse() == 0 }, time.Second, time.Millisecond, "given back when the RPC ends")
}

func TestGRPCAuth(t *testing.T) {
	const tok, repoTok, newTok = "token-0123456789abcdef", "repo-token-0123456789", "new-token-0123456789ab"
	s, err := New(Options{Models: newSumMax(t).set, ModelControl: true, InferenceTokens: []string{tok}, RepositoryTokens: []string{repoTok}})
	require.NoError(t, err)
	c, h := grpcClients(t, s)
	bearer := func(t string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", t)
	}
	infer := func(ctx context.Context) error {
		_, err := c.ModelInfer(ctx, typedX([]int64{1, 3}, 1, 2, 3))
		return err
	}
	for _, tc := range []struct {
		authorization string
		code          codes.Code
		msg           string
	}{
		{"Bearer " + tok, codes.OK, ""},
		{"bearer " + tok, codes.OK, ""},
		{"", codes.Unauthenticated, "missing bearer token: send authorization: Bearer <token> metadata"},
		{"Basic " + tok, codes.Unauthenticated, "missing bearer token"},
		{"Bearer " + tok + "x", codes.Unauthenticated, "invalid bearer token"},
		{"Bearer " + repoTok, codes.Unauthenticated, "invalid bearer token"},
	} {
		ctx := context.Background()
		if tc.authorization != "" {
			ctx = bearer(tc.authorization)
		}
		code, msg := codeOf(infer(ctx))
		assert.Equal(t, tc.code, code, "%q", tc.authorization)
		assert.Contains(t, msg, tc.msg)
		_, err := c.ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: "summax"})
		code, _ = codeOf(err)
		assert.Equal(t, tc.code, code, "metadata, %q", tc.authorization)
	}
	// Open, as their HTTP endpoints are: liveness, readiness, server
	// metadata, health.
	_, err = c.ServerLive(context.Background(), &pb.ServerLiveRequest{})
	assert.NoError(t, err)
	_, err = c.ServerReady(context.Background(), &pb.ServerReadyRequest{})
	assert.NoError(t, err)
	_, err = c.ServerMetadata(context.Background(), &pb.ServerMetadataRequest{})
	assert.NoError(t, err)
	_, err = h.Check(context.Background(), &healthpb.HealthCheckRequest{})
	assert.NoError(t, err)

	// The repository API takes its own token.
	_, err = c.RepositoryIndex(bearer("Bearer "+tok), &pb.RepositoryIndexRequest{})
	code, _ := codeOf(err)
	assert.Equal(t, codes.Unauthenticated, code)
	_, err = c.RepositoryIndex(bearer("Bearer "+repoTok), &pb.RepositoryIndexRequest{})
	assert.NoError(t, err)

	// A rotation (SIGHUP) is in force for gRPC at once.
	s.SetTokens([]string{newTok}, []string{repoTok})
	code, _ = codeOf(infer(bearer("Bearer " + tok)))
	assert.Equal(t, codes.Unauthenticated, code)
	assert.NoError(t, infer(bearer("Bearer "+newTok)))
}
