package admin

import (
	"fmt"
	"io"
	"net/http"

	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
)

// loggingSettings answers GET and POST /v2/logging.
func (s *API) loggingSettings(r *http.Request) (any, error) {
	if s.c.Opts.LogLevel == nil {
		return nil, &apierr.Error{Status: http.StatusNotImplemented, Msg: "the logging extension is not available: this server was started without a log level to control"}
	}
	if r.Method == http.MethodGet {
		return s.c.LogSettings(), nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, core.MaxLogSettingsBytes+1))
	if err != nil {
		return nil, apierr.BadRequest(fmt.Sprintf("reading the request body: %v", err))
	}
	if len(body) > core.MaxLogSettingsBytes {
		return nil, &apierr.Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("log settings are at most %d bytes", core.MaxLogSettingsBytes)}
	}
	var u core.LogUpdate
	if err := core.DecodeLogUpdate(body, &u); err != nil {
		return nil, apierr.BadRequest(err.Error())
	}
	st, err := s.c.UpdateLogSettings(u)
	if err != nil {
		return nil, apierr.BadRequest(err.Error())
	}
	return st, nil
}
