package models

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/stepserve/stepserve/internal/clip"
)

// Instances is model.yaml's instances key: on which of its engine's devices
// a model is loaded, how many replicas each device holds, and how many must
// be healthy for the model to be ready.
//
//	instances:
//	  devices: [0, 1]   # or: all; unset: the engine's next device (one)
//	  per_device: 1     # replicas on each device
//	  min_ready: 1      # healthy replicas the model needs to be ready
//
// Unset, a model is one replica on the engine's next device, ready while
// that replica is healthy.
type Instances struct {
	// Devices names the devices, as the engine names them (the rbln
	// engine: its rbln.devices entries; the torch engine: cpu, or cpu0,
	// cpu1, ... with several workers; the CPU engine: cpu). Empty when All
	// is set or when the engine chooses.
	Devices []string
	// All loads the model on every device of its engine.
	All bool
	// PerDevice is how many replicas each device holds; 0 means 1.
	PerDevice int
	// MinReady is how many healthy replicas the model needs to be ready;
	// 0 means 1.
	MinReady int

	// A malformed value, found while decoding and reported by validate
	// with its key, so that the error reads as every other model.yaml
	// error does.
	badKey, bad string
	// Whether per_device and min_ready were written (0 written is an
	// error, not the default).
	perDeviceSet, minReadySet bool
}

// PerDeviceCount is how many replicas each device holds (at least 1).
func (in Instances) PerDeviceCount() int { return max(in.PerDevice, 1) }

// MinReadyCount is how many healthy replicas make the model ready (at
// least 1).
func (in Instances) MinReadyCount() int { return max(in.MinReady, 1) }

// Replicas is how many replicas the model has on an engine with devices
// devices.
func (in Instances) Replicas(devices int) int {
	switch {
	case in.All:
		return devices * in.PerDeviceCount()
	case len(in.Devices) > 0:
		return len(in.Devices) * in.PerDeviceCount()
	}
	return in.PerDeviceCount()
}

// maxPerDevice bounds per_device: every replica is a set of staging buffers
// (and on the CPU engine every bucket's plan).
const maxPerDevice = 64

// deviceRE is a device name: what RBLN_VISIBLE_DEVICES lists, an
// engine's own names (cpu, cpu0), or an RSD group of NPUs ("0,1").
var deviceRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$|^[0-9]+(,[0-9]+){1,31}$`)

// UnmarshalYAML reads the instances mapping strictly: devices is a list of
// device names or the string all; per_device and min_ready are integers;
// any other key is an error.
func (in *Instances) UnmarshalYAML(n *yaml.Node) error {
	fail := func(key, format string, args ...any) error {
		if in.bad == "" {
			in.badKey, in.bad = key, fmt.Sprintf(format, args...)
		}
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return fail("", "line %d: want a mapping of devices, per_device and min_ready, found %s", n.Line, nodeKind(n))
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if seen[k.Value] {
			return fail("", "line %d: a key appears twice", k.Line)
		}
		seen[k.Value] = true
		switch k.Value {
		case "devices":
			switch {
			case v.Kind == yaml.ScalarNode && v.Tag == "!!str" && v.Value == "all":
				in.All = true
			case v.Kind == yaml.SequenceNode:
				if len(v.Content) == 0 {
					return fail("devices", "line %d: the list is empty; name at least one device, or write devices: all", v.Line)
				}
				for _, d := range v.Content {
					if d.Kind == yaml.SequenceNode {
						// An RSD group, [0, 1]: the engine device "0,1"
						// (rbln.devices).
						var npus []string
						for _, x := range d.Content {
							if x.Kind != yaml.ScalarNode || x.Tag == "!!null" {
								return fail("devices", "line %d: a device group lists NPU indices, found %s", x.Line, nodeKind(x))
							}
							npus = append(npus, strings.TrimSpace(x.Value))
						}
						in.Devices = append(in.Devices, strings.Join(npus, ","))
						continue
					}
					if d.Kind != yaml.ScalarNode || d.Tag == "!!null" {
						return fail("devices", "line %d: want a device name, found %s", d.Line, nodeKind(d))
					}
					name := d.Value
					if strings.Contains(name, ",") { // a group written "0, 1"
						name = strings.ReplaceAll(name, " ", "")
					}
					in.Devices = append(in.Devices, name)
				}
			default:
				return fail("devices", "line %d: want a list of device names (e.g. [0, 1]) or all, found %s", v.Line, nodeKind(v))
			}
		case "per_device", "min_ready":
			x, err := intNode(v)
			if err != nil {
				return fail(k.Value, "line %d: want an integer, found %s", v.Line, nodeKind(v))
			}
			if k.Value == "per_device" {
				in.PerDevice, in.perDeviceSet = x, true
			} else {
				in.MinReady, in.minReadySet = x, true
			}
		default:
			return fail("", "line %d: unknown key %q; want devices, per_device or min_ready", k.Line, clip.Clip(k.Value, maxNameInError))
		}
	}
	return nil
}

func intNode(n *yaml.Node) (int, error) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		return 0, strconv.ErrSyntax
	}
	x, err := strconv.ParseInt(n.Value, 0, 32)
	return int(x), err
}

// nodeKind says what a YAML node holds, quoting at most a short plain
// word, as model.yaml's other errors do.
func nodeKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	case yaml.ScalarNode:
		kind := yamlKind(n.Tag)
		if w := yamlWord.FindStringSubmatch(" `" + n.Value + "`"); w != nil && n.Tag != "!!null" {
			kind += fmt.Sprintf(" (%q)", w[1])
		}
		return kind
	}
	return "something else"
}

// validate checks the values and fills the defaults.
func (in *Instances) validate(bad func(string, string, ...any) error) error {
	if in.bad != "" {
		key := "instances"
		if in.badKey != "" {
			key += "." + in.badKey
		}
		return bad(key, "%s", in.bad)
	}
	for i, d := range in.Devices {
		switch {
		case d == "all":
			return bad("instances.devices", "all is not a device name; write devices: all (not a list) for every device")
		case !deviceRE.MatchString(d):
			return bad("instances.devices", "%q is not a device name; use letters, digits, '_', '.', ':' or '-', or an RSD group's NPUs ([0, 1] or \"0,1\")", clip.Clip(d, maxNameInError))
		case slices.Contains(in.Devices[:i], d):
			return bad("instances.devices", "%q appears twice; set per_device for more than one replica on a device", d)
		}
	}
	if in.perDeviceSet && (in.PerDevice < 1 || in.PerDevice > maxPerDevice) {
		return bad("instances.per_device", "%d must be in 1..%d", in.PerDevice, maxPerDevice)
	}
	in.PerDevice = in.PerDeviceCount()
	if in.minReadySet && in.MinReady < 1 {
		return bad("instances.min_ready", "%d must be at least 1", in.MinReady)
	}
	in.MinReady = in.MinReadyCount()
	// With devices: all the count is the engine's, known at load.
	if total := in.Replicas(0); !in.All && in.MinReady > total {
		where := "one device"
		if len(in.Devices) > 0 {
			where = fmt.Sprintf("%d devices", len(in.Devices))
		}
		return bad("instances.min_ready", "%d is more than the %d replicas (%s x per_device %d); want 1..%d",
			in.MinReady, total, where, in.PerDevice, total)
	}
	return nil
}
