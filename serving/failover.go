package serving

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/steps"
)

// failover runs a model's steps on its primary runner (its replicas) while
// a replica's device is healthy, and on a fallback runner while none is or
// when a step fails because the primary's devices went away. Requests that were in
// such a step run again on the fallback, so they are answered instead of
// failing. Each switch to the fallback is counted.
type failover struct {
	primary         batching.Runner // the model's replicas
	fallback        *steps.Runner
	primaryHealthy  func() bool // a replica of the primary is healthy
	model, from, to string
	switched        func() // counts a switch to the fallback
	logger          *slog.Logger
	onFallback      atomic.Bool
}

// MaxBatch implements [batching.Runner].
func (f *failover) MaxBatch() int { return min(f.primary.MaxBatch(), f.fallback.MaxBatch()) }

// Parallelism implements [batching.Parallel]: as many batches in flight as
// the primary takes (on the fallback they wait for its one runner).
func (f *failover) Parallelism() int {
	if p, ok := f.primary.(batching.Parallel); ok {
		return p.Parallelism()
	}
	return 1
}

// Run implements [batching.Runner].
func (f *failover) Run(ctx context.Context, reqs []*steps.Request) error {
	if f.primaryHealthy() {
		err := f.primary.Run(ctx, reqs)
		// A batch whose step took the primary down is answered, not run
		// again on the fallback: it may have been the cause.
		if !errors.Is(err, engine.ErrUnavailable) || errors.Is(err, engine.ErrStepLost) {
			if err == nil && f.onFallback.CompareAndSwap(true, false) {
				f.logger.Info("model back on its primary engine", "model", f.model, "engine", f.from)
			}
			return err
		}
	}
	if f.onFallback.CompareAndSwap(false, true) {
		f.switched()
		f.logger.Warn("primary engine unavailable: serving on the fallback", "model", f.model, "from", f.from, "to", f.to)
	}
	return f.fallback.Run(ctx, reqs)
}
