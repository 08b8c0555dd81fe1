// RSD groups: a logical device made of several NPUs.

package rbln

import "strings"

// legacyVisibleDevices is the older name of RBLN_VISIBLE_DEVICES that some
// device plugins still set (the runtime reads it as a deprecated alias).
const legacyVisibleDevices = "RBLN_DEVICES"

// The runtime's grouping variables (Environment Variables › Device
// mapping): set before the worker's first device use, they make its
// visible NPUs one logical device.
const (
	npusPerDeviceEnv = "RBLN_NPUS_PER_DEVICE"
	deviceMapEnv     = "RBLN_DEVICE_MAP"
	// groupSizeEnv tells the worker how many NPUs its logical device
	// has, which it compiles for (torch.compile's num_devices).
	groupSizeEnv = "STEPSERVE_WORKER_NPUS"
)

// groupSize is how many NPUs a device entry has.
func groupSize(device string) int { return strings.Count(device, ",") + 1 }

// groupBy splits the pod's NPUs into groups of n, in order; NPUs left
// over (fewer than n) are not used, as the runtime leaves them.
func groupBy(npus []string, n int) []string {
	if n <= 1 {
		return npus
	}
	var out []string
	for i := 0; i+n <= len(npus); i += n {
		out = append(out, strings.Join(npus[i:i+n], ","))
	}
	return out
}
