package engine

import (
	"context"

	"github.com/stepserve/stepserve/internal/trace"
)

// Profiler is a [Stepper] that can show what happens inside a step, for
// trace level PROFILE: the CPU engine records its kernels' spans, a worker
// engine wraps the step in torch.profiler and hands back its events.
type Profiler interface {
	// StepProfile runs bucket's step as Step does, recording into p what
	// the engine sees of it.
	StepProfile(ctx context.Context, bucket int, p *trace.Profile) (Explain, error)
}
