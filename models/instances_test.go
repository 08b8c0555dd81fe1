package models

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestInstancesDefaults(t *testing.T) {
	c, err := ParseConfig(strings.NewReader(validMLP))
	require.NoError(t, err)
	in := c.Instances
	assert.Empty(t, in.Devices, "unset: the engine's next device")
	assert.False(t, in.All)
	assert.Equal(t, 1, in.PerDevice)
	assert.Equal(t, 1, in.MinReady)
	assert.Equal(t, 1, in.Replicas(4), "one replica, whatever the engine has")

	var zero Instances
	assert.Equal(t, 1, zero.PerDeviceCount(), "a Config built by hand counts as one replica")
	assert.Equal(t, 1, zero.MinReadyCount())
}

func TestInstancesParsed(t *testing.T) {
	for _, tc := range []struct {
		doc   string
		want  Instances
		total int // on an engine of 4 devices
	}{
		{"instances: {devices: [0, 1]}", Instances{Devices: []string{"0", "1"}, PerDevice: 1, MinReady: 1}, 2},
		{"instances: {devices: all, per_device: 2, min_ready: 3}", Instances{All: true, PerDevice: 2, MinReady: 3}, 8},
		{"instances:\n  devices: [cpu0, 'rbln:1']\n  per_device: 2\n  min_ready: 4", Instances{Devices: []string{"cpu0", "rbln:1"}, PerDevice: 2, MinReady: 4}, 4},
		{"instances: {per_device: 2}", Instances{PerDevice: 2, MinReady: 1}, 2},
		{"instances: {devices: [[0, 1], '2,3']}", Instances{Devices: []string{"0,1", "2,3"}, PerDevice: 1, MinReady: 1}, 2},
		{"instances:", Instances{PerDevice: 1, MinReady: 1}, 1},
	} {
		t.Run(tc.doc, func(t *testing.T) {
			c, err := ParseConfig(strings.NewReader(validMLP + tc.doc + "\n"))
			require.NoError(t, err)
			got := c.Instances
			got.perDeviceSet, got.minReadySet = false, false
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.total, got.Replicas(4))
		})
	}
}

func TestInstancesErrors(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"instances: [0, 1]", "instances: line 11: want a mapping of devices, per_device and min_ready, found a list"},
		{"instances: {device: [0]}", `instances: line 11: unknown key "device"; want devices, per_device or min_ready`},
		{"instances: {devices: every}", `instances.devices: line 11: want a list of device names (e.g. [0, 1]) or all, found a string ("every")`},
		{"instances: {devices: 0}", `instances.devices: line 11: want a list of device names (e.g. [0, 1]) or all, found an integer ("0")`},
		{"instances: {devices: []}", "instances.devices: line 11: the list is empty; name at least one device, or write devices: all"},
		{"instances: {devices: [[0, ~]]}", "instances.devices: line 11: a device group lists NPU indices, found nothing"},
		{"instances: {devices: [[0, a]]}", `instances.devices: "0,a" is not a device name`},
		{"instances: {devices: [0, ~]}", "instances.devices: line 11: want a device name, found nothing"},
		{"instances: {devices: [all]}", "instances.devices: all is not a device name; write devices: all (not a list)"},
		{"instances: {devices: ['a b']}", `instances.devices: "a b" is not a device name`},
		{"instances: {devices: [0, 1, 0]}", `instances.devices: "0" appears twice; set per_device for more than one replica on a device`},
		{"instances: {per_device: 0}", "instances.per_device: 0 must be in 1..64"},
		{"instances: {per_device: 65}", "instances.per_device: 65 must be in 1..64"},
		{"instances: {per_device: two}", `instances.per_device: line 11: want an integer, found a string ("two")`},
		{"instances: {per_device: 1.5}", `instances.per_device: line 11: want an integer, found a number ("1.5")`},
		{"instances: {min_ready: 0}", "instances.min_ready: 0 must be at least 1"},
		{"instances: {min_ready: 2}", "instances.min_ready: 2 is more than the 1 replicas (one device x per_device 1); want 1..1"},
		{"instances: {devices: [0, 1], per_device: 2, min_ready: 5}", "instances.min_ready: 5 is more than the 4 replicas (2 devices x per_device 2); want 1..4"},
		{"instances: {per_device: 1, per_device: 2}", "instances: line 11: a key appears twice"},
	} {
		t.Run(tc.doc, func(t *testing.T) {
			_, err := ParseConfig(strings.NewReader(validMLP + tc.doc + "\n"))
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrConfig))
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	// With devices: all the engine's count is not known yet: min_ready is
	// checked against it at load.
	_, err := ParseConfig(strings.NewReader(validMLP + "instances: {devices: all, min_ready: 9}\n"))
	assert.NoError(t, err)
}
