// The readers of the key table's rows, and the parsers of their values.

package config

import (
	"cmp"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/viper"

	"github.com/stepserve/stepserve/internal/npugroup"
)

// text is a key's value as a string, trimmed.
func text(v *viper.Viper, key string) string { return strings.TrimSpace(v.GetString(key)) }

// value reads a key with parse and keeps the result if ok accepts it; want
// says what is accepted.
func value[T any](field func(*Config) *T, parse func(string) (T, error), ok func(T) bool, want string) reader {
	return func(c *Config, v *viper.Viper, key string) error {
		if !scalar(v.Get(key)) {
			return invalid(key, fmt.Sprint(v.Get(key)), want)
		}
		s := text(v, key)
		x, err := parse(s)
		if err != nil || !ok(x) {
			return invalid(key, s, want)
		}
		*field(c) = x
		return nil
	}
}

// scalar reports whether x is one value (text, a number, a boolean), not a
// list or a map, which would otherwise read as "".
func scalar(x any) bool {
	switch x.(type) {
	case []any, []string, map[string]any:
		return false
	}
	return true
}

// oneOf reads a key that takes one of a few words.
func oneOf(field func(*Config) *string, allowed ...string) reader {
	return value(field, asString, func(s string) bool { return slices.Contains(allowed, s) }, strings.Join(allowed, " or "))
}

// policyKey reads a batching.* key; its range is checked with the whole
// policy, in parse.
func policyKey(c *Config, v *viper.Viper, key string) error {
	if err := c.Batching.Set(key, text(v, key)); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// tokensOf reads a scope's bearer tokens: its token key and its token_file,
// the key read.
func tokensOf(scope string, field func(*Config) (*[]string, *tokenSource)) reader {
	return func(c *Config, v *viper.Viper, key string) error {
		list, src := field(c)
		*src = tokenSource{scope: scope, token: text(v, scope+".token"), file: text(v, key)}
		t, err := src.read()
		*list = t
		return err
	}
}

// deviceList reads rbln.devices: NPUs and RSD groups (npugroup).
func deviceList(field func(*Config) *[]string, want string) reader {
	return func(c *Config, v *viper.Viper, key string) error {
		var l []string
		var err error
		switch x := v.Get(key).(type) {
		case string:
			if l, err = npugroup.Parse(x); err == nil && len(l) == 0 && strings.TrimSpace(x) != "" {
				err = fmt.Errorf("no device named")
			}
		case []any:
			for _, e := range x {
				var d string
				if d, err = npugroup.Entry(e); err != nil || d == "" {
					break
				}
				l = append(l, d)
			}
		case []string:
			for _, e := range x {
				var d string
				if d, err = npugroup.Entry(e); err != nil || d == "" {
					break
				}
				l = append(l, d)
			}
		case int:
			var d string
			if d, err = npugroup.Entry(x); err == nil {
				l = []string{d}
			}
		default:
			err = fmt.Errorf("not a list")
		}
		if err == nil {
			err = npugroup.Distinct(l)
		}
		if err != nil {
			return invalid(key, fmt.Sprint(v.Get(key)), want+" ("+err.Error()+")")
		}
		*field(c) = l
		return nil
	}
}

// mapOf reads a map key.
func mapOf(field func(*Config) *map[string]string, want string) reader {
	return func(c *Config, v *viper.Viper, key string) error {
		m, err := stringMap(v.Get(key))
		if err != nil {
			return invalid(key, fmt.Sprint(v.Get(key)), want)
		}
		*field(c) = m
		return nil
	}
}

func modelRepository(c *Config, v *viper.Viper, key string) error {
	dir := text(v, key)
	if dir == "" {
		return invalid(key, "", "a directory of models")
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return invalid(key, dir, "an existing directory of models (<name>/model.yaml, or a Hugging Face folder <name>/config.json)")
	}
	c.ModelRepository = dir
	return nil
}

func asString(s string) (string, error) { return s, nil }

func parseInt64(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }

// parseAutoBytes reads a size, or auto (0).
func parseAutoBytes(s string) (int64, error) {
	if s == "auto" {
		return 0, nil
	}
	return ParseBytes(s)
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

// isHostPort accepts a listen address: an optional host, and a port
// number (0 to 65535) or a service name.
func isHostPort(s string) bool {
	_, port, err := net.SplitHostPort(s)
	if err != nil || port == "" {
		return false
	}
	if n, err := strconv.Atoi(port); err == nil {
		return n >= 0 && n <= 65535
	}
	_, err = net.LookupPort("tcp", port)
	return err == nil
}

func anything[T any](T) bool { return true }

func nonEmpty(s string) bool { return s != "" }

func positive[T cmp.Ordered](x T) bool {
	var zero T
	return x > zero
}

func atLeast[T cmp.Ordered](lo T) func(T) bool { return func(x T) bool { return x >= lo } }

func between[T cmp.Ordered](lo, hi T) func(T) bool {
	return func(x T) bool { return x >= lo && x <= hi }
}

func invalid(key, value, want string) error {
	return fmt.Errorf("%w: %s: %q; want %s", ErrInvalid, key, value, want)
}

// stringMap reads a map key: a YAML map, or KEY=VALUE pairs separated by
// commas from the environment or a flag.
func stringMap(v any) (map[string]string, error) {
	out := map[string]string{}
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			out[strings.ToUpper(k)] = fmt.Sprint(x)
		}
	case string:
		for _, kv := range strings.Split(t, ",") {
			if kv = strings.TrimSpace(kv); kv == "" {
				continue
			}
			k, val, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("config: %q is not KEY=VALUE", kv)
			}
			out[k] = val
		}
	case nil:
	default:
		return nil, fmt.Errorf("config: not a map: %v", v)
	}
	return out, nil
}

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30},
	{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000},
	{"B", 1},
}

// ParseBytes reads a size: a plain number of bytes, or a number with one of
// the units B, KB, MB, GB (powers of 1000) or KiB, MiB, GiB (powers of 1024).
func ParseBytes(s string) (int64, error) {
	num, mult := s, int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("config: %q is not a size", s)
	}
	return n * mult, nil
}
