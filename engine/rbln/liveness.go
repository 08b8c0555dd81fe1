// The liveness rule: when a worker that is still running counts as hung.

package rbln

import (
	"fmt"
	"time"
)

// health is what a connection has seen of its worker.
type health struct {
	heard  time.Time // the last message from the worker
	pinged time.Time // when the unanswered ping was sent; zero when none
	// building is the request the worker builds a graph for ("" when
	// none), since buildingSince.
	building      string
	buildingSince time.Time
}

// verdict is why a worker with this health must be killed, or nil.
//
// While the worker builds a graph, pings prove nothing: a compile may hold
// the Python interpreter, and with it the thread that answers them, for
// minutes. The process's exit is watched all the same, and the build has
// its own deadline, compile. Otherwise a ping unanswered, with nothing else
// heard from the worker, for stall means it is hung.
func (h health) verdict(now time.Time, stall, compile time.Duration) error {
	if h.building != "" {
		if ran := now.Sub(h.buildingSince); ran > compile {
			return fmt.Errorf("%s ran %v, past the compile deadline (rbln.compile_timeout %v)", h.building, ran.Round(time.Millisecond), compile)
		}
		return nil
	}
	if h.pinged.IsZero() {
		return nil
	}
	if silent := now.Sub(later(h.heard, h.pinged)); silent > stall {
		return fmt.Errorf("stopped answering pings within %v", stall)
	}
	return nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
