package grpcapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/inferencepb"
)

// LogSettings is Triton's logging extension over gRPC, answering as GET
// and POST /v2/logging do: a request without settings reads them; one
// with settings changes those it names (a setting without a value
// changes nothing, as JSON's null) and answers them all. The settings go
// through the HTTP body's checks, as the JSON object they are, so that
// the two protocols refuse the same settings with the same messages.
// Behind the repository token, as the HTTP endpoint is.
func (g *grpcServer) LogSettings(ctx context.Context, r *inferencepb.LogSettingsRequest) (*inferencepb.LogSettingsResponse, error) {
	c := g.s.c
	if c.Opts.LogLevel == nil {
		return nil, core.GRPCError(&apierr.Error{Status: http.StatusNotImplemented, Msg: "the logging extension is not available: this server was started without a log level to control"})
	}
	st := c.LogSettings()
	if len(r.GetSettings()) > 0 {
		body, err := logSettingsJSON(r.GetSettings())
		if err != nil {
			return nil, core.GRPCError(err)
		}
		var u core.LogUpdate
		if err := core.DecodeLogUpdate(body, &u); err != nil {
			return nil, core.GRPCError(apierr.BadRequest(err.Error()))
		}
		if st, err = c.UpdateLogSettings(u); err != nil {
			return nil, core.GRPCError(apierr.BadRequest(err.Error()))
		}
	}
	resp, err := logSettingsResponse(st)
	if err != nil {
		return nil, core.GRPCError(err)
	}
	return resp, nil
}

// logSettingsJSON is a request's settings as the JSON object POST
// /v2/logging takes, bounded as its body is.
func logSettingsJSON(settings map[string]*inferencepb.LogSettingsRequest_SettingValue) ([]byte, error) {
	tooLarge := &apierr.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("log settings are at most %d bytes", core.MaxLogSettingsBytes)}
	if len(settings) > core.MaxLogSettingsBytes/5 { // `"":0,` at the least
		return nil, tooLarge
	}
	obj := make(map[string]any, len(settings))
	for key, v := range settings {
		switch p := v.GetParameterChoice().(type) {
		case *inferencepb.LogSettingsRequest_SettingValue_BoolParam:
			obj[key] = p.BoolParam
		case *inferencepb.LogSettingsRequest_SettingValue_Uint32Param:
			obj[key] = p.Uint32Param
		case *inferencepb.LogSettingsRequest_SettingValue_StringParam:
			obj[key] = p.StringParam
		default:
			obj[key] = nil // no value: as JSON's null, no change
		}
	}
	b, err := json.Marshal(obj)
	if err != nil || len(b) > core.MaxLogSettingsBytes {
		return nil, tooLarge
	}
	return b, nil
}

// logSettingsResponse is st as Triton's gRPC answers it: each setting by
// the name GET /v2/logging gives it (its JSON document, so that the two
// cannot disagree), in the field of its type.
func logSettingsResponse(st core.LogSettings) (*inferencepb.LogSettingsResponse, error) {
	doc, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	var settings map[string]any
	if err := json.Unmarshal(doc, &settings); err != nil {
		return nil, err
	}
	out := &inferencepb.LogSettingsResponse{Settings: make(map[string]*inferencepb.LogSettingsResponse_SettingValue, len(settings))}
	for key, v := range settings {
		sv := &inferencepb.LogSettingsResponse_SettingValue{}
		switch v := v.(type) {
		case bool:
			sv.ParameterChoice = &inferencepb.LogSettingsResponse_SettingValue_BoolParam{BoolParam: v}
		case float64: // log_verbose_level, a uint32
			sv.ParameterChoice = &inferencepb.LogSettingsResponse_SettingValue_Uint32Param{Uint32Param: uint32(v)}
		case string:
			sv.ParameterChoice = &inferencepb.LogSettingsResponse_SettingValue_StringParam{StringParam: v}
		default:
			return nil, &apierr.Error{Status: http.StatusInternalServerError, Msg: fmt.Sprintf("log setting %s is a %T: the gRPC response has no field for it", key, v)}
		}
		out.Settings[key] = sv
	}
	return out, nil
}
