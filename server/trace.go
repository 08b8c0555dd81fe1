package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/server/inferencepb"
)

// The trace extension (Triton's): GET and POST /v2/trace/setting and
// /v2/models/{model}[/versions/{version}]/trace/setting, and stepserve's
// GET /v2/trace/files[/{name}] for the files the traces are written to.
// All of them are an administrator's: behind the repository token.

// traceSettings answers the global settings.
func (s *adminAPI) traceSettings(r *http.Request) (any, error) {
	return s.traceSettingsOf(r, "")
}

// modelTraceSettings answers a model's settings: its own over the
// global ones.
func (s *adminAPI) modelTraceSettings(r *http.Request) (any, error) {
	m, err := s.lookupName(chi.URLParam(r, "model"), chi.URLParam(r, "version"))
	if err != nil {
		return nil, err
	}
	return s.traceSettingsOf(r, m.Model().Name)
}

func (s *adminAPI) traceSettingsOf(r *http.Request, model string) (any, error) {
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
func (s *adminAPI) traceFiles(r *http.Request) (any, error) {
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
func (s *adminAPI) traceFile(w http.ResponseWriter, r *http.Request) {
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

// TraceSetting is the trace extension over gRPC, as Triton serves it:
// the request's settings (a setting without values clears the model's
// override of it) applied as POST .../trace/setting applies them, and the
// settings in force answered, every value as a list of strings. Behind the
// repository token, as the HTTP endpoints are.
func (g *grpcServer) TraceSetting(ctx context.Context, r *inferencepb.TraceSettingRequest) (*inferencepb.TraceSettingResponse, error) {
	s := g.s
	if s.opts.Tracer == nil {
		return nil, grpcError(&apiError{http.StatusNotImplemented, "tracing is not configured on this server"})
	}
	model := ""
	if name := r.GetModelName(); name != "" {
		m, err := s.lookupName(name, "")
		if err != nil {
			return nil, grpcError(err)
		}
		model = m.Model().Name
	}
	settings := s.opts.Tracer.Settings(model)
	if len(r.GetSettings()) > 0 {
		if len(r.GetSettings()) > 64 {
			return nil, grpcError(badRequest(fmt.Sprintf("%d trace settings; there are 5 (trace_level, trace_rate, trace_count, log_frequency, trace_file)", len(r.GetSettings()))))
		}
		body := make(map[string]any, len(r.GetSettings()))
		for key, v := range r.GetSettings() {
			switch vals := v.GetValue(); {
			case len(vals) == 0:
				body[key] = nil // clears the model's override
			case key == "trace_level" || len(vals) > 1:
				body[key] = vals
			default:
				body[key] = vals[0]
			}
		}
		b, err := json.Marshal(body)
		if err != nil || len(b) > trace.MaxSettingsBytes {
			return nil, grpcError(&apiError{http.StatusRequestEntityTooLarge, fmt.Sprintf("trace settings are at most %d bytes", trace.MaxSettingsBytes)})
		}
		if settings, err = s.opts.Tracer.Update(model, b); err != nil {
			var bad *trace.BadSettingsError
			if errors.As(err, &bad) {
				return nil, grpcError(badRequest(bad.Error()))
			}
			return nil, grpcError(err)
		}
	}
	out := &inferencepb.TraceSettingResponse{Settings: map[string]*inferencepb.TraceSettingResponse_SettingValue{}}
	for key, v := range settings {
		var vals []string
		switch v := v.(type) {
		case []string:
			vals = v
		case string:
			vals = []string{v}
		default:
			vals = []string{fmt.Sprint(v)}
		}
		out.Settings[key] = &inferencepb.TraceSettingResponse_SettingValue{Value: vals}
	}
	return out, nil
}
