package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/serving"
	"github.com/stepserve/stepserve/steps"
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

func (s *Server) infer(w http.ResponseWriter, r *http.Request) {
	s.inferNamed(w, r, chi.URLParam(r, "model"), chi.URLParam(r, "version"))
}

func (s *Server) inferNamed(w http.ResponseWriter, r *http.Request, model, version string) {
	start := time.Now()
	m, err := s.lookupName(model, version)
	if err != nil {
		// Unknown names are not counted: they would let any client create
		// series without bound.
		writeErr(w, err)
		return
	}
	name := m.Model().Name
	status := s.serveInfer(w, r, m)
	s.metrics.observe(name, status, time.Since(start))
}

// serveInfer answers one inference request and returns the status it
// answered with.
func (s *Server) serveInfer(w http.ResponseWriter, r *http.Request, m *serving.Model) int {
	fail := func(err error) int {
		st := statusOf(err)
		// Bad requests, timeouts the client asked for, cancellations and
		// overload are counted in requests_total; a line each would let
		// any client flood the log. Only the server's own failures are
		// errors.
		level := slog.LevelDebug
		if st >= 500 && st != http.StatusServiceUnavailable && st != http.StatusGatewayTimeout {
			level = slog.LevelError
		}
		s.logger.Log(r.Context(), level, "inference failed", "model", m.Model().Name, "status", st, "err", err)
		writeError(w, st, err.Error())
		return st
	}
	if !m.Ready() {
		return fail(notReady(m.Model().Name))
	}

	body, err := s.readBody(w, r)
	if err != nil {
		return fail(err)
	}
	headerLen := -1
	if h := r.Header.Get(headerContentLength); h != "" {
		n, perr := strconv.Atoi(h)
		if perr != nil || n < 0 {
			return fail(badRequest(fmt.Sprintf("%s %q is not a non-negative integer", headerContentLength, clipName(h))))
		}
		headerLen = n
	}
	req, err := decodeRequest(body, headerLen, m.Model(), s.opts.MaxRequestElements)
	if err != nil {
		return fail(err)
	}

	sr, err := prepare(m.Model(), req)
	if err != nil {
		return fail(err)
	}
	if err := m.Infer(r.Context(), sr, req.params); err != nil {
		return fail(err)
	}
	if err := s.writeResponse(w, m.Model(), req, sr); err != nil {
		return fail(err)
	}
	return http.StatusOK
}

// readBody reads the whole body within the configured limit.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	limit := s.opts.MaxBodyBytes
	tooLarge := func() error {
		return &apiError{http.StatusRequestEntityTooLarge,
			fmt.Sprintf("request body exceeds the %d-byte limit (server.max_body_bytes)", limit)}
	}
	if r.ContentLength > limit {
		return nil, tooLarge()
	}
	var body []byte
	var err error
	if r.ContentLength > 0 {
		// net/http holds the body to its declared length: read exactly
		// that, with no read past it to find the end.
		body = make([]byte, r.ContentLength)
		_, err = io.ReadFull(r.Body, body)
	} else {
		body, err = readAll(http.MaxBytesReader(w, r.Body, limit), make([]byte, 0, 513))
	}
	if err != nil {
		return nil, bodyError(err, tooLarge)
	}
	if len(body) == 0 {
		return nil, badRequest("empty request body; want an inference request (JSON)")
	}
	return body, nil
}

// bodyError says why a body could not be read (a function of its own so
// that errors.As's targets are allocated only on the error path).
func bodyError(err error, tooLarge func() error) error {
	var mbe *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &mbe):
		return tooLarge()
	case errors.As(err, &ne) && ne.Timeout():
		return &apiError{http.StatusRequestTimeout, "the request body did not arrive within server.read_timeout"}
	}
	return badRequest(fmt.Sprintf("reading the request body: %v", err))
}

// readAll is io.ReadAll into a buffer sized from Content-Length.
func readAll(r io.Reader, b []byte) ([]byte, error) {
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}

type responseTensor struct {
	Name       string          `json:"name"`
	Datatype   models.Datatype `json:"datatype"`
	Shape      []int           `json:"shape"`
	Parameters map[string]int  `json:"parameters,omitempty"`
	Data       json.RawMessage `json:"data,omitempty"`
}

// writeResponse encodes the outputs: JSON data inline, and binary outputs
// after the JSON header as Triton's extension lays them out.
func (s *Server) writeResponse(w http.ResponseWriter, m *models.Model, req *inferRequest, sr *steps.Request) error {
	b := make([]byte, 0, 256+len(req.outputs)*req.rows*64)
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
		data := sr.Outputs[c.index]
		if i > 0 {
			b = append(b, ',')
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
