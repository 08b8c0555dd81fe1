package admin

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
)

// The trace extension (Triton's): GET and POST /v2/trace/setting and
// /v2/models/{model}[/versions/{version}]/trace/setting, and stepserve's
// GET /v2/trace/files[/{name}] for the files the traces are written to.
// All of them are an administrator's: behind the repository token.

// traceSettings answers the global settings.
func (s *API) traceSettings(r *http.Request) (any, error) {
	return s.traceSettingsOf(r, "")
}

// modelTraceSettings answers a model's settings: its own over the
// global ones.
func (s *API) modelTraceSettings(r *http.Request) (any, error) {
	m, err := s.c.Lookup(chi.URLParam(r, "model"), chi.URLParam(r, "version"))
	if err != nil {
		return nil, err
	}
	return s.traceSettingsOf(r, m.Model().Name)
}

func (s *API) traceSettingsOf(r *http.Request, model string) (any, error) {
	if r.Method == http.MethodGet {
		return s.c.Opts.Tracer.Settings(model), nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, trace.MaxSettingsBytes+1))
	if err != nil {
		return nil, apierr.BadRequest(fmt.Sprintf("reading the request body: %v", err))
	}
	if len(body) > trace.MaxSettingsBytes {
		return nil, &apierr.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("trace settings are at most %d bytes", trace.MaxSettingsBytes)}
	}
	st, err := s.c.Opts.Tracer.Update(model, body)
	var bad *trace.BadSettingsError
	if errors.As(err, &bad) {
		return nil, apierr.BadRequest(bad.Error())
	}
	return st, err
}

// traceFiles lists the trace files, newest first.
func (s *API) traceFiles(r *http.Request) (any, error) {
	files, err := s.c.Opts.Tracer.Files().List()
	if err != nil {
		return nil, err
	}
	if files == nil {
		files = []trace.FileInfo{} // [] when there are none, not null
	}
	return map[string]any{"dir": s.c.Opts.Tracer.Dir(), "files": files}, nil
}

// traceFile downloads one trace file.
func (s *API) traceFile(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "name")
	f, info, err := s.c.Opts.Tracer.Files().Open(name)
	switch {
	case errors.Is(err, trace.ErrBadName):
		core.WriteError(w, http.StatusBadRequest, fmt.Sprintf("%q is not a trace file name; want a name GET /v2/trace/files lists (NAME.N.json)", apierr.ClipName(name)))
		return
	case errors.Is(err, trace.ErrNoFile):
		core.WriteError(w, http.StatusNotFound, fmt.Sprintf("no trace file %q; GET /v2/trace/files lists them", apierr.ClipName(name)))
		return
	case err != nil:
		core.WriteError(w, http.StatusInternalServerError, err.Error())
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", info.Name))
	http.ServeContent(w, r, info.Name, info.Created, f)
}
