// Package npugroup reads RBLN device lists: single NPUs and RSD groups
// (several NPUs as one logical device), as flags, the environment and
// YAML give them.
package npugroup

import (
	"fmt"
	"strconv"
	"strings"
)

// Parse reads a device list as a flag or the environment gives it:
// "0,1" is two devices, one NPU each; "[0,1],[2,3]" is two logical devices
// of two NPUs each (an RSD group, in RBLN_DEVICE_MAP's notation); the two
// may mix ("[0,1],2"). A group is returned as its NPUs joined by commas,
// the RBLN_VISIBLE_DEVICES value its worker is started with.
func Parse(s string) ([]string, error) {
	var out []string
	for s = strings.TrimSpace(s); s != ""; {
		var entry string
		if strings.HasPrefix(s, "[") {
			end := strings.IndexByte(s, ']')
			if end < 0 {
				return nil, fmt.Errorf("device group %q has no closing ]", s)
			}
			g, err := group(strings.Split(s[1:end], ","))
			if err != nil {
				return nil, err
			}
			entry, s = g, strings.TrimSpace(s[end+1:])
		} else {
			i := strings.IndexByte(s, ',')
			if i < 0 {
				i = len(s)
			}
			entry = strings.TrimSpace(s[:i])
			if entry != "" {
				g, err := group([]string{entry})
				if err != nil {
					return nil, fmt.Errorf("device %q is not an NPU index (a group is written [0,1])", entry)
				}
				entry = g
			}
			s = s[i:]
		}
		if entry != "" {
			out = append(out, entry)
		}
		s = strings.TrimSpace(s)
		if strings.HasPrefix(s, ",") {
			s = strings.TrimSpace(s[1:])
		} else if s != "" {
			return nil, fmt.Errorf("devices: want a comma between entries before %q", s)
		}
	}
	return out, nil
}

// Entry is one device list entry from YAML: a number is one NPU; a list,
// "[0,1]" or "0,1" is a group of NPUs.
func Entry(v any) (string, error) {
	switch t := v.(type) {
	case []any:
		parts := make([]string, len(t))
		for i, x := range t {
			parts[i] = fmt.Sprint(x)
		}
		return group(parts)
	case string:
		if !strings.Contains(t, "[") && strings.Contains(t, ",") {
			// One entry of a YAML list: "0,1" is its NPUs.
			return group(strings.Split(t, ","))
		}
		if strings.Contains(t, "[") {
			l, err := Parse(t)
			if err != nil {
				return "", err
			}
			if len(l) != 1 {
				return "", fmt.Errorf("device entry %q names %d devices; a group is written [0,1]", t, len(l))
			}
			return l[0], nil
		}
		return group([]string{t})
	default:
		return group([]string{fmt.Sprint(v)})
	}
}

// group checks a group's NPUs (indices into the visible list) and joins
// them: at least one, each a non-negative integer, none twice.
func group(parts []string) (string, error) {
	seen := map[int]bool{}
	var npus []string
	for _, p := range parts {
		p = strings.TrimSpace(p)
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return "", fmt.Errorf("device group [%s]: %q is not an NPU index", strings.Join(parts, ","), p)
		}
		if seen[n] {
			return "", fmt.Errorf("device group [%s]: NPU %d twice", strings.Join(parts, ","), n)
		}
		seen[n] = true
		npus = append(npus, strconv.Itoa(n))
	}
	if len(npus) == 0 {
		return "", fmt.Errorf("device group []: no NPUs")
	}
	return strings.Join(npus, ","), nil
}

// Distinct checks that no NPU is in two entries: two workers would drive
// it.
func Distinct(entries []string) error {
	owner := map[string]string{}
	for _, e := range entries {
		for _, n := range strings.Split(e, ",") {
			if o, ok := owner[n]; ok {
				if o == e {
					return fmt.Errorf("device %s is listed twice", e)
				}
				return fmt.Errorf("NPU %s is in two devices (%s and %s); each NPU belongs to one worker", n, o, e)
			}
			owner[n] = e
		}
	}
	return nil
}
