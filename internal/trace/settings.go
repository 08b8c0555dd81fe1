package trace

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Level is how much a traced step records.
type Level int8

const (
	// LevelOff traces nothing.
	LevelOff Level = iota
	// LevelTimestamps records each traced request's and step's phases.
	LevelTimestamps
	// LevelProfile records what LevelTimestamps does, and what the engine sees inside
	// the step: the CPU engine's kernels, a worker's torch.profiler events.
	LevelProfile
)

var levelNames = [...]string{LevelOff: "OFF", LevelTimestamps: "TIMESTAMPS", LevelProfile: "PROFILE"}

func (l Level) String() string { return levelNames[l] }

// Settings are the trace settings in force for a model (or the server's
// global ones), as Triton's trace extension names them.
type Settings struct {
	Level Level
	// Rate samples one request in Rate.
	Rate int
	// Count is how many more steps are traced: -1 is no limit, 0 none.
	// It counts down as steps are traced.
	Count int
	// LogFrequency writes a file every LogFrequency traced steps; 0 writes
	// one when Count runs out (or, with no limit, every MaxStepsPerFile
	// steps and when tracing stops).
	LogFrequency int
	// File names the trace files: File.N.json under the trace directory.
	// Empty means the model's name.
	File string
}

// DefaultSettings are the global settings at start: tracing off, every
// request sampled once it is on, no limit on the steps.
var DefaultSettings = Settings{Level: LevelOff, Rate: 1, Count: -1}

// The settings' keys, as Triton writes them.
const (
	keyLevel        = "trace_level"
	keyRate         = "trace_rate"
	keyCount        = "trace_count"
	keyLogFrequency = "log_frequency"
	keyFile         = "trace_file"
)

var settingKeys = []string{keyLevel, keyRate, keyCount, keyLogFrequency, keyFile}

// MaxCount bounds trace_count and log_frequency: a trace of more steps
// than this is spread over several files anyway.
const MaxCount = 1 << 20

// MaxSettingsBytes bounds a settings request body.
const MaxSettingsBytes = 16 << 10

// fileName is what a trace_file may be: a plain name, no path.
var fileName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,99}$`)

// Map is settings as Triton's JSON writes them: strings, trace_level an
// array of strings.
func (s Settings) Map() map[string]any {
	return map[string]any{
		keyLevel:        []string{s.Level.String()},
		keyRate:         strconv.Itoa(s.Rate),
		keyCount:        strconv.Itoa(s.Count),
		keyLogFrequency: strconv.Itoa(s.LogFrequency),
		keyFile:         s.File,
	}
}

// update is a settings request: per key, the new value, or clear (a JSON
// null: the model's override is removed).
type update struct {
	set   map[string]any // parsed values: Level, or int, or string
	clear map[string]bool
}

// BadSettingsError says which keys of a settings request are unknown or
// have bad values, and what each takes.
type BadSettingsError struct{ Problems []string }

func (e *BadSettingsError) Error() string {
	return "bad trace settings: " + strings.Join(e.Problems, "; ")
}

// parseUpdate reads a settings request body (a JSON object; at most
// MaxSettingsBytes bytes). Every problem is reported at once, each naming
// its key.
func parseUpdate(body []byte) (update, error) {
	u := update{set: map[string]any{}, clear: map[string]bool{}}
	if len(body) > MaxSettingsBytes {
		return u, &BadSettingsError{[]string{fmt.Sprintf("the request body is %d bytes; want at most %d", len(body), MaxSettingsBytes)}}
	}
	var raw map[string]json.RawMessage
	if len(strings.TrimSpace(string(body))) > 0 {
		if err := json.Unmarshal(body, &raw); err != nil {
			return u, &BadSettingsError{[]string{fmt.Sprintf("the request body is not a JSON object of settings: %v", err)}}
		}
	}
	var problems []string
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		v := raw[k]
		if !slices.Contains(settingKeys, k) {
			problems = append(problems, fmt.Sprintf("%s: unknown setting; want %s", clip(k), strings.Join(settingKeys, ", ")))
			continue
		}
		if string(v) == "null" {
			u.clear[k] = true
			continue
		}
		val, err := parseValue(k, v)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", k, err))
			continue
		}
		u.set[k] = val
	}
	if problems != nil {
		return u, &BadSettingsError{problems}
	}
	return u, nil
}

// parseValue reads one setting's value: a string (an array of one for
// trace_level, whose strings may also come bare), numbers as strings, as
// Triton writes them (a JSON number is taken too).
func parseValue(key string, v json.RawMessage) (any, error) {
	var s string
	if key == keyLevel {
		var list []string
		if err := json.Unmarshal(v, &list); err != nil {
			if err := json.Unmarshal(v, &s); err != nil {
				return nil, fmt.Errorf("%s is not a string or an array of strings; want [\"OFF\"], [\"TIMESTAMPS\"] or [\"PROFILE\"]", clip(string(v)))
			}
			list = []string{s}
		}
		return parseLevel(list)
	}
	if err := json.Unmarshal(v, &s); err != nil {
		var n json.Number
		if err := json.Unmarshal(v, &n); err != nil {
			return nil, fmt.Errorf("%s is not a string", clip(string(v)))
		}
		s = n.String()
	}
	if key == keyFile {
		if s != "" && !fileName.MatchString(s) {
			return nil, fmt.Errorf("%q is not a plain file name; want letters, digits, '.', '_' or '-' (at most 100, no path separators, not starting with '.'), or empty for the model's name", clip(s))
		}
		return s, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(s))
	switch {
	case err != nil:
		return nil, fmt.Errorf("%q is not an integer", clip(s))
	case key == keyRate && (n < 1 || n > MaxCount):
		return nil, fmt.Errorf("%d; want 1..%d (one request in N is traced)", n, MaxCount)
	case key == keyCount && (n < -1 || n > MaxCount):
		return nil, fmt.Errorf("%d; want -1 (no limit) or 0..%d steps", n, MaxCount)
	case key == keyLogFrequency && (n < 0 || n > MaxCount):
		return nil, fmt.Errorf("%d; want 0..%d steps per file", n, MaxCount)
	}
	return n, nil
}

// parseLevel reads trace_level's strings: OFF, TIMESTAMPS or PROFILE, the
// highest of them counting (Triton lists levels; PROFILE includes
// TIMESTAMPS). TENSORS, Triton's tensor dump, is refused.
func parseLevel(list []string) (Level, error) {
	if len(list) == 0 || len(list) > 4 {
		return LevelOff, fmt.Errorf("%d levels; want 1 to 4 of OFF, TIMESTAMPS, PROFILE", len(list))
	}
	l := LevelOff
	for _, s := range list {
		switch strings.ToUpper(strings.TrimSpace(s)) {
		case "OFF":
		case "TIMESTAMPS":
			l = max(l, LevelTimestamps)
		case "PROFILE":
			l = LevelProfile
		case "TENSORS":
			return LevelOff, fmt.Errorf("TENSORS (Triton's dump of every tensor) is not supported by stepserve; want OFF, TIMESTAMPS or PROFILE")
		default:
			return LevelOff, fmt.Errorf("%q; want OFF, TIMESTAMPS or PROFILE", clip(s))
		}
	}
	return l, nil
}

// apply sets the keys u sets on s, and, on the keys it sets, marks them
// in has (a model's overrides).
func (u update) apply(s *Settings, has map[string]bool) {
	for k, v := range u.set {
		switch k {
		case keyLevel:
			s.Level = v.(Level)
		case keyRate:
			s.Rate = v.(int)
		case keyCount:
			s.Count = v.(int)
		case keyLogFrequency:
			s.LogFrequency = v.(int)
		case keyFile:
			s.File = v.(string)
		}
		if has != nil {
			has[k] = true
		}
	}
}

// clip shortens what a client sent for an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
