package grpcapi

import (
	"bytes"
	"compress/flate"
	"compress/zlib"
	"context"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/gzip"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/stepserve/stepserve/server/core"
	pb "github.com/stepserve/stepserve/server/inferencepb"
)

// responseEncoding is a client's stats handler that keeps the encoding
// of the last response's messages (its grpc-encoding header).
type responseEncoding struct {
	mu  sync.Mutex
	enc string
}

func (r *responseEncoding) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return ctx
}

func (r *responseEncoding) HandleRPC(_ context.Context, s stats.RPCStats) {
	if h, ok := s.(*stats.InHeader); ok {
		r.mu.Lock()
		r.enc = h.Compression
		r.mu.Unlock()
	}
}

func (r *responseEncoding) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

func (r *responseEncoding) HandleConn(context.Context, stats.ConnStats) {}

func (r *responseEncoding) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.enc
}

// A client that compresses its calls, as tritonclient's
// compression_algorithm does, is answered, and in its own encoding.
func TestGRPCCompressedCalls(t *testing.T) {
	a, _ := newAPI(t)
	var got responseEncoding
	c := pb.NewGRPCInferenceServiceClient(clientConn(t, a, grpc.WithStatsHandler(&got)))
	ctx := context.Background()
	for _, enc := range []string{gzip.Name, "deflate"} {
		for _, req := range []*pb.ModelInferRequest{
			rawX([]int64{2, 3}, fp32(1, 2, 3, 4, 5, -6)),
			typedX([]int64{2, 3}, 1, 2, 3, 4, 5, -6),
		} {
			resp, err := c.ModelInfer(ctx, req, grpc.UseCompressor(enc))
			require.NoError(t, err, enc)
			assert.Equal(t, [][]byte{fp32(6, 3, 3, 5)}, resp.RawOutputContents, enc)
			assert.Equal(t, enc, got.last(), "the response is compressed as the request was")
		}
		ready, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: "summax"}, grpc.UseCompressor(enc))
		require.NoError(t, err, enc)
		assert.True(t, ready.Ready, enc)
	}
	_, err := c.ModelInfer(ctx, rawX([]int64{1, 3}, fp32(1, 2, 3)))
	require.NoError(t, err)
	assert.Empty(t, got.last(), "an uncompressed call is answered uncompressed")
	assert.Eventually(t, func() bool { return a.c.Budget.InUse() == 0 }, 5*time.Second, time.Millisecond, "the budget is given back")
}

// zeros is a message of n zero bytes that costs its client nothing to
// build: bombCodec hands gRPC one chunk of zeros again and again, which
// gRPC compresses as it reads them.
type zeros struct{ n int }

type bombCodec struct{ encoding.CodecV2 }

var zeroChunk = make([]byte, 32<<10)

func (c bombCodec) Marshal(v any) (mem.BufferSlice, error) {
	z, ok := v.(zeros)
	if !ok {
		return c.CodecV2.Marshal(v)
	}
	out := make(mem.BufferSlice, z.n/len(zeroChunk))
	for i := range out {
		out[i] = mem.SliceBuffer(zeroChunk)
	}
	return out, nil
}

// A small compressed message that inflates far past server.max_body_bytes
// (a bomb) is refused once it has inflated to the limit: the server never
// holds what it would inflate to, and gives its room back.
func TestGRPCCompressionBomb(t *testing.T) {
	a, _ := newAPIWith(t, func(o *core.Options) { o.MaxBodyBytes = 1 << 20 })
	conn := clientConn(t, a)
	codec := bombCodec{encoding.GetCodecV2(protoenc.Name)}
	for _, enc := range []string{gzip.Name, "deflate"} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := conn.Invoke(context.Background(), pb.GRPCInferenceService_ModelInfer_FullMethodName, zeros{64 << 20}, new(pb.ModelInferResponse),
			grpc.UseCompressor(enc), grpc.ForceCodecV2(codec))
		runtime.ReadMemStats(&after)
		assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%s: %v", enc, err)
		assert.Equal(t, "grpc: received message after decompression larger than max 1048576", status.Convert(err).Message(), enc)
		t.Logf("%s bomb of 64 MiB: %d KiB allocated by client and server", enc, (after.TotalAlloc-before.TotalAlloc)>>10)
		// The client's compressor and the compressed message, and the
		// server's limit of inflated bytes: a few MiB, not the 64 MiB the
		// message inflates to.
		assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(16<<20), "%s: bytes allocated by client and server together", enc)
		assert.Eventually(t, func() bool { return a.c.Budget.InUse() == 0 }, 5*time.Second, time.Millisecond, "the budget is given back")
	}
}

// While it is read, a compressed message holds room in the budget for
// what it may inflate to besides itself: where an uncompressed message
// finds room, a compressed one may not.
func TestGRPCCompressedMessageHoldsRoomToInflate(t *testing.T) {
	a, _ := newAPIWith(t, func(o *core.Options) { o.MaxBodyBytes, o.MaxInflightBytes = 1<<20, 4<<20 })
	a.c.BudgetWait = 10 * time.Millisecond
	c := pb.NewGRPCInferenceServiceClient(clientConn(t, a))
	ctx := context.Background()
	const others = 5 << 19 // 2.5 MiB held by others
	require.True(t, a.c.Budget.TryTake(others))
	defer a.c.Budget.Give(others)

	resp, err := c.ModelInfer(ctx, rawX([]int64{1, 3}, fp32(1, 2, 3)))
	require.NoError(t, err, "1 MiB of room for the message")
	assert.Equal(t, [][]byte{fp32(6, 3)}, resp.RawOutputContents)
	_, err = c.ModelInfer(ctx, rawX([]int64{1, 3}, fp32(1, 2, 3)), grpc.UseCompressor(gzip.Name))
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "2 MiB of room for the message and what it inflates to: %v", err)
	assert.Contains(t, status.Convert(err).Message(), "the server is busy")
}

// gRPC's deflate is zlib's format, as gRPC's core library (Python's
// grpcio, Triton's C++ client) writes and reads it; a raw deflate stream
// is read too.
func TestDeflateEncoding(t *testing.T) {
	d := encoding.GetCompressor("deflate")
	require.NotNil(t, d, "registered under gRPC's name")
	text := bytes.Repeat([]byte("The water is warm. "), 100)

	var buf bytes.Buffer
	w, err := d.Compress(&buf)
	require.NoError(t, err)
	_, err = w.Write(text)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	zr, err := zlib.NewReader(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err, "zlib's format")
	got, err := io.ReadAll(zr)
	require.NoError(t, err)
	assert.Equal(t, text, got)

	var raw bytes.Buffer
	fw, err := flate.NewWriter(&raw, flate.BestCompression)
	require.NoError(t, err)
	fw.Write(text)
	require.NoError(t, fw.Close())
	for range 2 { // the second time from the pool
		for name, stream := range map[string][]byte{"zlib": buf.Bytes(), "raw deflate": raw.Bytes()} {
			r, err := d.Decompress(bytes.NewReader(stream))
			require.NoError(t, err, name)
			got, err := io.ReadAll(r)
			require.NoError(t, err, name)
			assert.Equal(t, text, got, name)
			if c, ok := r.(io.Closer); ok {
				require.NoError(t, c.Close(), name)
			}
		}
	}
	_, err = d.Decompress(bytes.NewReader([]byte{0x78}))
	assert.Error(t, err, "a stream cut short")
}
