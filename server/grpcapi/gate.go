package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/stepserve/stepserve/internal/bytesize"
	"github.com/stepserve/stepserve/server/core"
)

// gRPC's memory, bounded as HTTP's is (server.max_inflight_bytes).
//
// grpc-go reads a unary call's whole message before its handler runs, so
// that 48 valid 60 MiB messages at once were all in memory before any was
// charged to the in-flight budget. Here no message is read until there is
// room for it:
//
//   - every method is served as a stream (gated), whose handler reads its
//     message itself, through gatedStream, which first takes the most the
//     message may be (server.max_body_bytes, gRPC's receive limit; twice
//     that for a compressed one, compress.go) from the budget, waiting as
//     an HTTP body's read does; then, the message read, keeps only what
//     it holds (decompressed). A call that cannot get the room is
//     answered RESOURCE_EXHAUSTED with a retry pushback, its message never
//     read; one whose message does not arrive within server.read_timeout
//     is answered DEADLINE_EXCEEDED and gives its room back;
//   - until then the message waits in the client and the kernel: the
//     flow-control windows are fixed (grpcStreamWindow; gRPC's own would
//     grow to 16 MiB a stream), and every stream charges its window to
//     the budget when it opens (tapStream), refused at once when even that
//     is not there;
//   - probes (grpc.health.v1, ServerLive, ServerReady, ModelReady) must
//     answer however busy inference is: they charge nothing to the budget,
//     and read their messages under probeSlots instead, a few at a time,
//     so that what they may hold is bounded on its own.
//
// On the wire nothing changes: a unary call is one message each way
// whichever way the server registers it.

// grpcStreamWindow is the flow-control window of a stream: the most a
// client may send on it before the server reads. grpcConnWindow is a
// connection's, which a connection's streams share.
const (
	grpcStreamWindow = 1 << 20
	grpcConnWindow   = 16 << 20
)

// probeSlots is how many probe messages are read at once.
const probeSlots = 4

// retryPushbackMs is the retry hint a call refused for memory carries
// (the grpc-retry-pushback-ms trailer gRPC's retry policy reads), as
// HTTP's 503 carries Retry-After: 1.
const retryPushbackMs = "1000"

// isProbe reports whether fullMethod is a probe's: answered whatever the
// budget holds.
func isProbe(fullMethod string) bool {
	if strings.HasPrefix(fullMethod, "/grpc.health.v1.Health/") {
		return true
	}
	switch strings.TrimPrefix(fullMethod, "/inference.GRPCInferenceService/") {
	case "ServerLive", "ServerReady", "ModelReady":
		return true
	}
	return false
}

// gated is desc with every method served as a stream whose messages are
// read through gatedStream.
func (s *API) gated(desc *grpc.ServiceDesc) *grpc.ServiceDesc {
	d := *desc
	d.Methods, d.Streams = nil, nil
	for _, m := range desc.Methods {
		probe := isProbe("/" + desc.ServiceName + "/" + m.MethodName)
		// Marked streaming for the server only: gRPC runs the stream
		// interceptors (recovery, tokens) on a stream it knows as one, and
		// calls a non-streaming handler without them.
		d.Streams = append(d.Streams, grpc.StreamDesc{StreamName: m.MethodName, ServerStreams: true,
			Handler: func(srv any, ss grpc.ServerStream) error {
				resp, err := m.Handler(srv, ss.Context(), (&gatedStream{ServerStream: ss, api: s, probe: probe}).RecvMsg, nil)
				if err != nil {
					return err
				}
				return ss.SendMsg(&outbound{ctx: ss.Context(), msg: resp})
			}})
	}
	for _, sd := range desc.Streams {
		h, probe := sd.Handler, isProbe("/"+desc.ServiceName+"/"+sd.StreamName)
		client := sd.ClientStreams
		sd.Handler = func(srv any, ss grpc.ServerStream) error {
			return h(srv, &gatedStream{ServerStream: ss, api: s, probe: probe, idle: client})
		}
		d.Streams = append(d.Streams, sd)
	}
	return &d
}

// gatedStream reads a message only once there is room for the most it
// may be, and within server.read_timeout.
type gatedStream struct {
	grpc.ServerStream
	api   *API
	probe bool
	// idle: a client stream (ModelStreamInfer), which waits for its
	// client's next message as long as the client keeps it open: its
	// reads have no server.read_timeout. ModelStreamInfer reads through
	// here only where gRPC's transport stream cannot read a message's
	// prefix first (streamread.go): the room for its next message is
	// then held while it waits, as for any read.
	idle bool
}

func (g *gatedStream) RecvMsg(m any) error {
	ctx := g.Context()
	ch := g.api.c.Charge()
	compressed, _ := compressedCall(ctx)
	if g.probe {
		timer := time.NewTimer(g.api.c.BudgetWait)
		select {
		case g.api.probes <- struct{}{}:
			timer.Stop()
		case <-timer.C:
			return status.Error(codes.ResourceExhausted, "the server is reading as many probe messages as it reads at once; retry")
		case <-ctx.Done():
			timer.Stop()
			return status.FromContextError(ctx.Err()).Err()
		}
	} else {
		n := g.api.readCharge(compressed)
		if err := ch.Take(ctx, n, "the request message"); err != nil {
			return refuse(ctx, err)
		}
	}
	release := func() {
		ch.Release()
		if g.probe {
			<-g.api.probes
		}
	}
	received := func(err error) error {
		if r, ok := m.(*rawInfer); ok && err == nil && !g.probe {
			// ModelInfer's message, undecoded: charged as what it holds
			// until its handler has charged what it decodes to and let it
			// go.
			ch.Shrink(int64(len(r.bytes())))
			r.held = &ch
			return nil
		}
		release() // decoded: a message of its size, which its handler holds briefly
		return err
	}
	lost := func() {
		if r, ok := m.(*rawInfer); ok {
			r.free()
		}
		release()
	}
	timeout := g.api.readTimeout()
	if g.idle {
		return received(g.ServerStream.RecvMsg(m))
	}
	if ws, ok := grpc.ServerTransportStreamFromContext(ctx).(statusWriter); ok {
		// The message is read on this goroutine; a timer that fires first
		// answers the call itself, which ends the stream and so the read.
		var state atomic.Int32 // 0 reading, 1 read, 2 timed out
		timer := time.AfterFunc(timeout, func() {
			if state.CompareAndSwap(0, 2) {
				ws.WriteStatus(errReadTimeout)
			}
		})
		err := g.ServerStream.RecvMsg(m)
		if state.CompareAndSwap(0, 1) {
			timer.Stop()
			return received(err)
		}
		lost() // answered already: whatever arrived is dropped
		return errReadTimeout.Err()
	}
	done := make(chan error, 1)
	go func() { done <- g.ServerStream.RecvMsg(m) }()
	timer := time.NewTimer(timeout)
	select {
	case err := <-done:
		timer.Stop()
		return received(err)
	case <-timer.C:
		// The handler's error ends the stream, which ends the read.
		go func() {
			<-done
			lost()
		}()
		return errReadTimeout.Err()
	}
}

// errReadTimeout answers a call whose message did not arrive in time.
var errReadTimeout = status.New(codes.DeadlineExceeded, "the request message did not arrive within server.read_timeout")

// statusWriter is what gRPC's own server stream (the transport's, in the
// call's context) can do besides grpc.ServerTransportStream: end the call
// with a status at once, from any goroutine. A read that waits for a
// message can then be bounded without a goroutine a message to wait in
// its place. Where the stream cannot (another transport), it can.
type statusWriter interface {
	WriteStatus(st *status.Status) error
}

// maxRecv is the most a message may take of the budget: gRPC's receive
// limit, or the whole budget where that is less (a message that big is
// read alone).
func (s *API) maxRecv() int64 { return min(s.c.Opts.MaxBodyBytes, 1<<31-1, s.c.Opts.MaxInflightBytes) }

// readCharge is what reading a message takes of the budget before it is
// read: the most it may be (maxRecv), less the window its stream holds
// already (what arrived of it so far is in that window); for a compressed
// message, besides, the most it may decompress to, as gRPC holds both
// while it decompresses. Never more than the whole budget: a message that
// big is read alone.
func (s *API) readCharge(compressed bool) int64 {
	n := s.maxRecv()
	if compressed {
		n = min(2*n, s.c.Opts.MaxInflightBytes)
	}
	return n - s.window()
}

// window is what a stream charges for its flow-control window when it
// opens: the window, or a 256th of the budget where that is less (a
// budget that small has no room for windows of 1 MiB).
func (s *API) window() int64 { return min(grpcStreamWindow, s.c.Opts.MaxInflightBytes/256) }

// readTimeout is how long a message may take to arrive once the server
// reads it.
func (s *API) readTimeout() time.Duration {
	if s.c.Opts.ReadTimeout > 0 {
		return s.c.Opts.ReadTimeout
	}
	return time.Minute
}

// refuse is err as the answer of the call ctx is; a call refused for
// memory others hold carries a retry pushback, as HTTP's Retry-After.
func refuse(ctx context.Context, err error) error {
	if errors.Is(err, core.ErrBusy) {
		grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", retryPushbackMs))
	}
	return core.GRPCError(err)
}

// tapStream charges a new stream's flow-control window to the in-flight
// budget, given back when the stream ends; a stream that finds no room
// even for that is refused before it is read at all. Probes are not
// charged (they read under probeSlots).
func (s *API) tapStream(ctx context.Context, info *tap.Info) (context.Context, error) {
	if isProbe(info.FullMethodName) {
		return ctx, nil
	}
	w := s.window()
	if !s.c.Budget.TryTake(w) {
		// Refused before the stream exists: gRPC writes no trailer
		// metadata here, so this refusal carries no retry pushback.
		return ctx, status.Error(codes.ResourceExhausted, fmt.Sprintf(
			"the server is busy: requests in flight hold its whole in-flight budget of %s (server.max_inflight_bytes), with no room for this stream's %s flow-control window; retry",
			bytesize.Format(s.c.Opts.MaxInflightBytes), bytesize.Format(w)))
	}
	// ctx is the stream's, which gRPC cancels when the stream ends,
	// whichever way it ends; a stream the server ends itself may keep
	// its window longer (windowHold).
	h := &windowHold{budget: s.c.Budget, n: w}
	context.AfterFunc(ctx, func() {
		if !h.kept.Load() {
			h.give()
		}
	})
	return context.WithValue(ctx, windowKey{}, h), nil
}

// windowHold is a stream's flow-control window, charged to the budget
// while data may arrive in it. When the client ends the stream, or the
// handler returns, gRPC's transport forgets it, and the window comes back
// with its context. A stream the server ends while its client does not
// read is not forgotten: gRPC-Go queues its end behind the responses the
// client has not taken, and meanwhile still accepts data into the stream's
// window. Its window is kept charged (kept) until its connection closes.
type windowHold struct {
	budget *core.Budget
	n      int64
	kept   atomic.Bool
	given  atomic.Bool
}

type windowKey struct{}

func (h *windowHold) give() {
	if h.given.CompareAndSwap(false, true) {
		h.budget.Give(h.n)
	}
}
