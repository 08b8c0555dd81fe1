// Where the workers compute: which devices they are given, and what each
// must find there before it serves.

package rbln

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"time"

	"github.com/stepserve/stepserve/internal/clip"
	"github.com/stepserve/stepserve/internal/npugroup"
	"log/slog"
	"os"
	"slices"
	"strings"
)

// workerDevices is the worker list for opts. For the rbln engine, devices
// configured explicitly win; left empty, the workers take the devices the
// server's own RBLN_VISIBLE_DEVICES lists (the pod's), one each, and "0"
// where it is unset. The torch engine runs one worker, "cpu", or with
// Workers n > 1, "cpu0" .. "cpu<n-1>".
func workerDevices(opts *Options) ([]string, error) {
	switch opts.Device {
	case "":
		opts.Device = DeviceRBLN
	case DeviceRBLN, DeviceCPU:
	default:
		return nil, fmt.Errorf("rbln: device %q; want %s (an RBLN NPU) or %s (the host CPU)", opts.Device, DeviceRBLN, DeviceCPU)
	}
	if opts.Device == DeviceCPU {
		if len(opts.Devices) > 0 {
			return nil, fmt.Errorf("rbln: the torch engine computes on the host CPU and takes no RBLN devices (got %q)", opts.Devices)
		}
		switch n := opts.Workers; {
		case n < 0 || n > maxTorchWorkers:
			return nil, fmt.Errorf("rbln: the torch engine's workers: %d; want 1..%d", n, maxTorchWorkers)
		case n <= 1:
			return []string{"cpu"}, nil
		default:
			devices := make([]string, n)
			for i := range devices {
				devices[i] = fmt.Sprintf("cpu%d", i)
			}
			return devices, nil
		}
	}
	if opts.Workers != 0 {
		return nil, fmt.Errorf("rbln: the rbln engine runs a worker per device (rbln.devices); Workers is the torch engine's")
	}
	// The pod's NPUs: RBLN_VISIBLE_DEVICES, or the older RBLN_DEVICES some
	// device plugins still set.
	podVar, pod := visibleDevices, splitDevices(os.Getenv(visibleDevices))
	if len(pod) == 0 {
		podVar, pod = legacyVisibleDevices, splitDevices(os.Getenv(legacyVisibleDevices))
	}
	per := max(opts.NPUsPerDevice, 1)
	switch {
	case len(opts.Devices) > 0:
		if per > 1 {
			return nil, fmt.Errorf("rbln: rbln.npus_per_device groups the pod's NPUs when rbln.devices is empty; with rbln.devices set, write its groups there ([0,1],[2,3])")
		}
		if err := npugroup.Distinct(opts.Devices); err != nil {
			return nil, fmt.Errorf("rbln: rbln.devices: %w", err)
		}
		if len(pod) > 0 && !slices.Equal(pod, strings.Split(strings.Join(opts.Devices, ","), ",")) {
			opts.Logger.Warn("rbln.devices overrides the server's "+podVar+": each worker is given its configured device",
				"devices", opts.Devices, podVar, strings.Join(pod, ","))
		}
		return opts.Devices, nil
	case len(pod) > 0:
		devices := groupBy(pod, per)
		if len(devices) == 0 {
			return nil, fmt.Errorf("rbln: rbln.npus_per_device is %d, but the server's %s lists %d NPUs (%s)", per, podVar, len(pod), strings.Join(pod, ","))
		}
		if left := len(pod) - per*len(devices); left > 0 {
			opts.Logger.Warn("rbln.npus_per_device leaves NPUs unused, as the runtime does", "unused", strings.Join(pod[len(pod)-left:], ","))
		}
		opts.Logger.Info("rbln workers take their devices from the server's "+podVar, "devices", devices, "npus_per_device", per)
		return devices, nil
	default:
		npus := make([]string, per)
		for i := range npus {
			npus[i] = strconv.Itoa(i)
		}
		return []string{strings.Join(npus, ",")}, nil
	}
}

// maxTorchWorkers bounds the torch engine's workers: each is a Python
// process with torch loaded (hundreds of MiB).
const maxTorchWorkers = 64

// splitDevices reads a comma-separated device list; empty entries do not
// count.
func splitDevices(s string) []string {
	var out []string
	for _, d := range strings.Split(s, ",") {
		if d = strings.TrimSpace(d); d != "" {
			out = append(out, d)
		}
	}
	return out
}

// LogLevel is the TORCH_RBLN_LOG_LEVEL that matches the server's log
// level, in torch-rbln's names: DEBUG, INFO, WARNING or ERROR.
func LogLevel(l slog.Level) string {
	switch {
	case l <= slog.LevelDebug:
		return "DEBUG"
	case l <= slog.LevelInfo:
		return "INFO"
	case l <= slog.LevelWarn:
		return "WARNING"
	default:
		return "ERROR"
	}
}

// checkHello logs a worker's view of its device and holds it to the device
// the worker was started for. A worker that computes elsewhere than its
// engine requires, or an rbln worker that sees other than one logical
// device (it drives rbln:0 alone), fails its start. An rbln worker that
// sees no device at all starts, and refuses every load with the reason it
// gives, so that the model's error says it.
func (w *worker) checkHello(hi *hello) error {
	w.logger.Info(w.what(" handshake"), "pid", hi.PID, "torch", hi.Torch, "worker_device", hi.Device,
		"device_kind", hi.DeviceKind, "device_count", count(hi.DeviceCount), "physical_device_count", count(hi.PhysicalDeviceCount),
		"device_summary", hi.DeviceSummary, "notes", hi.Notes)
	want := w.e.opts.Device
	if hi.DeviceKind != want {
		return fmt.Errorf("the worker computes on %q, but engine %s requires %q", hi.DeviceKind, w.e.Name(), want)
	}
	if want != DeviceRBLN {
		return nil
	}
	// A worker that sees devices must see exactly one; one that sees none
	// must say why, and refuses its loads with that.
	n := hi.DeviceCount
	if g := groupSize(w.device); g > 1 {
		// An RSD group: one logical device of g NPUs, as the grouping
		// variables the worker was started with make it. (A worker that
		// sees no NPU at all starts and says why, as below.)
		if p := hi.PhysicalDeviceCount; (p != nil && *p > 0 && *p != g) || (hi.Unusable == "" && (p == nil || *p != g)) {
			return fmt.Errorf("the worker for the RSD group %s=%s sees %s physical NPUs (torch.rbln.physical_device_count()), want %d: "+
				"the group's NPUs are not all visible to it, or the runtime did not group them (%s)",
				visibleDevices, w.device, count(p), g, npusPerDeviceEnv)
		}
	}
	if (n != nil && *n > 0 && *n != 1) || (hi.Unusable == "" && (n == nil || *n != 1)) {
		return fmt.Errorf("the worker for %s=%s sees %s logical RBLN devices (torch.rbln.device_count()), want 1: "+
			"each worker drives one logical device; list one device per worker in rbln.devices (or in the pod's %s), "+
			"or group NPUs into one logical device with RBLN_NPUS_PER_DEVICE or RBLN_DEVICE_MAP in rbln.env",
			visibleDevices, w.device, count(n), visibleDevices)
	}
	if hi.Unusable != "" {
		w.logger.Error("rbln worker cannot compute on an RBLN device: every load on it will be refused", "reason", hi.Unusable)
	}
	return nil
}

// count is a device count for logs and errors: a number, or "unknown".
func count(n *int) string {
	if n == nil {
		return "unknown"
	}
	return fmt.Sprint(*n)
}

// CheckPython reports whether python can import torch, which every worker
// needs; the error says what to install.
func CheckPython(python string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, "-c", "import torch").CombinedOutput()
	if err != nil {
		return fmt.Errorf("rbln: %s cannot import torch (install Debian's python3-torch, or set rbln.python): %v: %s",
			python, err, clip.Clip(strings.TrimSpace(string(out)), 200))
	}
	return nil
}
