package config

import (
	"fmt"
	"strconv"
	"strings"
)

// A kind is a key's value type, in two forms drawn from the same bounds its
// reader checks: the word --help shows beside the flag, and the JSON Schema
// of the value as a YAML file (and so the Helm chart's values) writes it.
// The schema cannot say everything a reader checks (a directory that
// exists, a token's length); what it says, the server agrees with, and
// TestSchemaAgreesWithTheReaders holds the two to that.
type kind struct {
	word   string
	schema map[string]any
}

// nonNegDuration matches what time.ParseDuration reads without a sign (a
// sequence of decimal numbers, each with a unit, or a bare 0): the keys
// that take a duration want 0 or more.
const nonNegDuration = `^(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`

// sizeText matches what ParseBytes reads.
const sizeText = `^[0-9]+ *(B|KB|MB|GB|Ki|Mi|Gi|KiB|MiB|GiB)?$`

// port is 0 to 65535, or a service name.
const port = `([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]|[a-z][a-z0-9-]*)`

// hostPort matches a listen address: an optional host (a name, an IPv4
// address or a bracketed IPv6 one) and a port.
const hostPort = `^(\[[0-9A-Fa-f:.%a-z]+\]|[^:\[\]\s]*):` + port + `$`

// durationKind is a duration; zero says whether 0 is accepted (else it must
// be positive). A YAML 0 (an integer) reads as the duration 0.
func durationKind(zero bool) kind {
	if zero {
		return kind{"duration", map[string]any{"anyOf": []any{
			map[string]any{"type": "string", "pattern": nonNegDuration},
			map[string]any{"type": "integer", "enum": []any{0}},
		}}}
	}
	return kind{"duration", map[string]any{"type": "string", "pattern": nonNegDuration, "not": map[string]any{"pattern": `^([0.]+[a-zµμ]*)+$`}}}
}

// sizeKind is a size in bytes, at least minimum (or exactly 0 when zero):
// an integer, or text with a unit.
func sizeKind(minimum int64, zero bool) kind {
	n := map[string]any{"type": "integer", "minimum": minimum}
	if zero {
		n = map[string]any{"type": "integer", "anyOf": []any{
			map[string]any{"enum": []any{0}},
			map[string]any{"minimum": minimum},
		}}
	}
	return kind{"size", map[string]any{"anyOf": []any{n, map[string]any{"type": "string", "pattern": sizeText}}}}
}

// autoSizeKind is sizeKind with the word auto.
func autoSizeKind(minimum int64) kind {
	k := sizeKind(minimum, true)
	k.schema["anyOf"] = append(k.schema["anyOf"].([]any), map[string]any{"enum": []any{"auto"}})
	k.word = "size|auto"
	return k
}

// intKind is an integer in lo..hi (no upper bound when hi is 0); YAML may
// quote it, and the range of quoted text is the server's to check.
func intKind(lo, hi int) kind {
	s := map[string]any{"type": "integer", "minimum": lo}
	if hi > 0 {
		s["maximum"] = hi
	}
	return kind{"integer", map[string]any{"anyOf": []any{s, map[string]any{"type": "string", "pattern": `^[-+]?[0-9]+$`}}}}
}

// boolKind is a boolean, or what strconv.ParseBool reads: the strings, and
// the integers 0 and 1. The strings and the integers are separate enums:
// Helm 3.19's schema validator refuses one enum holding both "0" and 0
// (it takes them for duplicate items).
var boolKind = kind{"boolean", map[string]any{"anyOf": []any{
	map[string]any{"type": "boolean"},
	map[string]any{"type": "string", "enum": []any{"1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"}},
	map[string]any{"type": "integer", "enum": []any{0, 1}},
}}}

func enumKind(words ...string) kind {
	e := make([]any, len(words))
	for i, w := range words {
		e[i] = w
	}
	return kind{strings.Join(words, "|"), map[string]any{"enum": e}}
}

// addrKind is a listen address; empty says whether "" (none) is accepted.
func addrKind(empty bool) kind {
	if empty {
		return kind{"host:port", map[string]any{"type": "string", "pattern": `^$|` + hostPort}}
	}
	return kind{"host:port", map[string]any{"type": "string", "pattern": hostPort}}
}

// stringKind is text; a YAML number or boolean reads as its text, as the
// server reads it.
func stringKind(word string, minLength int) kind {
	s := map[string]any{"type": []any{"string", "number", "boolean"}}
	if minLength > 0 {
		s["minLength"] = minLength
	}
	return kind{word, s}
}

// levelKind is a log level, as slog reads it (either case).
var levelKind = kind{"debug|info|warn|error", enumKind("debug", "info", "warn", "error", "DEBUG", "INFO", "WARN", "ERROR").schema}

// powerOfTwoKind is a power of two up to hi, as a number or quoted.
func powerOfTwoKind(hi int) kind {
	var nums, words []any
	for n := 1; n <= hi; n *= 2 {
		nums, words = append(nums, n), append(words, strconv.Itoa(n))
	}
	return kind{"integer", map[string]any{"anyOf": []any{map[string]any{"type": "integer", "enum": nums}, map[string]any{"type": "string", "enum": words}}}}
}

// deviceKind is rbln.devices: NPU indices and RSD groups of them, as text
// ("0,1", "[0,1],[2,3]", "" for none) or a YAML list whose items are
// indices or lists of indices.
var deviceKind = kind{"devices", map[string]any{"anyOf": []any{
	map[string]any{"type": "string", "pattern": `^\s*(` + deviceEntry + `(\s*,\s*` + deviceEntry + `)*)?\s*$`},
	map[string]any{"type": "integer", "minimum": 0},
	map[string]any{"type": "array", "items": map[string]any{"anyOf": []any{
		map[string]any{"type": "integer", "minimum": 0},
		map[string]any{"type": "string", "pattern": `^\s*(` + deviceEntry + `|[0-9]+(\s*,\s*[0-9]+)+)\s*$`},
		map[string]any{"type": "array", "minItems": 1, "items": map[string]any{"anyOf": []any{
			map[string]any{"type": "integer", "minimum": 0},
			map[string]any{"type": "string", "pattern": `^\s*[0-9]+\s*$`},
		}}},
	}}},
}}}

// deviceEntry is one NPU index or one bracketed group of them.
const deviceEntry = `([0-9]+|\[\s*[0-9]+(\s*,\s*[0-9]+)*\s*\])`

// mapKind is a YAML map of strings, or KEY=VALUE pairs comma-separated.
var mapKind = kind{"map", map[string]any{"anyOf": []any{
	map[string]any{"type": "string", "pattern": `^\s*([^=,\s][^=,]*=[^,]*)?(,\s*([^=,\s][^=,]*=[^,]*)?)*$`},
	map[string]any{"type": "object", "additionalProperties": map[string]any{"type": []any{"string", "number", "boolean"}}},
}}}

// Schema is the JSON Schema of stepserve's YAML configuration file: an
// object per dotted prefix, every key typed from its row, and no key the
// server does not know (additionalProperties: false), so that a misspelt
// key is refused where the file is written, not when the server starts.
// The Helm chart's values.schema.json holds it as config's schema
// (make schema writes it; a test holds the chart to it).
func Schema() map[string]any {
	root := object("stepserve's configuration file (--config)")
	for _, k := range keys {
		parts := strings.Split(k.name, ".")
		node := root
		for _, p := range parts[:len(parts)-1] {
			props := node["properties"].(map[string]any)
			child, ok := props[p].(map[string]any)
			if !ok {
				child = object("")
				props[p] = child
			}
			node = child
		}
		s := map[string]any{"description": fmt.Sprintf("%s (default %s; flag --%s, env %s)", k.help, quoteDefault(k.def), k.name, envName(k.name))}
		for key, v := range k.kind.schema {
			s[key] = v
		}
		node["properties"].(map[string]any)[parts[len(parts)-1]] = s
	}
	return root
}

func object(description string) map[string]any {
	o := map[string]any{"type": "object", "additionalProperties": false, "properties": map[string]any{}}
	if description != "" {
		o["description"] = description
	}
	return o
}

func quoteDefault(def string) string {
	if def == "" {
		return `""`
	}
	return def
}

// envName is a key's environment variable.
func envName(key string) string {
	return "STEPSERVE_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}
