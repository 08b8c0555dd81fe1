package server

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stepserve/stepserve/server/core"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newLoggingServer serves summax with its log, at info, in log.
func newLoggingServer(t *testing.T, opts Options) (*Server, *slog.LevelVar, func() string) {
	t.Helper()
	var mu sync.Mutex
	var log bytes.Buffer
	level := new(slog.LevelVar)
	opts.Models = newSumMax(t).set
	opts.LogLevel, opts.LogFormat = level, "text"
	opts.Logger = slog.New(slog.NewTextHandler(lockedWriter{&mu, &log}, &slog.HandlerOptions{Level: level}))
	s, err := New(opts)
	require.NoError(t, err)
	return s, level, func() string {
		mu.Lock()
		defer mu.Unlock()
		return log.String()
	}
}

func logSettingsOf(t *testing.T, body string) core.LogSettings {
	t.Helper()
	var st core.LogSettings
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&st), body)
	return st
}

// GET /v2/logging reports the settings in Triton's shape; POST changes the
// log level at run time, and the server's log follows it.
func TestLoggingChangesTheLevel(t *testing.T) {
	s, level, log := newLoggingServer(t, Options{})
	w := do(t, s, "GET", "/v2/logging", nil)
	require.Equal(t, 200, w.Code, w.Body.String())
	assert.JSONEq(t, `{"log_file":"","log_info":true,"log_warnings":true,"log_errors":true,"log_verbose_level":0,"log_format":"text"}`, w.Body.String())

	// A bad request is logged at debug only: not yet.
	bad := []byte(`{"inputs":[]}`)
	require.Equal(t, 400, do(t, s, "POST", "/v2/models/summax/infer", bad).Code)
	assert.NotContains(t, log(), "inference failed")

	w = do(t, s, "POST", "/v2/logging", []byte(`{"log_verbose_level":1}`))
	require.Equal(t, 200, w.Code, w.Body.String())
	assert.Equal(t, core.LogSettings{LogInfo: true, LogWarnings: true, LogErrors: true, LogVerboseLevel: 1, LogFormat: "text"}, logSettingsOf(t, w.Body.String()))
	assert.Equal(t, slog.LevelDebug, level.Level())
	assert.Contains(t, log(), `msg="log level changed (POST /v2/logging)" from=INFO to=DEBUG`)
	require.Equal(t, 400, do(t, s, "POST", "/v2/models/summax/infer", bad).Code)
	assert.Contains(t, log(), "level=DEBUG msg=\"inference failed\"", "the log follows the new level")
	assert.Equal(t, uint32(1), logSettingsOf(t, do(t, s, "GET", "/v2/logging", nil).Body.String()).LogVerboseLevel)

	for _, tt := range []struct {
		body  string
		want  core.LogSettings
		level slog.Level
	}{
		{`{"log_verbose_level":0}`, core.LogSettings{LogInfo: true, LogWarnings: true, LogErrors: true}, slog.LevelInfo},
		{`{"log_info":false}`, core.LogSettings{LogWarnings: true, LogErrors: true}, slog.LevelWarn},
		{`{"log_warnings":false}`, core.LogSettings{LogErrors: true}, slog.LevelError},
		{`{"log_errors":false}`, core.LogSettings{}, core.LevelOff},
		{`{"log_warnings":true}`, core.LogSettings{LogWarnings: true, LogErrors: true}, slog.LevelWarn},
		{`{"log_info":true,"log_warnings":true,"log_errors":true,"log_verbose_level":0,"log_file":"","log_format":"text"}`, core.LogSettings{LogInfo: true, LogWarnings: true, LogErrors: true}, slog.LevelInfo},
		{`{"log_verbose_level":3,"log_info":true}`, core.LogSettings{LogInfo: true, LogWarnings: true, LogErrors: true, LogVerboseLevel: 3}, slog.LevelDebug},
		{`{}`, core.LogSettings{LogInfo: true, LogWarnings: true, LogErrors: true, LogVerboseLevel: 3}, slog.LevelDebug},
		{`{"log_info":null}`, core.LogSettings{LogInfo: true, LogWarnings: true, LogErrors: true, LogVerboseLevel: 3}, slog.LevelDebug},
		// The singular names Triton's server code reads, beside the
		// documented plural ones.
		{`{"log_verbose_level":0,"log_info":false,"log_warning":false}`, core.LogSettings{LogErrors: true}, slog.LevelError},
		{`{"log_error":false}`, core.LogSettings{}, core.LevelOff},
		{`{"log_warning":true,"log_warnings":true,"log_error":true}`, core.LogSettings{LogWarnings: true, LogErrors: true}, slog.LevelWarn},
	} {
		w := do(t, s, "POST", "/v2/logging", []byte(tt.body))
		require.Equal(t, 200, w.Code, "%s: %s", tt.body, w.Body.String())
		tt.want.LogFormat = "text"
		assert.Equal(t, tt.want, logSettingsOf(t, w.Body.String()), tt.body)
		assert.Equal(t, tt.level, level.Level(), tt.body)
	}
}

// What cannot be, or cannot hold at one threshold, is refused whole and
// changes nothing.
func TestLoggingRefusals(t *testing.T) {
	s, level, _ := newLoggingServer(t, Options{})
	for _, tt := range []struct{ body, want string }{
		{`{"log_info":true,"log_warnings":false}`, "these settings cannot hold together (log_info true)"},
		{`{"log_verbose_level":1,"log_errors":false}`, "cannot hold together (log_verbose_level 1)"},
		{`{"log_file":"/var/log/stepserve.log"}`, "log_file cannot be set: stepserve logs to standard error"},
		{`{"log_format":"ISO8601"}`, `log_format cannot change at run time: the log is "text"`},
		{`{"log_verbose":1}`, `unknown log setting "log_verbose"; the settings are log_file, log_info`},
		{`{"log_info":"yes"}`, "log setting log_info must be true or false"},
		{`{"log_verbose_level":-1}`, "log setting log_verbose_level must be a non-negative integer"},
		{`{"log_file":1}`, "log setting log_file must be a string"},
		{`{"log_warnings":true,"log_warning":false}`, "log_warnings and log_warning disagree"},
		{`[1]`, "the body must be a JSON object of log settings"},
		{`{"log_info":true`, "the body must be a JSON object of log settings"},
		{``, "the body must be a JSON object of log settings"},
	} {
		w := do(t, s, "POST", "/v2/logging", []byte(tt.body))
		assert.Equal(t, 400, w.Code, tt.body)
		assert.Contains(t, errorOf(t, w), tt.want, tt.body)
		assert.Equal(t, slog.LevelInfo, level.Level(), "%s changed nothing", tt.body)
	}
	w := do(t, s, "POST", "/v2/logging", []byte(`{"log_file":"`+strings.Repeat("x", 5000)+`"}`))
	assert.Equal(t, 413, w.Code)
	assert.Equal(t, 405, do(t, s, "PUT", "/v2/logging", []byte(`{}`)).Code)
}

// The logging endpoint is an administrator's: the repository API's
// tokens guard it, not the inference tokens.
func TestLoggingNeedsTheRepositoryToken(t *testing.T) {
	s, level, _ := newLoggingServer(t, Options{InferenceTokens: []string{"infer"}, RepositoryTokens: []string{"admin"}})
	for _, method := range []string{"GET", "POST"} {
		assert.Equal(t, 401, do(t, s, method, "/v2/logging", []byte(`{"log_verbose_level":1}`)).Code, method)
		assert.Equal(t, 401, do(t, s, method, "/v2/logging", []byte(`{"log_verbose_level":1}`), "Authorization", "Bearer infer").Code, method)
	}
	assert.Equal(t, slog.LevelInfo, level.Level())
	assert.Equal(t, 200, do(t, s, "POST", "/v2/logging", []byte(`{"log_verbose_level":1}`), "Authorization", "Bearer admin").Code)
	assert.Equal(t, slog.LevelDebug, level.Level())
}

// Without a log level to control the extension is not offered.
func TestLoggingNeedsALevel(t *testing.T) {
	s, _ := newTestServer(t, newSumMax(t))
	w := do(t, s, "GET", "/v2/logging", nil)
	assert.Equal(t, 501, w.Code)
	assert.Contains(t, errorOf(t, w), "the logging extension is not available")
	var meta struct{ Extensions []string }
	require.NoError(t, json.Unmarshal(do(t, s, "GET", "/v2", nil).Body.Bytes(), &meta))
	assert.NotContains(t, meta.Extensions, "logging")

	s, _, _ = newLoggingServer(t, Options{})
	require.NoError(t, json.Unmarshal(do(t, s, "GET", "/v2", nil).Body.Bytes(), &meta))
	assert.Contains(t, meta.Extensions, "logging")
}
