package core

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/wire"
	"github.com/stepserve/stepserve/serving"
)

// Response content types, shared by every response: net/http copies a
// handler's header before writing it, and a value slice of capacity 1 is
// never appended to in place.
var (
	ContentTypeJSON   = []string{"application/json"}
	ContentTypeOctets = []string{"application/octet-stream"}
)

// RequestInfo is what a request's log line says of it beyond its status.
type RequestInfo struct {
	Rows  int
	ID    string
	Trace *trace.Request // nil unless tracing sampled the request
}

// LogRequest logs one inference request: at info with log.requests, else
// at debug (and nothing is built for a line nobody logs).
func (c *Core) LogRequest(ctx context.Context, protocol int, method, path, model string, status int, info RequestInfo, bytes int64, took time.Duration) {
	level := slog.LevelDebug
	if c.Opts.LogRequests {
		level = slog.LevelInfo
	}
	if !c.Logger.Enabled(ctx, level) {
		return
	}
	c.Logger.LogAttrs(ctx, level, "request", slog.String("protocol", ProtocolLabels[protocol]), slog.String("method", method),
		slog.String("path", path), slog.String("model", model), slog.Int("status", status), slog.Int("rows", info.Rows),
		slog.Int64("bytes", bytes), slog.String("took", took.String()), slog.String("id", apierr.ClipName(info.ID)))
}

// run runs a checked request on m, whichever protocol it came by: it
// takes the request's footprint from the in-flight budget (on top of what
// ch holds already), decodes its values, and has the model Run it. It
// returns the model that ran it (m's successor when a reload replaced m
// meanwhile) and the result holding the outputs. A request whose tensors
// name shared-memory regions holds them meanwhile: its inputs are copied
// out of them before decoding, and its outputs into them once the model
// has run.
func (c *Core) run(ctx context.Context, ch *Charge, m *serving.Model, req *wire.InferRequest, f wire.Footprint) (*serving.Model, *serving.Result, error) {
	if req.SharedMemory() {
		// Held, and checked against their regions, before the request
		// waits for anything; let go once its outputs are written.
		if err := req.HoldSharedMemory(c.SharedMemory, m.Model()); err != nil {
			return m, nil, err
		}
		defer req.ReleaseSharedMemory(c.SharedMemory)
	}
	if err := c.admit(ctx, ch, f); err != nil {
		return m, nil, err
	}
	if req.SharedMemory() {
		if err := req.ReadSharedMemory(); err != nil {
			return m, nil, err
		}
	}
	if err := req.DecodeValues(m.Model()); err != nil {
		return m, nil, err
	}
	if m.ComputeDtype() == "float16" {
		if err := req.FitFloat16(m.Model()); err != nil {
			return m, nil, err
		}
	}
	req.Trace.Stamp(trace.Decoded)
	m, res, err := m.Infer(ctx, req.ForModel())
	if err == nil && req.SharedMemory() {
		if err := req.WriteSharedMemory(m.Model(), res); err != nil {
			return m, nil, err
		}
	}
	return m, res, err
}

// bodyStart is the most a body's buffer starts with, whatever its
// Content-Length says: the buffer grows with what arrives, so a client
// that declares a large body and sends little of it costs little.
const bodyStart = 64 << 10

// ReadBody reads the whole body within the configured limit, into a
// buffer that grows with what arrives, each size charged to ch before it
// is allocated.
func (c *Core) ReadBody(w http.ResponseWriter, r *http.Request, ch *Charge) ([]byte, error) {
	limit := c.Opts.MaxBodyBytes
	tooLarge := func() error {
		return &apierr.Error{Status: http.StatusRequestEntityTooLarge,
			Msg: fmt.Sprintf("request body exceeds the %d-byte limit (server.max_body_bytes)", limit)}
	}
	if r.ContentLength > limit {
		return nil, tooLarge()
	}
	if enc := r.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(strings.TrimSpace(enc), "identity") {
		// Compressed: the limit applies to what the body decompresses
		// to, read to at most one byte past it, so that a small body that
		// inflates without bound (a bomb) costs the limit and no more.
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		src, _, err := decodedBody(r)
		if err != nil {
			return nil, err
		}
		body, err := readGrowing(r, src, limit+1, 512, 2, ch, -1)
		switch {
		case err != nil:
			return nil, bodyError(err, tooLarge)
		case int64(len(body)) > limit:
			return nil, &apierr.Error{Status: http.StatusRequestEntityTooLarge,
				Msg: fmt.Sprintf("request body decompresses to more than the %d-byte limit (server.max_body_bytes)", limit)}
		case len(body) == 0:
			return nil, apierr.BadRequest("empty request body; want an inference request (JSON)")
		}
		return body, nil
	}
	// net/http holds a body to its declared length: read up to exactly
	// that, with no read past it to find the end. A body of unknown length
	// is read to its end, at most one byte past the limit.
	size, start, factor, src := r.ContentLength, min(r.ContentLength, bodyStart), int64(4), r.Body
	if size <= 0 {
		size, start, factor, src = limit+1, 512, 2, http.MaxBytesReader(w, r.Body, limit)
	}
	body, err := readGrowing(r, src, size, start, factor, ch, r.ContentLength)
	if err != nil {
		return nil, bodyError(err, tooLarge)
	}
	if len(body) == 0 {
		return nil, apierr.BadRequest("empty request body; want an inference request (JSON)")
	}
	return body, nil
}

// readGrowing reads src to its end, or to size bytes, into a buffer that
// starts start bytes long and grows factor times as it fills. Each buffer
// is charged to ch before it is allocated, and the ones it replaces stay
// charged: they are garbage the collector has yet to free. A body of known
// length grows four times at a step, so that this garbage is at most a
// third of it and a client holds at most four times what it sent; one of
// unknown length doubles, wasting less of its last buffer.
func readGrowing(r *http.Request, src io.Reader, size, start, factor int64, ch *Charge, declared int64) ([]byte, error) {
	grow := func(b []byte, n int64) ([]byte, error) {
		if err := ch.Take(r.Context(), n, "the request body"); err != nil {
			return b, err
		}
		nb := make([]byte, len(b), n)
		copy(nb, b)
		return nb, nil
	}
	b, err := grow(nil, start)
	if err != nil {
		return nil, err
	}
	for int64(len(b)) < size {
		if len(b) == cap(b) {
			if b, err = grow(b, min(size, factor*int64(cap(b)))); err != nil {
				return nil, err
			}
		}
		n, err := src.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			if declared > 0 && int64(len(b)) < declared {
				return nil, io.ErrUnexpectedEOF
			}
			return b, nil
		}
		if err != nil {
			return nil, err
		}
	}
	return b, nil
}

// bodyError says why a body could not be read (a function of its own so
// that errors.As's targets are allocated only on the error path).
func bodyError(err error, tooLarge func() error) error {
	var mbe *http.MaxBytesError
	var ne net.Error
	var ae *apierr.Error
	switch {
	case errors.As(err, &ae):
		return err
	case errors.As(err, &mbe):
		return tooLarge()
	case errors.As(err, &ne) && ne.Timeout():
		return &apierr.Error{Status: http.StatusRequestTimeout, Msg: "the request body did not arrive within server.read_timeout"}
	case errors.Is(err, context.Canceled):
		return err
	}
	return apierr.BadRequest(fmt.Sprintf("reading the request body: %v", err))
}
