package steps

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/stepserve/stepserve/engine"
)

// Signal is one reason a step is not clean; its String is the metric label.
type Signal int

// The explain signals.
const (
	CPUFallback Signal = iota
	Recompile
	HostBounce
	// V2VSlow: a device-to-device copy fell to a host path.
	V2VSlow
	ExtraH2D
	ExtraD2H
	// MissingH2D and MissingD2H: the step made no copy in or out, where a
	// clean step makes exactly one; its inputs or its result went by a
	// path the step structure does not use.
	MissingH2D
	MissingD2H
	// HostOp: the step's compiled program runs operators on the host
	// inside it (the compiler split them out), unseen by explain().
	HostOp
	numSignals
)

var signalNames = [numSignals]string{"cpu_fallback", "recompile", "host_bounce", "v2v_slow",
	"extra_h2d", "extra_d2h", "missing_h2d", "missing_d2h", "host_op"}

func (s Signal) String() string { return signalNames[s] }

// Signals lists every signal, in label order.
func Signals() []Signal {
	out := make([]Signal, numSignals)
	for i := range out {
		out[i] = Signal(i)
	}
	return out
}

// Verdict is the checked outcome of one step.
type Verdict struct {
	// Clean: no signal fired and the transfers were exactly as expected.
	Clean bool
	// Unmeasured: the engine could not observe the step, or could not
	// count its transfers; it is neither clean nor overhead.
	Unmeasured bool
	// Fired[s] is the count of signal s in the step (0 when it did not
	// fire or was not measured).
	Fired [numSignals]int64
}

// The transfers a step makes: the staging buffers are one input buffer
// and one output buffer, so a clean step copies exactly once each way (the
// reference's "[clean] with one host->device push and one physical d2h").
const (
	wantH2D = 1
	wantD2H = 1
)

// Check reads an Explain report as the design's step rules do: any CPU
// fallback, recompile, host bounce or slow device copy fires its signal,
// and a step that did not copy exactly once each way fires extra_* or
// missing_*. A step with any signal is not clean, even when the engine said
// it was. Counters the engine could not measure are unknown and fire
// nothing; but a step whose transfers are unknown cannot be shown to be
// clean, so unless a signal fired it is unmeasured. Check updates x.Clean
// and x.Reasons to match, so that a report that is not clean always says
// why.
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
	over := func(s Signal, c, limit engine.Count) {
		if c.Known() && c > limit {
			v.Fired[s] = int64(c - limit)
		}
	}
	over(CPUFallback, x.CPUFallbacks, 0)
	over(Recompile, x.Recompiles, 0)
	over(HostBounce, x.HostBounces, 0)
	over(V2VSlow, x.V2VSlow, 0)
	over(HostOp, x.HostOps, 0)
	over(ExtraH2D, x.H2D, wantH2D)
	over(ExtraD2H, x.D2H, wantD2H)
	if x.H2D.Known() && x.H2D < wantH2D {
		v.Fired[MissingH2D] = int64(wantH2D - x.H2D)
	}
	if x.D2H.Known() && x.D2H < wantD2H {
		v.Fired[MissingD2H] = int64(wantD2H - x.D2H)
	}

	// Name the signals the engine gave no reason for.
	name := x.Clean || len(x.Reasons) == 0
	fired := false
	for s, n := range v.Fired {
		if n == 0 {
			continue
		}
		fired = true
		x.Clean = false
		switch Signal(s) {
		case ExtraH2D, MissingH2D:
			x.Reasons = append(x.Reasons, fmt.Sprintf("%s: %d host-to-device copies, want %d", Signal(s), x.H2D, wantH2D))
		case ExtraD2H, MissingD2H:
			x.Reasons = append(x.Reasons, fmt.Sprintf("%s: %d device-to-host copies, want %d", Signal(s), x.D2H, wantD2H))
		case HostOp:
			// The worker's own verdict cannot see these: always named.
			x.Reasons = append(x.Reasons, hostOpReason(x))
		default:
			if name {
				x.Reasons = append(x.Reasons, fmt.Sprintf("%s: %d", Signal(s), n))
			}
		}
	}
	if !fired && x.Clean && (!x.H2D.Known() || !x.D2H.Known()) {
		// Nothing known fired, but one copy each way was not seen either.
		x.Clean = false
		v.Unmeasured = true
		x.Reasons = append(x.Reasons, fmt.Sprintf("unverified transfers: the engine could not count the step's copies (h2d %s, d2h %s), and a clean step makes exactly %d each way",
			countText(x.H2D), countText(x.D2H), wantH2D))
		return v
	}
	if !x.Clean && len(x.Reasons) == 0 {
		x.Reasons = append(x.Reasons, "the engine's verdict is not clean")
	}
	v.Clean = x.Clean
	return v
}

// hostOpReason names a step's host operators with the compiler's reasons.
func hostOpReason(x *engine.Explain) string {
	ops := slices.Sorted(maps.Keys(x.HostOpReasons))
	named := make([]string, len(ops))
	for i, op := range ops {
		named[i] = op
		if why := x.HostOpReasons[op]; why != "" {
			named[i] += " (" + why + ")"
		}
	}
	s := fmt.Sprintf("host_op: the compiled program runs %d operator(s) on the host", int64(x.HostOps))
	if len(named) > 0 {
		s += ": " + strings.Join(named, ", ")
	}
	return s
}

func countText(c engine.Count) string {
	if !c.Known() {
		return "unknown"
	}
	return fmt.Sprint(int64(c))
}
