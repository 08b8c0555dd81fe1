package grpcapi

import (
	"context"
	"encoding/binary"
	"math"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/server/core"
	pb "github.com/stepserve/stepserve/server/inferencepb"
	"github.com/stepserve/stepserve/serving"
)

// newAPI is the gRPC API over a live model set serving summax
// ([enginetest.SumMaxYAML]) on the fake engine, warmed up.
func newAPI(tb testing.TB) (*API, *serving.Set) {
	tb.Helper()
	return newAPIWith(tb, func(*core.Options) {})
}

// newAPIWith is newAPI with options changed by opt.
func newAPIWith(tb testing.TB, opt func(*core.Options)) (*API, *serving.Set) {
	tb.Helper()
	repo := tb.TempDir()
	require.NoError(tb, enginetest.WriteSumMax(filepath.Join(repo, "summax")))
	set, err := serving.New(serving.Options{Repository: repo, DefaultEngine: "fake",
		Engines: map[string]serving.Engine{"fake": {Engine: &enginetest.Engine{Func: enginetest.SumMax}}}})
	require.NoError(tb, err)
	tb.Cleanup(func() { set.Close() })
	require.NoError(tb, set.LoadAll(context.Background()))
	require.NoError(tb, set.Warmup(context.Background()))
	opts := core.Options{Models: set, MaxInflightBytes: 1 << 30}
	opt(&opts)
	c, err := core.New(opts)
	require.NoError(tb, err)
	return New(c), set
}

// clients serves a on an in-memory listener until the test ends and
// returns its clients.
func clients(t *testing.T, a *API) (pb.GRPCInferenceServiceClient, healthpb.HealthClient) {
	t.Helper()
	conn := clientConn(t, a)
	return pb.NewGRPCInferenceServiceClient(conn), healthpb.NewHealthClient(conn)
}

// clientConn serves a on an in-memory listener until the test ends and
// returns a connection to it, dialled with opts besides.
func clientConn(t *testing.T, a *API, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	ln := bufconn.Listen(1 << 20)
	a.Server() // built before the clients are handed out
	done := make(chan error, 1)
	go func() { done <- a.Serve(ln) }()
	opts = append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, opts...)
	conn, err := grpc.NewClient("passthrough:///bufconn", opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.Stop(ctx)
		<-done
	})
	return conn
}

// fp32 packs values as little-endian FP32, raw contents' layout.
func fp32(vs ...float32) []byte {
	b := make([]byte, 0, 4*len(vs))
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

// typedX and rawX are summax requests for x, in typed and raw contents.
func typedX(shape []int64, vs ...float32) *pb.ModelInferRequest {
	return &pb.ModelInferRequest{ModelName: "summax", Inputs: []*pb.ModelInferRequest_InferInputTensor{
		{Name: "x", Datatype: "FP32", Shape: shape, Contents: &pb.InferTensorContents{Fp32Contents: vs}}}}
}

func rawX(shape []int64, raw []byte) *pb.ModelInferRequest {
	return &pb.ModelInferRequest{ModelName: "summax", Inputs: []*pb.ModelInferRequest_InferInputTensor{
		{Name: "x", Datatype: "FP32", Shape: shape}}, RawInputContents: [][]byte{raw}}
}
