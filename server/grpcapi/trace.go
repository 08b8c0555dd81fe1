package grpcapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/inferencepb"
)

// TraceSetting is the trace extension over gRPC, as Triton serves it:
// the request's settings (a setting without values clears the model's
// override of it) applied as POST .../trace/setting applies them, and the
// settings in force answered, every value as a list of strings. Behind the
// repository token, as the HTTP endpoints are.
func (g *grpcServer) TraceSetting(ctx context.Context, r *inferencepb.TraceSettingRequest) (*inferencepb.TraceSettingResponse, error) {
	s := g.s
	if s.c.Opts.Tracer == nil {
		return nil, core.GRPCError(&apierr.Error{Status: http.StatusNotImplemented, Msg: "tracing is not configured on this server"})
	}
	model := ""
	if name := r.GetModelName(); name != "" {
		m, err := s.c.Lookup(name, "")
		if err != nil {
			return nil, core.GRPCError(err)
		}
		model = m.Model().Name
	}
	settings := s.c.Opts.Tracer.Settings(model)
	if len(r.GetSettings()) > 0 {
		if len(r.GetSettings()) > 64 {
			return nil, core.GRPCError(apierr.BadRequest(fmt.Sprintf("%d trace settings; there are 5 (trace_level, trace_rate, trace_count, log_frequency, trace_file)", len(r.GetSettings()))))
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
			return nil, core.GRPCError(&apierr.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("trace settings are at most %d bytes", trace.MaxSettingsBytes)})
		}
		if settings, err = s.c.Opts.Tracer.Update(model, b); err != nil {
			var bad *trace.BadSettingsError
			if errors.As(err, &bad) {
				return nil, core.GRPCError(apierr.BadRequest(bad.Error()))
			}
			return nil, core.GRPCError(err)
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
