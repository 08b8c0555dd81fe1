package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// Triton's logging extension: GET /v2/logging reports the log settings,
// POST /v2/logging changes those it names and reports them all. It is an
// administrator's endpoint: the repository API's bearer tokens
// (auth.repository) guard it.
//
// stepserve's log has one threshold, a slog level, shared by the whole
// process (Options.LogLevel); Triton's settings map onto it:
//
//	log_verbose_level > 0   debug (every level)
//	log_info                info and above
//	log_warnings            warnings and above
//	log_errors              errors
//
// so a setting that turns a level on turns on the levels above it, and one
// that turns a level off turns off those below it. A request whose
// settings cannot hold together at one threshold (log_info true with
// log_warnings false) is refused with 400, as is a change to what
// stepserve cannot change at run time: log_file (the log is standard
// error) and log_format (log.format at start: text or json, which GET
// reports).

// logSettings is the logging extension's settings object.
type logSettings struct {
	LogFile         string `json:"log_file"`
	LogInfo         bool   `json:"log_info"`
	LogWarnings     bool   `json:"log_warnings"`
	LogErrors       bool   `json:"log_errors"`
	LogVerboseLevel uint32 `json:"log_verbose_level"`
	LogFormat       string `json:"log_format"`
}

// logUpdate is a request to change log settings: the settings it names.
type logUpdate struct {
	LogFile         *string `json:"log_file"`
	LogInfo         *bool   `json:"log_info"`
	LogWarnings     *bool   `json:"log_warnings"`
	LogErrors       *bool   `json:"log_errors"`
	LogVerboseLevel *uint32 `json:"log_verbose_level"`
	LogFormat       *string `json:"log_format"`
}

// levelOff is a threshold above every level the server logs at: nothing
// is logged (log_errors false).
const levelOff = slog.LevelError + 4

// logControl is the state behind the logging extension.
type logControl struct {
	mu      sync.Mutex
	verbose uint32 // the log_verbose_level last set, reported while the level is debug
}

// logSettings reports the settings in force.
func (s *Core) logSettings() logSettings {
	s.logs.mu.Lock()
	defer s.logs.mu.Unlock()
	return s.logSettingsLocked()
}

func (s *Core) logSettingsLocked() logSettings {
	level := s.opts.LogLevel.Level()
	st := logSettings{LogInfo: level <= slog.LevelInfo, LogWarnings: level <= slog.LevelWarn,
		LogErrors: level <= slog.LevelError, LogFormat: s.opts.LogFormat}
	if level <= slog.LevelDebug {
		st.LogVerboseLevel = max(s.logs.verbose, 1)
	}
	return st
}

// updateLogSettings applies u, in full or not at all, and reports the
// settings then in force. Its errors are the client's (400, or
// InvalidArgument).
func (s *Core) updateLogSettings(u logUpdate) (logSettings, error) {
	s.logs.mu.Lock()
	defer s.logs.mu.Unlock()
	cur := s.logSettingsLocked()
	if u.LogFile != nil && *u.LogFile != cur.LogFile {
		return cur, errors.New("log_file cannot be set: stepserve logs to standard error; redirect that (or read the container's log) instead")
	}
	if u.LogFormat != nil && *u.LogFormat != cur.LogFormat {
		return cur, fmt.Errorf("log_format cannot change at run time: the log is %q (log.format, text or json, set at start)", cur.LogFormat)
	}
	level, verbose := s.opts.LogLevel.Level(), s.logs.verbose
	if v := u.LogVerboseLevel; v != nil {
		verbose = *v
		if *v > 0 {
			level = min(level, slog.LevelDebug)
		} else {
			level = max(level, slog.LevelInfo)
		}
	}
	on := func(b *bool, at, above slog.Level) {
		switch {
		case b == nil:
		case *b:
			level = min(level, at)
		default:
			level = max(level, above)
		}
	}
	on(u.LogInfo, slog.LevelInfo, slog.LevelWarn)
	on(u.LogWarnings, slog.LevelWarn, slog.LevelError)
	on(u.LogErrors, slog.LevelError, levelOff)

	// Every setting named must hold at the one threshold they make.
	next := logSettings{LogInfo: level <= slog.LevelInfo, LogWarnings: level <= slog.LevelWarn, LogErrors: level <= slog.LevelError}
	var clash []string
	for _, c := range []struct {
		name     string
		asked    *bool
		resulted bool
	}{{"log_info", u.LogInfo, next.LogInfo}, {"log_warnings", u.LogWarnings, next.LogWarnings}, {"log_errors", u.LogErrors, next.LogErrors}} {
		if c.asked != nil && *c.asked != c.resulted {
			clash = append(clash, fmt.Sprintf("%s %v", c.name, *c.asked))
		}
	}
	if v := u.LogVerboseLevel; v != nil && (*v > 0) != (level <= slog.LevelDebug) {
		clash = append(clash, fmt.Sprintf("log_verbose_level %d", *v))
	}
	if len(clash) > 0 {
		return cur, fmt.Errorf("these settings cannot hold together (%s): stepserve logs every level above the lowest it logs (verbose, info, warnings, errors)", strings.Join(clash, ", "))
	}
	if prev := s.opts.LogLevel.Level(); prev != level {
		// Said before the change, at the level in force, so that the
		// log shows who turned it down.
		s.logger.Log(context.Background(), max(prev, slog.LevelWarn), "log level changed (POST /v2/logging)", "from", prev.String(), "to", levelName(level))
	}
	s.opts.LogLevel.Set(level)
	s.logs.verbose = verbose
	return s.logSettingsLocked(), nil
}

func levelName(l slog.Level) string {
	if l >= levelOff {
		return "off"
	}
	return l.String()
}

// maxLogSettingsBytes bounds a POST /v2/logging body: six settings.
const maxLogSettingsBytes = 4 << 10

// loggingSettings answers GET and POST /v2/logging.
func (s *adminAPI) loggingSettings(r *http.Request) (any, error) {
	if s.opts.LogLevel == nil {
		return nil, &apiError{http.StatusNotImplemented, "the logging extension is not available: this server was started without a log level to control"}
	}
	if r.Method == http.MethodGet {
		return s.logSettings(), nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxLogSettingsBytes+1))
	if err != nil {
		return nil, badRequest(fmt.Sprintf("reading the request body: %v", err))
	}
	if len(body) > maxLogSettingsBytes {
		return nil, &apiError{http.StatusRequestEntityTooLarge, fmt.Sprintf("log settings are at most %d bytes", maxLogSettingsBytes)}
	}
	var u logUpdate
	if err := decodeLogUpdate(body, &u); err != nil {
		return nil, badRequest(err.Error())
	}
	st, err := s.updateLogSettings(u)
	if err != nil {
		return nil, badRequest(err.Error())
	}
	return st, nil
}

// logSettingNames are the settings a request may name.
var logSettingNames = []string{"log_file", "log_info", "log_warnings", "log_errors", "log_verbose_level", "log_format"}

// decodeLogUpdate reads a log settings request: a JSON object of the
// settings it changes, each of its type; an unknown setting is an error
// that names it, never ignored.
func decodeLogUpdate(body []byte, u *logUpdate) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil || raw == nil {
		return errors.New("the body must be a JSON object of log settings, e.g. {\"log_verbose_level\": 1}")
	}
	for k := range raw {
		if !slices.Contains(logSettingNames, k) {
			return fmt.Errorf("unknown log setting %q; the settings are %s", clipName(k), strings.Join(logSettingNames, ", "))
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(u); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			want := map[string]string{"log_file": "a string", "log_format": "a string", "log_verbose_level": "a non-negative integer"}[te.Field]
			if want == "" {
				want = "true or false"
			}
			return fmt.Errorf("log setting %s must be %s", te.Field, want)
		}
		return fmt.Errorf("malformed log settings: %v", err)
	}
	return nil
}
