package steps

import (
	"fmt"

	"github.com/stepserve/stepserve/engine"
)

// Signal is one reason a step is not clean; its String is the metric label.
type Signal int

// The explain signals.
const (
	CPUFallback Signal = iota
	Recompile
	HostBounce
	ExtraH2D
	ExtraD2H
	numSignals
)

var signalNames = [numSignals]string{"cpu_fallback", "recompile", "host_bounce", "extra_h2d", "extra_d2h"}

func (s Signal) String() string { return signalNames[s] }

// Signals lists every signal, in label order.
func Signals() []Signal { return []Signal{CPUFallback, Recompile, HostBounce, ExtraH2D, ExtraD2H} }

// Verdict is the checked outcome of one step.
type Verdict struct {
	// Clean: no signal fired and the transfers were as expected.
	Clean bool
	// Unmeasured: the engine could not observe the step; it is neither
	// clean nor overhead.
	Unmeasured bool
	// Fired[s] is the count of signal s in the step (0 when it did not
	// fire or was not measured).
	Fired [numSignals]int64
}

// The transfers a step may make: the staging buffers are one input buffer
// and one output buffer, so a clean step copies exactly once each way.
const (
	wantH2D = 1
	wantD2H = 1
)

// Check reads an Explain report as the design's step rules do: any CPU
// fallback, recompile or host bounce fires its signal, and a step that moved
// more than one buffer in either direction fires extra_h2d or extra_d2h. A
// step with any signal is not clean, even when the engine said it was.
// Check updates x.Clean and x.Reasons to match, so that a report that is not
// clean always says why. Counters the engine could not measure are unknown
// and fire nothing.
func Check(x *engine.Explain) Verdict {
	var v Verdict
	if !x.Measured {
		x.Clean = false
		v.Unmeasured = true
		if len(x.Reasons) == 0 {
			x.Reasons = append(x.Reasons, "unmeasured: the engine could not observe the step")
		}
		return v
	}
	fire := func(s Signal, c engine.Count, over engine.Count) {
		if c.Known() && c > over {
			v.Fired[s] = int64(c - over)
		}
	}
	fire(CPUFallback, x.CPUFallbacks, 0)
	fire(Recompile, x.Recompiles, 0)
	fire(HostBounce, x.HostBounces, 0)
	fire(ExtraH2D, x.H2D, wantH2D)
	fire(ExtraD2H, x.D2H, wantD2H)

	// Name the signals the engine gave no reason for.
	name := x.Clean || len(x.Reasons) == 0
	for s, n := range v.Fired {
		if n == 0 {
			continue
		}
		x.Clean = false
		switch Signal(s) {
		case ExtraH2D:
			x.Reasons = append(x.Reasons, fmt.Sprintf("extra_h2d: %d host-to-device copies, want %d", x.H2D, wantH2D))
		case ExtraD2H:
			x.Reasons = append(x.Reasons, fmt.Sprintf("extra_d2h: %d device-to-host copies, want %d", x.D2H, wantD2H))
		default:
			if name {
				x.Reasons = append(x.Reasons, fmt.Sprintf("%s: %d", Signal(s), n))
			}
		}
	}
	if !x.Clean && len(x.Reasons) == 0 {
		x.Reasons = append(x.Reasons, "the engine's verdict is not clean")
	}
	v.Clean = x.Clean
	return v
}
