package server

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/stepserve/stepserve/internal/trace"
)

// The trace extension (Triton's): GET and POST /v2/trace/setting and
// /v2/models/{model}[/versions/{version}]/trace/setting, and stepserve's
// GET /v2/trace/files[/{name}] for the files the traces are written to.
// All of them are an administrator's: behind the repository token.

// traceSettings answers the global settings.
func (s *Server) traceSettings(r *http.Request) (any, error) {
	return s.traceSettingsOf(r, "")
}

// modelTraceSettings answers a model's settings: its own over the
// global ones.
func (s *Server) modelTraceSettings(r *http.Request) (any, error) {
	m, err := s.lookupName(chi.URLParam(r, "model"), chi.URLParam(r, "version"))
	if err != nil {
		return nil, err
	}
	return s.traceSettingsOf(r, m.Model().Name)
}

func (s *Server) traceSettingsOf(r *http.Request, model string) (any, error) {
	if r.Method == http.MethodGet {
		return s.opts.Tracer.Settings(model), nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, trace.MaxSettingsBytes+1))
	if err != nil {
		return nil, badRequest(fmt.Sprintf("reading the request body: %v", err))
	}
	if len(body) > trace.MaxSettingsBytes {
		return nil, &apiError{http.StatusRequestEntityTooLarge, fmt.Sprintf("trace settings are at most %d bytes", trace.MaxSettingsBytes)}
	}
	st, err := s.opts.Tracer.Update(model, body)
	var bad *trace.BadSettingsError
	if errors.As(err, &bad) {
		return nil, badRequest(bad.Error())
	}
	return st, err
}

// traceFiles lists the trace files, newest first.
func (s *Server) traceFiles(r *http.Request) (any, error) {
	files, err := s.opts.Tracer.Files().List()
	if err != nil {
		return nil, err
	}
	if files == nil {
		files = []trace.FileInfo{} // [] when there are none, not null
	}
	return map[string]any{"dir": s.opts.Tracer.Dir(), "files": files}, nil
}

// traceFile downloads one trace file.
func (s *Server) traceFile(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "name")
	f, info, err := s.opts.Tracer.Files().Open(name)
	switch {
	case errors.Is(err, trace.ErrBadName):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%q is not a trace file name; want a name GET /v2/trace/files lists (NAME.N.json)", clipName(name)))
		return
	case errors.Is(err, trace.ErrNoFile):
		writeError(w, http.StatusNotFound, fmt.Sprintf("no trace file %q; GET /v2/trace/files lists them", clipName(name)))
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", info.Name))
	http.ServeContent(w, r, info.Name, info.Created, f)
}

// CloseTracer writes the traces being taken, at shutdown.
func (s *Server) CloseTracer() { s.opts.Tracer.Close() }

// traceStatus is the status a gRPC request's trace records.
func traceStatus(err error) int {
	if err == nil {
		return http.StatusOK
	}
	return statusOf(err)
}
