package core

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/stepserve/stepserve/server/apierr"
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

// LogSettings is the logging extension's settings object.
type LogSettings struct {
	LogFile         string `json:"log_file"`
	LogInfo         bool   `json:"log_info"`
	LogWarnings     bool   `json:"log_warnings"`
	LogErrors       bool   `json:"log_errors"`
	LogVerboseLevel uint32 `json:"log_verbose_level"`
	LogFormat       string `json:"log_format"`
}

// LogUpdate is a request to change log settings: the settings it names.
type LogUpdate struct {
	LogFile         *string `json:"log_file"`
	LogInfo         *bool   `json:"log_info"`
	LogWarnings     *bool   `json:"log_warnings"`
	LogErrors       *bool   `json:"log_errors"`
	LogVerboseLevel *uint32 `json:"log_verbose_level"`
	LogFormat       *string `json:"log_format"`
	// LogWarning and LogError are the singular names Triton's server
	// code reads (its documentation says log_warnings and log_errors):
	// either spelling is taken.
	LogWarning *bool `json:"log_warning"`
	LogError   *bool `json:"log_error"`
}

// LevelOff is a threshold above every level the server logs at: nothing
// is logged (log_errors false).
const LevelOff = slog.LevelError + 4

// LogControl is the state behind the logging extension.
type LogControl struct {
	mu      sync.Mutex
	verbose uint32 // the log_verbose_level last set, reported while the level is debug
}

// LogSettings reports the settings in force.
func (c *Core) LogSettings() LogSettings {
	c.logs.mu.Lock()
	defer c.logs.mu.Unlock()
	return c.logSettingsLocked()
}

func (c *Core) logSettingsLocked() LogSettings {
	level := c.Opts.LogLevel.Level()
	st := LogSettings{LogInfo: level <= slog.LevelInfo, LogWarnings: level <= slog.LevelWarn,
		LogErrors: level <= slog.LevelError, LogFormat: c.Opts.LogFormat}
	if level <= slog.LevelDebug {
		st.LogVerboseLevel = max(c.logs.verbose, 1)
	}
	return st
}

// UpdateLogSettings applies u, in full or not at all, and reports the
// settings then in force. Its errors are the client's (400, or
// InvalidArgument).
func (c *Core) UpdateLogSettings(u LogUpdate) (LogSettings, error) {
	c.logs.mu.Lock()
	defer c.logs.mu.Unlock()
	cur := c.logSettingsLocked()
	for _, a := range []struct {
		plural, singular **bool
		name             string
	}{{&u.LogWarnings, &u.LogWarning, "log_warnings"}, {&u.LogErrors, &u.LogError, "log_errors"}} {
		switch {
		case *a.singular == nil:
		case *a.plural == nil:
			*a.plural = *a.singular
		case **a.plural != **a.singular:
			return cur, fmt.Errorf("%s and %s disagree; send one of them", a.name, strings.TrimSuffix(a.name, "s"))
		}
	}
	if u.LogFile != nil && *u.LogFile != cur.LogFile {
		return cur, errors.New("log_file cannot be set: stepserve logs to standard error; redirect that (or read the container's log) instead")
	}
	if u.LogFormat != nil && *u.LogFormat != cur.LogFormat {
		return cur, fmt.Errorf("log_format cannot change at run time: the log is %q (log.format, text or json, set at start)", cur.LogFormat)
	}
	level, verbose := c.Opts.LogLevel.Level(), c.logs.verbose
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
	on(u.LogErrors, slog.LevelError, LevelOff)

	// Every setting named must hold at the one threshold they make.
	next := LogSettings{LogInfo: level <= slog.LevelInfo, LogWarnings: level <= slog.LevelWarn, LogErrors: level <= slog.LevelError}
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
	if prev := c.Opts.LogLevel.Level(); prev != level {
		// Said before the change, at the level in force, so that the
		// log shows who turned it down.
		c.Logger.Log(context.Background(), max(prev, slog.LevelWarn), "log level changed (POST /v2/logging)", "from", prev.String(), "to", levelName(level))
	}
	c.Opts.LogLevel.Set(level)
	c.logs.verbose = verbose
	return c.logSettingsLocked(), nil
}

func levelName(l slog.Level) string {
	if l >= LevelOff {
		return "off"
	}
	return l.String()
}

// MaxLogSettingsBytes bounds a POST /v2/logging body: six settings.
const MaxLogSettingsBytes = 4 << 10

// logSettingNames are the settings a request may name.
var logSettingNames = []string{"log_file", "log_info", "log_warnings", "log_errors", "log_verbose_level", "log_format", "log_warning", "log_error"}

// DecodeLogUpdate reads a log settings request: a JSON object of the
// settings it changes, each of its type; an unknown setting is an error
// that names it, never ignored.
func DecodeLogUpdate(body []byte, u *LogUpdate) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil || raw == nil {
		return errors.New("the body must be a JSON object of log settings, e.g. {\"log_verbose_level\": 1}")
	}
	for k := range raw {
		if !slices.Contains(logSettingNames, k) {
			return fmt.Errorf("unknown log setting %q; the settings are %s", apierr.ClipName(k), strings.Join(logSettingNames, ", "))
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
