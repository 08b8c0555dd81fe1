package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/serving"
)

// headerContentLength is Triton's binary-tensor extension header: the
// length of the JSON part of a body that binary tensors follow.
const headerContentLength = "Inference-Header-Content-Length"

// Response content types, shared by every response: net/http copies a
// handler's header before writing it, and a value slice of capacity 1 is
// never appended to in place.
var (
	contentTypeJSON   = []string{"application/json"}
	contentTypeOctets = []string{"application/octet-stream"}
)

func (s *oipAPI) infer(w http.ResponseWriter, r *http.Request) {
	s.inferNamed(w, r, chi.URLParam(r, "model"), chi.URLParam(r, "version"))
}

func (s *oipAPI) inferNamed(w http.ResponseWriter, r *http.Request, model, version string) {
	start := time.Now()
	m, err := s.lookupName(model, version)
	if err != nil {
		// Unknown names are not counted: they would let any client create
		// series without bound.
		writeErr(w, err)
		return
	}
	name := m.Model().Name
	var info requestInfo
	status := s.serveInfer(w, r, m, &info)
	info.trace.Done(status) // its response is written
	took := time.Since(start)
	s.metrics.observe(protocolHTTP, name, status, took)
	s.logRequest(r.Context(), protocolHTTP, r.Method, r.URL.Path, name, status, info, r.ContentLength, took)
}

// requestInfo is what a request's log line says of it beyond its status.
type requestInfo struct {
	rows  int
	id    string
	trace *trace.Request // nil unless tracing sampled the request
}

// logRequest logs one inference request: at info with log.requests, else
// at debug (and nothing is built for a line nobody logs).
func (s *Core) logRequest(ctx context.Context, protocol int, method, path, model string, status int, info requestInfo, bytes int64, took time.Duration) {
	level := slog.LevelDebug
	if s.opts.LogRequests {
		level = slog.LevelInfo
	}
	if !s.logger.Enabled(ctx, level) {
		return
	}
	s.logger.LogAttrs(ctx, level, "request", slog.String("protocol", protocolLabels[protocol]), slog.String("method", method),
		slog.String("path", path), slog.String("model", model), slog.Int("status", status), slog.Int("rows", info.rows),
		slog.Int64("bytes", bytes), slog.String("took", took.String()), slog.String("id", clipName(info.id)))
}

// serveInfer answers one inference request and returns the status it
// answered with.
func (s *oipAPI) serveInfer(w http.ResponseWriter, r *http.Request, m *serving.Model, info *requestInfo) int {
	// The model's statistics time a request from when its body has been
	// read (a slow upload is the client's) to when its answer is written.
	began := time.Now()
	fail := func(err error) int {
		defer func() { m.Report(nil, false, time.Since(began)) }()
		st := statusOf(err)
		// Bad requests, timeouts the client asked for, cancellations and
		// overload are counted in requests_total; a line each would let
		// any client flood the log. Only the server's own failures are
		// errors.
		level := slog.LevelDebug
		if st >= 500 && st != http.StatusServiceUnavailable && st != http.StatusGatewayTimeout {
			level = slog.LevelError
		}
		if s.logger.Enabled(r.Context(), level) { // no arguments boxed for a line nobody logs
			s.logger.Log(r.Context(), level, "inference failed", "model", m.Model().Name, "status", st, "err", err)
		}
		writeError(w, st, err.Error())
		return st
	}
	if !m.Ready() {
		return fail(notReady(m.Model().Name))
	}

	// Everything the request allocates from here on is charged to the
	// in-flight budget first, and stays charged until its response is
	// written: a client that reads its answer slowly holds it, not more.
	ch := charge{b: s.budget, wait: s.budgetWait}
	defer ch.release()
	body, err := s.readBody(w, r, &ch)
	if err != nil {
		return fail(err)
	}
	began = time.Now()
	// A reload may have replaced the model while the body arrived: the
	// request goes to the version served now.
	m = m.Current()
	info.trace = s.opts.Tracer.Sample(m.Model().Name) // one atomic load while tracing is off
	headerLen := -1
	if h := r.Header.Get(headerContentLength); h != "" {
		n, perr := strconv.Atoi(h)
		if perr != nil || n < 0 {
			return fail(badRequest(fmt.Sprintf("%s %q is not a non-negative integer", headerContentLength, clipName(h))))
		}
		headerLen = n
	}
	req, f, err := parseRequest(body, headerLen, m.Model(), s.opts.MaxRequestElements)
	if err != nil {
		return fail(err)
	}
	info.rows, info.id = req.rows, req.id
	if tr := info.trace; tr != nil {
		req.trace, tr.ID, tr.Rows = tr, req.id, req.rows
	}
	m, res, err := s.run(r.Context(), &ch, m, req, f)
	if err != nil {
		return fail(err)
	}
	if err := s.writeResponse(w, m.Model(), req, res, f.json); err != nil {
		return fail(err)
	}
	m.Report(res, true, time.Since(began))
	return http.StatusOK
}

// run runs a checked request on m, whichever protocol it came by: it
// takes the request's footprint from the in-flight budget (on top of what
// ch holds already), decodes its values, and has the model run it. It
// returns the model that ran it (m's successor when a reload replaced m
// meanwhile) and the result holding the outputs.
func (s *Core) run(ctx context.Context, ch *charge, m *serving.Model, req *inferRequest, f footprint) (*serving.Model, *serving.Result, error) {
	if err := s.admit(ctx, ch, f); err != nil {
		return m, nil, err
	}
	if err := req.decodeValues(m.Model()); err != nil {
		return m, nil, err
	}
	req.trace.Stamp(trace.Decoded)
	return m.Infer(ctx, req.forModel())
}

// bodyStart is the most a body's buffer starts with, whatever its
// Content-Length says: the buffer grows with what arrives, so a client
// that declares a large body and sends little of it costs little.
const bodyStart = 64 << 10

// readBody reads the whole body within the configured limit, into a
// buffer that grows with what arrives, each size charged to ch before it
// is allocated.
func (s *Core) readBody(w http.ResponseWriter, r *http.Request, ch *charge) ([]byte, error) {
	limit := s.opts.MaxBodyBytes
	tooLarge := func() error {
		return &apiError{http.StatusRequestEntityTooLarge,
			fmt.Sprintf("request body exceeds the %d-byte limit (server.max_body_bytes)", limit)}
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
			return nil, &apiError{http.StatusRequestEntityTooLarge,
				fmt.Sprintf("request body decompresses to more than the %d-byte limit (server.max_body_bytes)", limit)}
		case len(body) == 0:
			return nil, badRequest("empty request body; want an inference request (JSON)")
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
		return nil, badRequest("empty request body; want an inference request (JSON)")
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
func readGrowing(r *http.Request, src io.Reader, size, start, factor int64, ch *charge, declared int64) ([]byte, error) {
	grow := func(b []byte, n int64) ([]byte, error) {
		if err := ch.take(r.Context(), n, "the request body"); err != nil {
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
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return err
	case errors.As(err, &mbe):
		return tooLarge()
	case errors.As(err, &ne) && ne.Timeout():
		return &apiError{http.StatusRequestTimeout, "the request body did not arrive within server.read_timeout"}
	case errors.Is(err, context.Canceled):
		return err
	}
	return badRequest(fmt.Sprintf("reading the request body: %v", err))
}

// writeResponse encodes the outputs: JSON data inline, and binary outputs
// after the JSON header as Triton's extension lays them out.
//
// jsonBound is the most the JSON may take (footprint.json), which the
// buffer is sized to: it is charged already, and never grows.
func (s *oipAPI) writeResponse(w http.ResponseWriter, m *models.Model, req *inferRequest, res *serving.Result, jsonBound int64) error {
	b := make([]byte, 0, jsonBound)
	b = append(b, `{"model_name":`...)
	b = strconv.AppendQuote(b, m.Name)
	b = append(b, `,"model_version":`...)
	b = strconv.AppendQuote(b, m.Version)
	if req.id != "" {
		idJSON, _ := json.Marshal(req.id)
		b = append(b, `,"id":`...)
		b = append(b, idJSON...)
	}
	b = append(b, `,"outputs":[`...)
	var parts [4][]byte
	binaryParts := parts[:0]
	for i, c := range req.outputs {
		spec := m.Config.Outputs[c.index]
		data := res.Outputs[c.index]
		if i > 0 {
			b = append(b, ',')
		}
		if c.classes > 0 {
			b, binaryParts = appendClassOutput(b, binaryParts, m, c, data, req.rows)
			continue
		}
		b = append(b, `{"name":`...)
		b = strconv.AppendQuote(b, spec.Name)
		b = append(b, `,"datatype":"`...)
		b = append(b, spec.Datatype...)
		b = append(b, `","shape":[`...)
		b = strconv.AppendInt(b, int64(req.rows), 10)
		for _, d := range spec.Shape[1:] {
			b = append(b, ',')
			b = strconv.AppendInt(b, int64(d), 10)
		}
		b = append(b, ']')
		if c.binary {
			b = append(b, `,"parameters":{"binary_data_size":`...)
			b = strconv.AppendInt(b, int64(len(data)), 10)
			b = append(b, "}}"...)
			binaryParts = append(binaryParts, data)
			continue
		}
		b = append(b, `,"data":`...)
		var err error
		if b, err = appendJSONData(b, data, spec.Datatype); err != nil {
			return fmt.Errorf("model %s produced a bad value in output %q: %w", m.Name, spec.Name, err)
		}
		b = append(b, '}')
	}
	b = append(b, "]}"...)

	// Header keys already canonical, and shared values: no allocation or
	// canonicalization per response.
	h := w.Header()
	if len(binaryParts) == 0 {
		h["Content-Type"] = contentTypeJSON
		h["Content-Length"] = []string{strconv.Itoa(len(b))}
		w.WriteHeader(http.StatusOK)
		w.Write(b)
		return nil
	}
	total := len(b)
	for _, p := range binaryParts {
		total += len(p)
	}
	lengths := []string{strconv.Itoa(len(b)), strconv.Itoa(total)}
	h["Content-Type"] = contentTypeOctets
	h[headerContentLength] = lengths[0:1:1]
	h["Content-Length"] = lengths[1:2:2]
	w.WriteHeader(http.StatusOK)
	w.Write(b)
	for _, p := range binaryParts {
		w.Write(p)
	}
	return nil
}
