package grpcapi

import (
	"context"
	"encoding/binary"
	"io"
	"strings"
	"testing"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/core"
	pb "github.com/stepserve/stepserve/server/inferencepb"
	"github.com/stepserve/stepserve/server/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
)

func TestGRPCHealthAtShutdown(t *testing.T) {
	a, _ := newAPI(t)
	_, h := clients(t, a)
	ctx := context.Background()
	watch, err := h.Watch(ctx, &healthpb.HealthCheckRequest{Service: ""})
	require.NoError(t, err)
	first, err := watch.Recv()
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, first.Status)

	a.health.shutdown() // what Stop does first
	next, err := watch.Recv()
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, next.Status, "a draining server is not serving")
	_, err = watch.Recv()
	assert.ErrorIs(t, err, io.EOF, "and the watch ends, so that it does not hold the graceful stop")
	hr, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: "live"})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, hr.Status)
}

// The encoded response never outgrows the bound the budget charged.
func TestGRPCResponseFitsItsFootprint(t *testing.T) {
	_, set := newAPI(t)
	m := set.Models()[0].Model()
	for _, r := range []*pb.ModelInferRequest{
		typedX([]int64{4, 3}, -1.1754944e-38, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, -3.4028235e38),
		rawX([]int64{4, 3}, fp32(-1.1754944e-38, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, -3.4028235e38)),
	} {
		r.Id = strings.Repeat("<", 40)
		wr, err := wireFromProto(r)
		require.NoError(t, err)
		req, decoded, seq, err := wire.CheckRequest(&wr, nil, int(protoRequestBytes(r)), m, 1<<20)
		require.NoError(t, err)
		protoOutputs(req)
		fp := protoFootprint(m, req, decoded, seq)
		require.NoError(t, req.DecodeValues(m))
		_, res, err := set.Models()[0].Infer(context.Background(), req.ForModel())
		require.NoError(t, err)
		resp := protoResponse(m, req, res)
		assert.LessOrEqual(t, int64(proto.Size(resp)), fp.JSON)
		assert.Zero(t, fp.Binary)
		assert.GreaterOrEqual(t, protoRequestBytes(r), int64(12), "at least a byte a value")
	}
}

// BYTES inputs, typed and raw, decode as the HTTP path's do.
func TestGRPCStringInputs(t *testing.T) {
	m := &models.Model{Name: "strs", Version: "1", Config: &models.Config{
		Inputs:  []models.TensorSpec{{Name: "s", Datatype: models.BYTES, Shape: []int{-1}}},
		Outputs: []models.TensorSpec{{Name: "y", Datatype: models.FP32, Shape: []int{-1, 2}}},
	}}
	decode := func(r *pb.ModelInferRequest) ([]string, error) {
		wr, err := wireFromProto(r)
		if err != nil {
			return nil, err
		}
		req, _, _, err := wire.CheckRequest(&wr, nil, int(protoRequestBytes(r)), m, 1<<20)
		if err != nil {
			return nil, err
		}
		if err := req.DecodeValues(m); err != nil {
			return nil, err
		}
		return req.Inputs[0].Strings, nil
	}
	typed := func(shape int64, vs ...string) *pb.ModelInferRequest {
		c := &pb.InferTensorContents{}
		for _, v := range vs {
			c.BytesContents = append(c.BytesContents, []byte(v))
		}
		return &pb.ModelInferRequest{Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "s", Datatype: "BYTES", Shape: []int64{shape}, Contents: c}}}
	}
	raw := func(shape int64, vs ...string) *pb.ModelInferRequest {
		var blob []byte
		for _, v := range vs {
			blob = binary.LittleEndian.AppendUint32(blob, uint32(len(v)))
			blob = append(blob, v...)
		}
		return &pb.ModelInferRequest{Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "s", Datatype: "BYTES", Shape: []int64{shape}}},
			RawInputContents: [][]byte{blob}}
	}
	for _, r := range []*pb.ModelInferRequest{typed(2, "The water is warm.", ""), raw(2, "The water is warm.", "")} {
		strs, err := decode(r)
		require.NoError(t, err)
		assert.Equal(t, []string{"The water is warm.", ""}, strs)
	}
	for _, tc := range []struct {
		req  *pb.ModelInferRequest
		want string
	}{
		{typed(1, "caf\xe9"), `input "s": element 0 is not valid UTF-8`},
		{raw(1, "caf\xe9"), `input "s": element 0 is not valid UTF-8`},
		{typed(2, "a"), `input "s": shape [2] needs 2 strings, contents has 1`},
		{typed(1, "a", "b"), `input "s": more strings than the shape holds (1)`},
		{raw(1, "a", "b"), `input "s": more strings than the shape holds (1)`},
		{raw(2, "a"), `input "s": shape [2] needs 2 strings, contents has 1`},
		{&pb.ModelInferRequest{Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "s", Datatype: "BYTES", Shape: []int64{1},
			Contents: &pb.InferTensorContents{Fp32Contents: []float32{1}}}}}, `input "s": contents hold fp32_contents, but a BYTES input's values go in bytes_contents`},
	} {
		_, err := decode(tc.req)
		require.Error(t, err)
		assert.Equal(t, 400, core.StatusOf(err))
		assert.ErrorContains(t, err, tc.want)
	}
}

// Typed contents of every datatype with a typed field pack as raw data
// would, narrow integers range-checked.
func TestProtoContentsPack(t *testing.T) {
	c := protoContents{&pb.InferTensorContents{IntContents: []int32{-128, 127}}}
	dst := make([]byte, 2)
	require.NoError(t, c.Put("INT8", dst))
	assert.Equal(t, []byte{0x80, 0x7f}, dst)
	c = protoContents{&pb.InferTensorContents{IntContents: []int32{128}}}
	assert.ErrorContains(t, c.Put("INT8", make([]byte, 1)), "element 0: 128 is not in the INT8 range")
	c = protoContents{&pb.InferTensorContents{UintContents: []uint32{65536}}}
	assert.ErrorContains(t, c.Put("UINT16", make([]byte, 2)), "element 0: 65536 is not in the UINT16 range")
	c = protoContents{&pb.InferTensorContents{Int64Contents: []int64{-2}}}
	dst = make([]byte, 8)
	require.NoError(t, c.Put("INT64", dst))
	assert.Equal(t, int64(-2), int64(binary.LittleEndian.Uint64(dst)))
	c = protoContents{&pb.InferTensorContents{BoolContents: []bool{true, false}}}
	dst = make([]byte, 2)
	require.NoError(t, c.Put("BOOL", dst))
	assert.Equal(t, []byte{1, 0}, dst)
	_, err := protoContents{&pb.InferTensorContents{Fp32Contents: []float32{1}}}.Count("FP16")
	assert.ErrorContains(t, err, "FP16 values have no typed contents field; send them as raw_input_contents")
}

// BenchmarkGRPCInferRaw measures the gRPC handler's path of a single-row
// request with raw contents (translate, validate, batcher, step on a fake
// engine, build the response), without the transport, beside
// BenchmarkInferBinary.
func BenchmarkGRPCInferRaw(b *testing.B) {
	a, _ := newAPI(b)
	g := &grpcServer{s: a}
	req := rawX([]int64{1, 3}, fp32(1.5, 2, 3))
	b.ReportAllocs()
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		if _, err := g.ModelInfer(ctx, req); err != nil {
			b.Fatal(err)
		}
		cancel() // the RPC ends
	}
}
