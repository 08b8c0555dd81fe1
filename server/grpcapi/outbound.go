package grpcapi

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/stepserve/stepserve/server/core"
)

// A response is charged to the in-flight budget until gRPC has written it.
//
// A handler's charge ends when it returns, but gRPC-Go queues its
// response until the client's flow-control window takes it: a client that
// does not read keeps every response it asked for in the server's memory,
// and its calls were admitted against a budget that no longer counted
// them. So the codec marshals a response of any size past gRPC's pooling
// threshold into a buffer of its own, holds its bytes in the budget
// (Budget.Hold: it exists, whatever the budget has left), and gives them
// back when gRPC frees the buffer, once written or dropped with its
// connection. A response still unwritten after streamWriteTimeout, and a
// second a MiB, closes its connection, as net/http closes the connection of a client that does
// not read within its write timeout.

// outbound is a message to send with the call it answers.
type outbound struct {
	ctx context.Context
	msg any
}

// Marshal marshals v (an outbound, or a message) for gRPC.
func (c grpcCodec) Marshal(v any) (mem.BufferSlice, error) {
	var ctx context.Context
	if o, ok := v.(*outbound); ok {
		ctx, v = o.ctx, o.msg
	}
	m, ok := v.(proto.Message)
	if !ok || c.api == nil {
		return c.CodecV2.Marshal(v)
	}
	size := proto.Size(m)
	if mem.IsBelowBufferPoolingThreshold(size) {
		return c.CodecV2.Marshal(v)
	}
	// gRPC's pool for what fits its tiers tightly (up to 32 KiB); a
	// larger response its own buffer, of its size (the pool's next tier
	// is 1 MiB, which the budget would be charged for).
	pool := mem.DefaultBufferPool()
	if size > 32<<10 {
		pool = exactPool{}
	}
	buf := pool.Get(size)
	b, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend((*buf)[:0], m)
	if err != nil {
		pool.Put(buf)
		return nil, err
	}
	*buf = b
	h := &heldResponse{budget: c.api.c.Budget, n: int64(cap(b)), pool: pool}
	h.budget.Hold(h.n)
	if ctx != nil {
		wait := writeDeadline(h.n)
		h.timer = time.AfterFunc(wait, func() {
			c.api.c.Logger.Warn("a gRPC client did not read a response; closing its connection",
				"waited", wait, "bytes", h.n)
			core.CloseGRPCConn(ctx)
		})
	}
	return mem.BufferSlice{mem.NewBuffer(buf, h)}, nil
}

// writeDeadline is how long a response of n bytes may wait to be written:
// streamWriteTimeout, and a second for each MiB (a large response to a
// client on a slow link takes its time).
func writeDeadline(n int64) time.Duration {
	return streamWriteTimeout + time.Duration(n>>20)*time.Second
}

// heldResponse is a response's buffer's pool: what gives its bytes back
// to the budget when gRPC frees it.
// Its buffer comes from, and goes back to, gRPC's pool.
type heldResponse struct {
	budget *core.Budget
	n      int64
	timer  *time.Timer
	pool   mem.BufferPool
	once   sync.Once
}

func (h *heldResponse) Get(length int) *[]byte { return h.pool.Get(length) }

func (h *heldResponse) Put(b *[]byte) {
	h.once.Do(func() {
		if h.timer != nil {
			h.timer.Stop()
		}
		h.budget.Give(h.n)
	})
	h.pool.Put(b)
}

// exactPool allocates buffers of the length asked for, and keeps none.
type exactPool struct{}

func (exactPool) Get(length int) *[]byte {
	b := make([]byte, length)
	return &b
}

func (exactPool) Put(*[]byte) {}
