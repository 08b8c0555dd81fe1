package grpcapi

// How a ModelStreamInfer stream reads its requests and sends its
// responses within the server's memory and time bounds.
//
// Reading. A stream waits for its client's next request as long as the
// client keeps it open, and holds nothing for it while it waits beyond the
// flow-control window charged when the stream opened (tapStream). The
// message's 5-byte gRPC prefix is read first; only then, its length known,
// is room for it taken from the in-flight budget (waiting as any read
// waits), and its bytes read within server.read_timeout. Once decoded, the
// request is charged at what it holds decoded (scanInferRequest's bound)
// until its generation ends, with what its generation's events may hold
// while they wait for the client (serving.TextStream.MaxHeld).
//
// A stream with no generation in progress that sends nothing for
// server.idle_timeout is ended (UNAVAILABLE: open a new stream), as HTTP
// closes an idle keep-alive connection; its connection is closed once no
// call is in progress on it.
//
// Sending. A response that the client does not take within
// streamWriteTimeout (its flow-control window stays shut: it does not
// read) ends the stream with DEADLINE_EXCEEDED, which cancels its
// generations and frees their KV cache blocks, and closes its connection,
// as net/http closes the connection of a client that does not read within
// its write timeout: gRPC-Go would otherwise keep the stream, the
// responses queued for it and whatever the client sends on it, uncharged,
// until the client reads.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/stepserve/stepserve/internal/bytesize"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/inferencepb"
	"github.com/stepserve/stepserve/server/wire"
)

// streamWriteTimeout bounds how long a response waits for its client to
// take it, as HTTP's event streams bound each event's write.
const streamWriteTimeout = wire.StreamWriteTimeout

// rawMessageReader is what gRPC's own server stream (the transport's, in
// the call's context) can do besides grpc.ServerTransportStream: read a
// message's prefix, then its bytes, as gRPC's parser does. Reading the
// prefix first lets the length it gives be charged before the bytes are
// asked for (gRPC opens the flow-control window for a whole message when
// its parser reads one).
type rawMessageReader interface {
	ReadMessageHeader(header []byte) error
	Read(n int) (mem.BufferSlice, error)
}

// streamIO reads a stream's requests and sends its responses.
type streamIO struct {
	api *API
	ctx context.Context
	raw rawMessageReader // nil: read through gRPC (gatedStream)
	ws  statusWriter     // nil: the stream cannot be ended from here
	ss  grpc.BidiStreamingServer[inferencepb.ModelInferRequest, inferencepb.ModelStreamInferResponse]

	sendMu    sync.Mutex
	sendErr   error
	sendTimer *time.Timer // armed while a send waits: one per stream, not per send

	mu      sync.Mutex
	active  int  // generations in progress
	waiting bool // reading: the next request's prefix is awaited
	idle    *time.Timer
	idleGen int // counts arms: a timer that fires for an older one does nothing

	cutOnce sync.Once
	cutSt   *status.Status // how the server ended the stream, once it has
}

func newStreamIO(api *API, ss grpc.BidiStreamingServer[inferencepb.ModelInferRequest, inferencepb.ModelStreamInferResponse]) *streamIO {
	ctx := ss.Context()
	st := grpc.ServerTransportStreamFromContext(ctx)
	s := &streamIO{api: api, ctx: ctx, ss: ss}
	s.raw, _ = st.(rawMessageReader)
	s.ws, _ = st.(statusWriter)
	s.sendTimer = time.AfterFunc(time.Hour, func() {
		s.api.c.Logger.Warn("a ModelStreamInfer client did not read its responses; ending the stream and closing its connection", "waited", streamWriteTimeout)
		s.cut(errNotReading, closeConn)
	})
	s.sendTimer.Stop()
	return s
}

// How the server ends a stream (cut): what becomes of its connection.
const (
	// keepConn: the connection goes on; the stream's window stays
	// charged until it closes, and it is closed once no call is in
	// progress on it.
	keepConn = iota
	// closeConn: the connection is closed at once (its client does not
	// read, or does not send what it began): whatever gRPC's transport
	// holds for its streams goes with it.
	closeConn
)

// maxHeldWindows bounds the windows of ended streams a connection may
// keep charged before it is closed at once.
const maxHeldWindows = 16

// cut ends the stream with st, from any goroutine, once: its context is
// cancelled, and so every read, send and generation of it; then its
// connection is dealt with as how says.
func (s *streamIO) cut(st *status.Status, how int) {
	s.cutOnce.Do(func() {
		s.mu.Lock()
		s.cutSt = st
		s.mu.Unlock()
		if s.ws == nil {
			return // a stream that cannot be ended from here
		}
		if h, ok := s.ctx.Value(windowKey{}).(*windowHold); ok {
			h.kept.Store(true)
			n, ok := core.AtGRPCConnEnd(s.ctx, h.give)
			if !ok {
				h.give() // no connection to wait for: as before
			}
			if n > maxHeldWindows {
				how = closeConn
			}
		}
		s.ws.WriteStatus(st)
		if how == closeConn {
			core.CloseGRPCConn(s.ctx)
		} else {
			core.CloseGRPCConnWhenIdle(s.ctx)
		}
	})
}

// cutStatus is how the server ended the stream, or nil.
func (s *streamIO) cutStatus() *status.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cutSt
}

// begin and done count a generation in progress: a stream with one is
// not idle.
func (s *streamIO) begin() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active++
	s.disarm()
}

func (s *streamIO) done() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active--
	s.arm()
}

// wait says whether the stream is waiting for its client's next request.
func (s *streamIO) wait(waiting bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiting = waiting
	if waiting {
		s.arm()
	} else {
		s.disarm()
	}
}

// arm starts the idle timer of a stream that waits with nothing in
// progress; mu is held.
func (s *streamIO) arm() {
	timeout := s.api.c.Opts.IdleTimeout
	if timeout <= 0 || s.ws == nil || !s.waiting || s.active > 0 || s.idle != nil {
		return
	}
	s.idleGen++
	gen := s.idleGen
	s.idle = time.AfterFunc(timeout, func() {
		s.mu.Lock()
		idle := s.idleGen == gen && s.idle != nil && s.waiting && s.active == 0
		s.mu.Unlock()
		if idle {
			s.cut(status.New(codes.Unavailable, fmt.Sprintf(
				"the stream sent no request for %s (server.idle_timeout) and has none in progress; open a new stream", timeout)), keepConn)
		}
	})
}

func (s *streamIO) disarm() {
	if s.idle != nil {
		s.idle.Stop()
		s.idle = nil
		s.idleGen++
	}
}

// errNotReading ends a stream whose client does not take its responses.
var errNotReading = status.New(codes.DeadlineExceeded, fmt.Sprintf(
	"the client did not read its responses for %s; the stream's generations were cancelled", streamWriteTimeout))

// send sends r within streamWriteTimeout; past it the stream ends. After
// the first failed send every send fails at once.
func (s *streamIO) send(r *inferencepb.ModelStreamInferResponse) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.sendErr != nil {
		return s.sendErr
	}
	// Sends are one at a time (sendMu), so one timer serves them all. The
	// response goes as it is, not as an outbound: this deadline already
	// ends a stream whose client does not take it.
	s.sendTimer.Reset(streamWriteTimeout)
	s.sendErr = s.ss.Send(r)
	if !s.sendTimer.Stop() {
		s.sendErr = errNotReading.Err()
	}
	return s.sendErr
}

// recv reads the stream's next request, charged to the in-flight budget
// at what it holds decoded; the caller releases the charge when its
// generation ends. io.EOF: the client closed its side.
func (s *streamIO) recv() (*inferencepb.ModelInferRequest, core.Charge, error) {
	ch := s.api.c.Charge()
	if s.raw == nil {
		req, err := s.ss.Recv()
		if err == nil {
			err = ch.Take(s.ctx, pbMessageBytes+2*int64(proto.Size(req)), "the request message")
		}
		return req, ch, err
	}
	var prefix [5]byte
	s.wait(true)
	err := s.raw.ReadMessageHeader(prefix[:])
	s.wait(false)
	if err != nil {
		return nil, ch, s.readError(err)
	}
	if prefix[0] > 1 {
		return nil, ch, status.Errorf(codes.Internal, "grpc: received unexpected payload format %d", prefix[0])
	}
	compressed := prefix[0] == 1
	n := int64(prefix[1])<<24 | int64(prefix[2])<<16 | int64(prefix[3])<<8 | int64(prefix[4])
	if n > s.api.maxRecv() {
		return nil, ch, status.Errorf(codes.ResourceExhausted, "the request message is %s, more than server.max_body_bytes (%s)",
			bytesize.Format(n), bytesize.Format(s.api.maxRecv()))
	}
	room := n
	if compressed {
		// And what it may decompress to; never more than the whole
		// budget (a message that big is read alone).
		room = min(n+s.api.maxRecv(), s.api.c.Opts.MaxInflightBytes)
	}
	if err := ch.Take(s.ctx, room, "the request message"); err != nil {
		if errors.Is(err, core.ErrBusy) {
			grpc.SetTrailer(s.ctx, metadata.Pairs("grpc-retry-pushback-ms", retryPushbackMs))
		}
		return nil, ch, core.GRPCError(err)
	}
	b, err := s.readBody(int(n))
	if err != nil {
		ch.Release()
		return nil, ch, err
	}
	if compressed {
		if b, err = s.decompress(b); err != nil {
			ch.Release()
			return nil, ch, err
		}
	}
	sc, err := scanInferRequest(b, s.api.c.Opts.MaxRequestElements)
	if err == nil || errors.Is(err, errProtoMalformed) {
		// Decoding takes what the message holds decoded, besides its
		// bytes (freed once decoded).
		err = ch.Take(s.ctx, sc.decoded, "decoding the request message")
	}
	if err != nil {
		ch.Release()
		return nil, ch, core.GRPCError(err)
	}
	req := &inferencepb.ModelInferRequest{}
	if err := proto.Unmarshal(b, req); err != nil {
		ch.Release()
		return nil, ch, status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err)
	}
	ch.Shrink(sc.decoded)
	return req, ch, nil
}

// readBody reads a message's n bytes within server.read_timeout; past
// it, the stream ends and its connection is closed (gRPC opened the
// stream's window for the whole message).
func (s *streamIO) readBody(n int) ([]byte, error) {
	timer := time.AfterFunc(s.api.readTimeout(), func() { s.cut(errReadTimeout, closeConn) })
	data, err := s.raw.Read(n)
	if !timer.Stop() {
		data.Free()
		return nil, errReadTimeout.Err()
	}
	if err != nil {
		return nil, s.readError(err)
	}
	b := data.Materialize()
	data.Free()
	return b, nil
}

// decompress decompresses a message in the call's encoding, reading at
// most one byte past the receive limit.
func (s *streamIO) decompress(b []byte) ([]byte, error) {
	st, ok := grpc.ServerTransportStreamFromContext(s.ctx).(callStream)
	if !ok {
		return nil, status.Error(codes.Internal, "grpc: a compressed message on a call with no encoding")
	}
	enc := st.RecvCompress()
	if enc == "" || enc == encoding.Identity {
		return nil, status.Error(codes.Internal, "grpc: compressed flag set with identity or empty encoding")
	}
	c := encoding.GetCompressor(enc)
	if c == nil {
		return nil, status.Errorf(codes.Unimplemented, "grpc: decompressor is not installed for grpc-encoding %q", enc)
	}
	r, err := c.Decompress(bytes.NewReader(b))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "grpc: failed to decompress the received message: %v", err)
	}
	max := s.api.maxRecv()
	out, err := io.ReadAll(io.LimitReader(r, max+1))
	if cl, ok := r.(io.Closer); ok {
		cl.Close()
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "grpc: failed to decompress the received message: %v", err)
	}
	if int64(len(out)) > max {
		return nil, status.Errorf(codes.ResourceExhausted, "grpc: received message after decompression larger than max %d", max)
	}
	return out, nil
}

// readError is a read's error as the stream's answer: io.EOF as it is (the
// client closed its side), how the server ended the stream where it did,
// the context's when the client did.
func (s *streamIO) readError(err error) error {
	switch {
	case errors.Is(err, io.EOF):
		return io.EOF
	case s.cutStatus() != nil:
		return s.cutStatus().Err()
	case s.ctx.Err() != nil:
		return status.FromContextError(s.ctx.Err()).Err()
	}
	return err
}
