package grpcapi

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stepserve/stepserve/server/core"
	pb "github.com/stepserve/stepserve/server/inferencepb"
)

// Probes answer however much of the budget inference holds; inference
// waits for room, then is refused with a retry pushback.
func TestProbesAnswerWhileTheBudgetIsSpent(t *testing.T) {
	a, _ := newAPIWith(t, func(o *core.Options) { o.MaxInflightBytes = 64 << 20 })
	a.c.BudgetWait = 10 * time.Millisecond
	c, h := clients(t, a)
	ctx := context.Background()
	require.True(t, a.c.Budget.TryTake(64<<20))
	defer a.c.Budget.Give(64 << 20)

	hr, err := h.Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, hr.Status)
	live, err := c.ServerLive(ctx, &pb.ServerLiveRequest{})
	require.NoError(t, err)
	assert.True(t, live.Live)
	ready, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "summax"})
	require.NoError(t, err)
	assert.True(t, ready.Ready)

	_, err = c.ModelInfer(ctx, rawX([]int64{1, 3}, fp32(1, 2, 3)))
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
}

// A call whose message does not arrive within the read timeout is
// answered DEADLINE_EXCEEDED, and what it held of the budget comes back.
func TestSlowMessageTimesOutAndGivesItsRoomBack(t *testing.T) {
	a, _ := newAPIWith(t, func(o *core.Options) { o.ReadTimeout = 100 * time.Millisecond })
	ln := clientConn(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Headers, and then never a message.
	st, err := ln.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, pb.GRPCInferenceService_ModelInfer_FullMethodName)
	require.NoError(t, err)
	err = st.RecvMsg(new(pb.ModelInferResponse))
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "server.read_timeout")
	assert.Eventually(t, func() bool { return a.c.Budget.InUse() == 0 }, 5*time.Second, 5*time.Millisecond,
		"the room taken for the message and the stream's window come back")
}

// assertingHealth answers Check with whether the call's transport stream
// can end the call itself (statusWriter).
type assertingHealth struct {
	healthpb.UnimplementedHealthServer
	got chan bool
}

func (h *assertingHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	_, ok := grpc.ServerTransportStreamFromContext(ctx).(statusWriter)
	h.got <- ok
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// gRPC's server stream can write a status from another goroutine, which
// is what bounds a message's read without a goroutine a call: a gRPC
// release that drops it loses that saving (the reads fall back to a
// goroutine each), and this test says so.
func TestTransportStreamWritesStatus(t *testing.T) {
	h := &assertingHealth{got: make(chan bool, 1)}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, h)
	ln := bufconn.Listen(1 << 20)
	go gs.Serve(ln)
	defer gs.Stop()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	_, err = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.True(t, <-h.got, "the transport stream in a call's context has WriteStatus")
}

// A budget whose quarter cannot hold one message's room serves no
// stream: one idle stream would otherwise hold nearly all of it (a 256 MiB
// container's 128 MiB budget against a 64 MiB body, twice that gzipped),
// and every other call would be refused while it waits.
func TestAStreamNeverHoldsMoreThanTheQuarter(t *testing.T) {
	const budget = 16 << 20
	a, _ := newAPIWith(t, func(o *core.Options) { o.MaxInflightBytes = budget; o.MaxBodyBytes = 8 << 20 })
	c := pb.NewGRPCInferenceServiceClient(clientConn(t, a))
	for _, opts := range [][]grpc.CallOption{nil, {grpc.UseCompressor("gzip")}} {
		st, err := c.ModelStreamInfer(context.Background(), opts...)
		require.NoError(t, err)
		_, err = st.Recv()
		assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
		assert.Contains(t, status.Convert(err).Message(), "more than the quarter of server.max_inflight_bytes (4 MiB)")
		assert.LessOrEqual(t, a.c.Budget.InUse(), int64(budget/4), "the refused stream holds nothing but its window")
		_, err = c.ModelInfer(context.Background(), rawX([]int64{1, 3}, fp32(1, 2, 3)))
		require.NoError(t, err, "a call beside it is answered")
	}
}

// Streams waiting for their client's next message hold room for it, and
// idle streams are cheap to open: together they may hold at most a
// quarter of the in-flight budget, so that a crowd of them cannot refuse
// every other call (compressed streams, which hold room for both forms
// of a message, included). A stream past the quarter waits as a call
// waits for room, then is refused with RESOURCE_EXHAUSTED saying why;
// the others read on.
func TestIdleStreamsCannotSpendTheBudget(t *testing.T) {
	const budget = 16 << 20
	a, _ := newAPIWith(t, func(o *core.Options) { o.MaxInflightBytes = budget; o.MaxBodyBytes = 1 << 20 })
	a.c.BudgetWait = 50 * time.Millisecond
	conn := clientConn(t, a)
	c := pb.NewGRPCInferenceServiceClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type answer struct {
		i    int
		resp *pb.ModelStreamInferResponse
		err  error
	}
	answers := make(chan answer, 40)
	var streams []pb.GRPCInferenceService_ModelStreamInferClient
	for i := range 40 {
		var opts []grpc.CallOption
		if i%2 == 0 {
			opts = append(opts, grpc.UseCompressor("gzip"))
		}
		st, err := c.ModelStreamInfer(ctx, opts...)
		require.NoError(t, err)
		streams = append(streams, st)
		go func() {
			resp, err := st.Recv()
			answers <- answer{i, resp, err}
		}()
	}
	// The first refusal says the quarter is full: every stream has asked
	// for its room by then, or is about to.
	var first answer
	select {
	case first = <-answers:
	case <-time.After(30 * time.Second):
		t.Fatal("no stream past the quarter was refused")
	}
	time.Sleep(100 * time.Millisecond)
	assert.LessOrEqual(t, a.c.Budget.InUse(), int64(budget/4+40*a.window()), "idle streams hold at most a quarter of the budget")
	for range 5 {
		_, err := c.ModelInfer(context.Background(), rawX([]int64{1, 3}, fp32(1, 2, 3)))
		require.NoError(t, err, "a call beside the idle crowd is answered")
	}

	// The streams past the quarter were refused, saying why.
	refused := map[int]bool{}
	answers <- first
	for len(answers) > 0 {
		a := <-answers
		assert.Equal(t, codes.ResourceExhausted, status.Code(a.err), "%v", a.err)
		assert.Contains(t, status.Convert(a.err).Message(), "streams waiting for their next message hold all the room it keeps for them")
		refused[a.i] = true
	}
	assert.NotEmpty(t, refused)
	assert.Less(t, len(refused), 40)
	// One that holds its room reads (summax is no language model: the
	// answer says so).
	for i, st := range streams {
		if refused[i] {
			continue
		}
		require.NoError(t, st.Send(rawX([]int64{1, 3}, fp32(1, 2, 3))))
		for a := range answers {
			if a.i != i { // a refusal that came late
				assert.Equal(t, codes.ResourceExhausted, status.Code(a.err), "%v", a.err)
				continue
			}
			require.NoError(t, a.err)
			assert.Contains(t, a.resp.GetErrorMessage(), "not a language model")
			break
		}
		break
	}
}
