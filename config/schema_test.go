package config

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/viper"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// probes are values as a YAML file (and so Helm's values) would give them:
// text, integers and booleans.
var probes = []any{
	"", "0", "1", "-1", "100", "1024", "4096", "1048576", "70000", "abc", "maybe",
	"true", "false", "30s", "1m30s", "0s", "0m0s", "-5s", "1.5h", "500us", "10", "5x",
	"64MiB", "1GiB", "1 MiB", "100B", "2KB", "auto", ":8000", "127.0.0.1:8000",
	"[::1]:8001", ":99999", ":-1", "localhost:http", "8000", "host:", "cpu", "torch", "rbln",
	"none", "cpufallback", "text", "json", "debug", "INFO", "verbose", "0,1", "A=B,C=D",
	0, 1, -1, 100, 1024, 4096, 2000000, 1 << 20, 70000, true, false,
	[]any{"0", 1}, map[string]any{"A": "b"},
}

// TestSchemaAgreesWithTheReaders holds each key's schema (the chart's
// values.schema.json) to the server: a value the server takes, the schema
// takes; and a typed value (a number, a boolean, a listen address, a
// duration, a word) the server refuses, the schema refuses. Only what a
// schema cannot know is left to the server: a size written as text under
// the key's minimum, a path that must exist, a token's strength.
func TestSchemaAgreesWithTheReaders(t *testing.T) {
	for _, k := range keys {
		if k.read == nil || k.name == "model_repository" || slices.Contains([]string{"auth.inference.token_file", "auth.repository.token_file"}, k.name) {
			continue
		}
		for _, p := range probes {
			v := viper.New()
			v.Set(k.name, p)
			c := &Config{Batching: defaultPolicy}
			err := k.read(c, v, k.name)
			if err == nil {
				err = c.Batching.Validate()
			}
			serverTakes := err == nil
			schemaTakes := validate(k.kind.schema, p) == nil
			if serverTakes {
				assert.True(t, schemaTakes, "%s: %#v: the server takes it, the schema refuses it", k.name, p)
				continue
			}
			if _, text := p.(string); text && slices.Contains([]string{"size", "size|auto", "integer"}, k.kind.word) {
				continue // a number as text: out of range, which a pattern does not count
			}
			if _, isMap := p.(map[string]any); isMap && k.kind.word != "map" {
				continue // viper reads a map into a key's children: not this key's value
			}
			assert.False(t, schemaTakes, "%s: %#v: the server refuses it (%v), the schema takes it", k.name, p, err)
		}
	}
}

// validate checks x against the JSON Schema subset kinds use.
func validate(s map[string]any, x any) error {
	if t, ok := s["type"]; ok && !hasType(t, x) {
		return fmt.Errorf("type: want %v", t)
	}
	if e, ok := s["enum"].([]any); ok && !slices.ContainsFunc(e, func(w any) bool { return fmt.Sprint(w) == fmt.Sprint(x) && hasType(jsonType(w), x) }) {
		return fmt.Errorf("enum %v", e)
	}
	if str, ok := x.(string); ok {
		if p, ok := s["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(str) {
			return fmt.Errorf("pattern %s", p)
		}
		if n, ok := s["minLength"].(int); ok && len(str) < n {
			return fmt.Errorf("minLength %d", n)
		}
	}
	if n, ok := number(x); ok {
		if lo, ok := number(s["minimum"]); ok && n < lo {
			return fmt.Errorf("minimum %v", lo)
		}
		if hi, ok := number(s["maximum"]); ok && n > hi {
			return fmt.Errorf("maximum %v", hi)
		}
	}
	if not, ok := s["not"].(map[string]any); ok && validate(not, x) == nil {
		return fmt.Errorf("not")
	}
	if alts, ok := s["anyOf"].([]any); ok && !slices.ContainsFunc(alts, func(sub any) bool { return validate(sub.(map[string]any), x) == nil }) {
		return fmt.Errorf("anyOf")
	}
	if items, ok := s["items"].(map[string]any); ok {
		for _, e := range x.([]any) {
			if err := validate(items, e); err != nil {
				return err
			}
		}
	}
	if ap, ok := s["additionalProperties"].(map[string]any); ok {
		for _, e := range x.(map[string]any) {
			if err := validate(ap, e); err != nil {
				return err
			}
		}
	}
	return nil
}

func jsonType(x any) string {
	switch x.(type) {
	case string:
		return "string"
	case int, int64:
		return "integer"
	case float64:
		return "number"
	case bool:
		return "boolean"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "null"
}

func hasType(t any, x any) bool {
	switch t := t.(type) {
	case string:
		return jsonType(x) == t || t == "number" && jsonType(x) == "integer"
	case []any:
		return slices.ContainsFunc(t, func(e any) bool { return hasType(e, x) })
	}
	return false
}

func number(x any) (float64, bool) {
	switch n := x.(type) {
	case int:
		return float64(n), true
	case int64:
		return float64(n), true
	case float64:
		return n, true
	}
	return 0, false
}

// TestHelpTypesEveryKey checks that --help names each key with its type,
// its default and its environment variable.
func TestHelpTypesEveryKey(t *testing.T) {
	var b strings.Builder
	writeUsage(&b)
	help := b.String()
	for _, k := range keys {
		assert.Contains(t, help, "  --"+k.name+" "+k.kind.word+"\n")
		assert.Contains(t, help, "default "+quoteDefault(k.def)+", env "+envName(k.name)+"\n", k.name)
	}
	assert.Contains(t, help, "--server.shutdown_grace duration\n")
	assert.Contains(t, help, "--engine.default cpu|torch|rbln\n")
	assert.Contains(t, help, "--server.enable_model_control boolean\n")
	for _, line := range strings.Split(help, "\n") {
		assert.LessOrEqual(t, len([]rune(line)), 80, "help line wider than a terminal: %q", line)
	}
}

// TestConfigFileFromTheEnvironment: STEPSERVE_CONFIG names the file when
// --config does not, and --config wins over it.
func TestConfigFileFromTheEnvironment(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	require.NoError(t, os.WriteFile(a, []byte("server:\n  addr: 127.0.0.1:7001\n"), 0o644))
	require.NoError(t, os.WriteFile(b, []byte("server:\n  addr: 127.0.0.1:7002\n"), 0o644))
	t.Setenv("STEPSERVE_CONFIG", a)
	c, err := Load([]string{"--model_repository", dir})
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:7001", c.Server.Addr)
	assert.Equal(t, a, c.File)
	c, err = Load([]string{"--model_repository", dir, "--config", b})
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:7002", c.Server.Addr)
}

// TestListOrMapWhereOneValueIsWanted: a YAML list or map given to a key
// that takes one value is refused, not read as "".
func TestListOrMapWhereOneValueIsWanted(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "c.yaml")
	require.NoError(t, os.WriteFile(f, []byte("server:\n  metrics_addr: [\":9090\"]\n"), 0o644))
	_, err := Load([]string{"--model_repository", dir, "--config", f})
	assert.ErrorIs(t, err, ErrInvalid)
	assert.ErrorContains(t, err, "server.metrics_addr")
}
