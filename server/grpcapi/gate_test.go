package grpcapi

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

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
