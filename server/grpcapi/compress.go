package grpcapi

// gRPC compression, as Triton's clients use it (compression_algorithm
// "gzip" or "deflate"): a request compressed with either is decompressed
// by gRPC as it is read, at most one byte past the receive limit
// (server.max_body_bytes), so that a small message that inflates without
// bound (a bomb) costs the limit and no more and is answered
// RESOURCE_EXHAUSTED; gRPC answers in the request's encoding. The
// decompressed copy is charged to the in-flight budget before the message
// is read (gatedStream), and a compressed response's copy with the
// request's footprint.
//
// gRPC keeps one registry of compressors for the process: they are
// registered here, once, as the package is loaded.

import (
	"bytes"
	"compress/flate"
	"compress/zlib"
	"context"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/gzip"
)

func init() {
	// Responses are compressed at the speed HTTP's are (core's
	// compressors): inference outputs gain little from more effort.
	if err := gzip.SetLevel(flate.BestSpeed); err != nil {
		panic(err)
	}
	encoding.RegisterCompressor(newDeflate())
}

// deflateName is gRPC's name for the deflate encoding.
const deflateName = "deflate"

// deflateCompressor is gRPC's "deflate" encoding. It writes zlib's format
// (RFC 1950), which gRPC's core library (Python's grpcio, Triton's C++
// client) writes and reads under that name, and reads a raw deflate
// stream (RFC 1951) as well, as HTTP's deflate bodies are read.
type deflateCompressor struct {
	writers sync.Pool // *zlib.Writer
	readers sync.Pool // *zlibReader
}

func newDeflate() *deflateCompressor {
	d := &deflateCompressor{}
	d.writers.New = func() any {
		w, _ := zlib.NewWriterLevel(nil, flate.BestSpeed) // a valid level: no error
		return w
	}
	return d
}

func (d *deflateCompressor) Name() string { return deflateName }

func (d *deflateCompressor) Compress(w io.Writer) (io.WriteCloser, error) {
	zw := d.writers.Get().(*zlib.Writer)
	zw.Reset(w)
	return &zlibWriter{Writer: zw, pool: &d.writers}, nil
}

// zlibWriter goes back to its pool when closed.
type zlibWriter struct {
	*zlib.Writer
	pool *sync.Pool
}

func (w *zlibWriter) Close() error {
	defer w.pool.Put(w.Writer)
	return w.Writer.Close()
}

func (d *deflateCompressor) Decompress(r io.Reader) (io.Reader, error) {
	// A zlib stream opens with a deflate method byte whose 16-bit header
	// is a multiple of 31; a raw deflate stream does not.
	var head [2]byte
	n, err := io.ReadFull(r, head[:])
	if err != nil {
		return nil, err
	}
	src := io.MultiReader(bytes.NewReader(head[:n]), r)
	if head[0]&0x0f != 8 || (uint16(head[0])<<8|uint16(head[1]))%31 != 0 {
		return flate.NewReader(src), nil
	}
	if zr, ok := d.readers.Get().(*zlibReader); ok {
		if err := zr.ReadCloser.(zlib.Resetter).Reset(src, nil); err != nil {
			d.readers.Put(zr)
			return nil, err
		}
		return zr, nil
	}
	zr, err := zlib.NewReader(src)
	if err != nil {
		return nil, err
	}
	return &zlibReader{ReadCloser: zr, pool: &d.readers}, nil
}

// zlibReader goes back to its pool when gRPC closes it.
type zlibReader struct {
	io.ReadCloser
	pool *sync.Pool
}

func (r *zlibReader) Close() error {
	defer r.pool.Put(r)
	return r.ReadCloser.Close()
}

// callStream is what gRPC's server stream says of the call's compression.
type callStream interface {
	RecvCompress() string
	SendCompress() string
}

// compressedCall reports whether the messages of the call ctx belongs to
// arrive compressed, and whether its responses leave compressed (gRPC
// answers in the request's encoding).
func compressedCall(ctx context.Context) (recv, send bool) {
	st, ok := grpc.ServerTransportStreamFromContext(ctx).(callStream)
	if !ok {
		return false, false // a call made in this process, not over gRPC
	}
	compressed := func(enc string) bool { return enc != "" && enc != encoding.Identity }
	return compressed(st.RecvCompress()), compressed(st.SendCompress())
}
