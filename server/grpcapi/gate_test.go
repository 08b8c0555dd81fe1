package grpcapi

import (
	"context"
	"net"
	"strings"
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
	"github.com/stepserve/stepserve/server/wire"
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

// The transport stream in a stream's context reads a message's prefix
// before its bytes (rawMessageReader): without it, a stream would hold
// room for the largest message while it waits (gatedStream), and this
// test says so.
func TestTransportStreamReadsPrefixFirst(t *testing.T) {
	a, _ := newAPIWith(t, func(o *core.Options) { o.MaxInflightBytes = 16 << 20; o.MaxBodyBytes = 8 << 20 })
	c := pb.NewGRPCInferenceServiceClient(clientConn(t, a))
	st, err := c.ModelStreamInfer(context.Background())
	require.NoError(t, err)
	require.NoError(t, st.Send(rawX([]int64{1, 3}, fp32(1, 2, 3))))
	r, err := st.Recv()
	require.NoError(t, err)
	assert.Contains(t, r.GetErrorMessage(), "not a language model")
	// Waiting for its next message (the stream is open, its window
	// charged), it holds its window only: a read through gatedStream would
	// take room for a whole message within moments.
	require.Eventually(t, func() bool { return a.c.Budget.InUse() == a.window() }, 5*time.Second, 5*time.Millisecond,
		"the answered request gives its charge back; the stream holds its window, %d bytes", a.window())
	assert.Never(t, func() bool { return a.c.Budget.InUse() != a.window() }, 300*time.Millisecond, 5*time.Millisecond,
		"a waiting stream holds its window, %d bytes, and nothing more", a.window())
}

// Streams waiting for their client's next message hold nothing but their
// flow-control windows: a crowd of them, compressed or not, refuses no
// one (a stream once held room for a whole message while it waited, and
// two of them could shut every other stream out), and each reads on.
func TestIdleStreamsHoldOnlyTheirWindows(t *testing.T) {
	const budget = 16 << 20
	a, _ := newAPIWith(t, func(o *core.Options) { o.MaxInflightBytes = budget; o.MaxBodyBytes = 8 << 20 })
	c := pb.NewGRPCInferenceServiceClient(clientConn(t, a))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var streams []pb.GRPCInferenceService_ModelStreamInferClient
	for i := range 40 {
		var opts []grpc.CallOption
		if i%2 == 0 {
			opts = append(opts, grpc.UseCompressor("gzip"))
		}
		st, err := c.ModelStreamInfer(ctx, opts...)
		require.NoError(t, err)
		streams = append(streams, st)
	}
	require.Eventually(t, func() bool { return a.c.Budget.InUse() == 40*a.window() }, 5*time.Second, 5*time.Millisecond,
		"40 waiting streams hold their windows, %d bytes, and nothing more", 40*a.window())
	_, err := c.ModelInfer(ctx, rawX([]int64{1, 3}, fp32(1, 2, 3)))
	require.NoError(t, err, "a call beside the idle crowd is answered")
	for _, st := range streams {
		require.NoError(t, st.Send(rawX([]int64{1, 3}, fp32(1, 2, 3))))
		r, err := st.Recv()
		require.NoError(t, err)
		assert.Contains(t, r.GetErrorMessage(), "not a language model")
	}
}

// A stream's message is charged at the length its prefix gives, once it
// gives it: a small one reads where the budget has a little room, a
// large one waits for room, then ends the stream RESOURCE_EXHAUSTED with
// a retry pushback.
func TestStreamMessageIsChargedAtItsLength(t *testing.T) {
	const budget = 16 << 20
	a, _ := newAPIWith(t, func(o *core.Options) { o.MaxInflightBytes = budget; o.MaxBodyBytes = 8 << 20 })
	a.c.BudgetWait = 20 * time.Millisecond
	c := pb.NewGRPCInferenceServiceClient(clientConn(t, a))
	ctx := context.Background()
	small, err := c.ModelStreamInfer(ctx)
	require.NoError(t, err)
	large, err := c.ModelStreamInfer(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return a.c.Budget.InUse() == 2*a.window() }, 5*time.Second, 5*time.Millisecond)
	// All but 1 MiB of the budget is held by others.
	held := budget - a.c.Budget.InUse() - 1<<20
	require.True(t, a.c.Budget.TryTake(held))
	defer a.c.Budget.Give(held)

	require.NoError(t, small.Send(rawX([]int64{1, 3}, fp32(1, 2, 3))))
	r, err := small.Recv()
	require.NoError(t, err)
	assert.Contains(t, r.GetErrorMessage(), "not a language model")

	big := rawX([]int64{1, 3}, fp32(1, 2, 3))
	big.Id = strings.Repeat("x", 4<<20)
	require.NoError(t, large.Send(big))
	_, err = large.Recv()
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "the server is busy")
	assert.Equal(t, []string{retryPushbackMs}, large.Trailer().Get("grpc-retry-pushback-ms"))
}

// A stream with nothing in progress that sends nothing for
// server.idle_timeout is ended, saying so; one that keeps sending is not.
func TestIdleStreamEndsAfterTheIdleTimeout(t *testing.T) {
	a, _ := newAPIWith(t, func(o *core.Options) { o.IdleTimeout = 300 * time.Millisecond })
	c := pb.NewGRPCInferenceServiceClient(clientConn(t, a))
	st, err := c.ModelStreamInfer(context.Background())
	require.NoError(t, err)
	for range 4 { // 4 requests 150 ms apart: never idle for the timeout
		time.Sleep(150 * time.Millisecond)
		require.NoError(t, st.Send(rawX([]int64{1, 3}, fp32(1, 2, 3))))
		r, err := st.Recv()
		require.NoError(t, err)
		assert.Contains(t, r.GetErrorMessage(), "not a language model")
	}
	_, err = st.Recv()
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "server.idle_timeout")
	assert.Eventually(t, func() bool { return a.c.Budget.InUse() == 0 }, 5*time.Second, 5*time.Millisecond,
		"the ended stream's window comes back")
}

// An id past wire.MaxRequestIDBytes is refused, and not echoed.
func TestStreamRefusesALongID(t *testing.T) {
	a, _ := newAPI(t)
	c := pb.NewGRPCInferenceServiceClient(clientConn(t, a))
	st, err := c.ModelStreamInfer(context.Background())
	require.NoError(t, err)
	req := rawX([]int64{1, 3}, fp32(1, 2, 3))
	req.Id = strings.Repeat("i", wire.MaxRequestIDBytes+1)
	require.NoError(t, st.Send(req))
	r, err := st.Recv()
	require.NoError(t, err)
	assert.Contains(t, r.GetErrorMessage(), "id is 257 bytes; want a string of at most 256 bytes")
	assert.Less(t, len(r.GetInferResponse().GetId()), 100)
}

// A stream the server ends itself keeps its window charged until its
// connection closes (gRPC-Go keeps such a stream, and takes data into its
// window, until its client reads what was queued before its end), and
// the connection is closed once no call is in progress on it.
func TestEndedStreamKeepsItsWindowUntilItsConnectionCloses(t *testing.T) {
	limit, err := core.NewConnLimit(core.ConnLimitOptions{Max: 16, Listener: "api"})
	require.NoError(t, err)
	a, _ := newAPIWith(t, func(o *core.Options) {
		o.MaxInflightBytes = 16 << 20
		o.IdleTimeout = 300 * time.Millisecond
		o.Conns = limit
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- a.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.Stop(ctx)
		<-done
	})
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	st, err := pb.NewGRPCInferenceServiceClient(conn).ModelStreamInfer(context.Background())
	require.NoError(t, err)
	_, err = st.Recv()
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Equal(t, a.window(), a.c.Budget.InUse(), "the ended stream's window is kept while its connection is open")
	assert.Eventually(t, func() bool { return a.c.Budget.InUse() == 0 }, 5*time.Second, 10*time.Millisecond,
		"the connection, idle, is closed, and the window comes back")
}

// Responses gRPC has queued for a client that does not read stay charged
// to the budget until they are written or dropped with the connection:
// a handler's charge ends when it returns, and they were once memory the
// budget did not see.
func TestUnreadResponsesStayCharged(t *testing.T) {
	a, set := newAPIWith(t, func(o *core.Options) { o.MaxInflightBytes = 256 << 20; o.MaxBodyBytes = 4 << 20 })
	m, ok := set.Model("summax")
	require.True(t, ok)
	// Fixed windows of 64 KiB (gRPC's least): the client takes no more of
	// a response it does not read.
	conn := clientConn(t, a, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	ctx, cancel := context.WithCancel(context.Background())
	const rows, calls = 20_000, 4 // 160 KB responses, beyond the client's 64 KiB window
	req := rawX([]int64{rows, 3}, make([]byte, rows*12))
	for range calls {
		st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, pb.GRPCInferenceService_ModelInfer_FullMethodName)
		require.NoError(t, err)
		require.NoError(t, st.SendMsg(req))
		require.NoError(t, st.CloseSend())
		// Never read.
	}
	// The calls have run (their handlers have returned, their own
	// charges given back); what is queued for them is still charged.
	require.Eventually(t, func() bool { return m.Statistics().InferenceCount == calls*rows }, time.Minute, 10*time.Millisecond, "rows run: %d", m.Statistics().InferenceCount)
	require.Eventually(t, func() bool { return a.c.Budget.InUse() < calls*rows*20 }, 10*time.Second, 10*time.Millisecond,
		"the handlers have given their charges back: %d in use", a.c.Budget.InUse())
	assert.Greater(t, a.c.Budget.InUse(), int64(calls*(rows*8-64<<10)), "unread responses stay charged, all but what the client's windows took")
	cancel() // the client gives up its calls: the responses are dropped
	assert.Eventually(t, func() bool { return a.c.Budget.InUse() == 0 }, 10*time.Second, 10*time.Millisecond,
		"dropped, they give their bytes back: %d in use", a.c.Budget.InUse())
}
