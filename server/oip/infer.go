package oip

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/serving"
)

// headerContentLength is Triton's binary-tensor extension header: the
// length of the JSON part of a body that binary tensors follow.
const headerContentLength = "Inference-Header-Content-Length"

func (s *API) infer(w http.ResponseWriter, r *http.Request) {
	s.inferNamed(w, r, chi.URLParam(r, "model"), chi.URLParam(r, "version"))
}

func (s *API) inferNamed(w http.ResponseWriter, r *http.Request, model, version string) {
	start := time.Now()
	m, err := s.c.Lookup(model, version)
	if err != nil {
		// Unknown names are not counted: they would let any client create
		// series without bound.
		core.WriteErr(w, err)
		return
	}
	name := m.Model().Name
	var info core.RequestInfo
	status := s.serveInfer(w, r, m, &info)
	info.Trace.Done(status) // its response is written
	took := time.Since(start)
	s.c.Metrics.Observe(core.ProtocolHTTP, name, status, took)
	s.c.LogRequest(r.Context(), core.ProtocolHTTP, r.Method, r.URL.Path, name, status, info, r.ContentLength, took)
}

// serveInfer answers one inference request and returns the status it
// answered with.
func (s *API) serveInfer(w http.ResponseWriter, r *http.Request, m *serving.Model, info *core.RequestInfo) int {
	// The model's statistics time a request from when its body has been
	// read (a slow upload is the client's) to when its answer is written.
	began := time.Now()
	fail := func(err error) int {
		defer func() { m.Report(nil, false, time.Since(began)) }()
		st := core.StatusOf(err)
		// Bad requests, timeouts the client asked for, cancellations and
		// overload are counted in requests_total; a line each would let
		// any client flood the log. Only the server's own failures are
		// errors.
		level := slog.LevelDebug
		if st >= 500 && st != http.StatusServiceUnavailable && st != http.StatusGatewayTimeout {
			level = slog.LevelError
		}
		if s.c.Logger.Enabled(r.Context(), level) { // no arguments boxed for a line nobody logs
			s.c.Logger.Log(r.Context(), level, "inference failed", "model", m.Model().Name, "status", st, "err", err)
		}
		core.WriteError(w, st, err.Error())
		return st
	}
	if !m.Ready() {
		return fail(core.NotReady(m.Model().Name))
	}

	// Everything the request allocates from here on is charged to the
	// in-flight budget first, and stays charged until its response is
	// written: a client that reads its answer slowly holds it, not more.
	ch := s.c.Charge()
	defer ch.Release()
	body, err := s.c.ReadBody(w, r, &ch)
	if err != nil {
		return fail(err)
	}
	began = time.Now()
	// A reload may have replaced the model while the body arrived: the
	// request goes to the version served now.
	m = m.Current()
	info.Trace = s.c.Opts.Tracer.Sample(m.Model().Name) // one atomic load while tracing is off
	headerLen := -1
	if h := r.Header.Get(headerContentLength); h != "" {
		n, perr := strconv.Atoi(h)
		if perr != nil || n < 0 {
			return fail(core.BadRequest(fmt.Sprintf("%s %q is not a non-negative integer", headerContentLength, core.ClipName(h))))
		}
		headerLen = n
	}
	req, f, err := core.ParseRequest(body, headerLen, m.Model(), s.c.Opts.MaxRequestElements)
	if err != nil {
		return fail(err)
	}
	info.Rows, info.ID = req.Rows, req.ID
	if tr := info.Trace; tr != nil {
		req.Trace, tr.ID, tr.Rows = tr, req.ID, req.Rows
	}
	m, res, err := s.c.Run(r.Context(), &ch, m, req, f)
	if err != nil {
		return fail(err)
	}
	if err := s.writeResponse(w, m.Model(), req, res, f.JSON); err != nil {
		return fail(err)
	}
	m.Report(res, true, time.Since(began))
	return http.StatusOK
}

// writeResponse encodes the outputs: JSON data inline, binary outputs
// after the JSON header as Triton's extension lays them out, and for an
// output written to shared memory its metadata and the region's
// parameters, with no data.
//
// jsonBound is the most the JSON may take (footprint.json), which the
// buffer is sized to: it is charged already, and never grows.
func (s *API) writeResponse(w http.ResponseWriter, m *models.Model, req *core.InferRequest, res *serving.Result, jsonBound int64) error {
	b := make([]byte, 0, jsonBound)
	b = append(b, `{"model_name":`...)
	b = strconv.AppendQuote(b, m.Name)
	b = append(b, `,"model_version":`...)
	b = strconv.AppendQuote(b, m.Version)
	if req.ID != "" {
		idJSON, _ := json.Marshal(req.ID)
		b = append(b, `,"id":`...)
		b = append(b, idJSON...)
	}
	b = append(b, `,"outputs":[`...)
	var parts [4][]byte
	binaryParts := parts[:0]
	for i, c := range req.Outputs {
		spec := m.Config.Outputs[c.Index]
		data := res.Outputs[c.Index]
		if i > 0 {
			b = append(b, ',')
		}
		if c.Classes > 0 {
			b, binaryParts = core.AppendClassOutput(b, binaryParts, m, c, data, req.Rows)
			continue
		}
		b = append(b, `{"name":`...)
		b = strconv.AppendQuote(b, spec.Name)
		b = append(b, `,"datatype":"`...)
		b = append(b, spec.Datatype...)
		b = append(b, `","shape":[`...)
		b = strconv.AppendInt(b, int64(req.Rows), 10)
		for _, d := range spec.Shape[1:] {
			b = append(b, ',')
			b = strconv.AppendInt(b, int64(d), 10)
		}
		b = append(b, ']')
		if shm := c.SharedMemory; shm != nil {
			// Written to its region (core.Run): where, and how much.
			b = append(b, `,"parameters":{"shared_memory_region":`...)
			b = strconv.AppendQuote(b, shm.Region) // printable ASCII: valid JSON
			b = append(b, `,"shared_memory_offset":`...)
			b = strconv.AppendInt(b, shm.Offset, 10)
			b = append(b, `,"shared_memory_byte_size":`...)
			b = strconv.AppendInt(b, shm.Written, 10)
			b = append(b, "}}"...)
			continue
		}
		if c.Binary {
			b = append(b, `,"parameters":{"binary_data_size":`...)
			b = strconv.AppendInt(b, int64(len(data)), 10)
			b = append(b, "}}"...)
			binaryParts = append(binaryParts, data)
			continue
		}
		b = append(b, `,"data":`...)
		var err error
		if b, err = core.AppendJSONData(b, data, spec.Datatype); err != nil {
			return fmt.Errorf("model %s produced a bad value in output %q: %w", m.Name, spec.Name, err)
		}
		b = append(b, '}')
	}
	b = append(b, "]}"...)

	// Header keys already canonical, and shared values: no allocation or
	// canonicalization per response.
	h := w.Header()
	if len(binaryParts) == 0 {
		h["Content-Type"] = core.ContentTypeJSON
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
	h["Content-Type"] = core.ContentTypeOctets
	h[headerContentLength] = lengths[0:1:1]
	h["Content-Length"] = lengths[1:2:2]
	w.WriteHeader(http.StatusOK)
	w.Write(b)
	for _, p := range binaryParts {
		w.Write(p)
	}
	return nil
}
