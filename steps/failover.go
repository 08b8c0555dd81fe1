package steps

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"

	"github.com/stepserve/stepserve/engine"
)

// Failover runs a model's steps on its primary program while that program
// is healthy, and on a fallback (the CPU engine) while it is not or when a
// step fails because the primary's device went away. Requests that were in
// such a step are run again on the fallback, so they are answered instead
// of failing. Each switch to the fallback is counted.
type Failover struct {
	Primary, Fallback *Runner
	PrimaryHealthy    func() bool
	Model, From, To   string
	Metrics           *Metrics
	Logger            *slog.Logger
	onFallback        atomic.Bool
}

// MaxBatch implements the batcher's Runner.
func (f *Failover) MaxBatch() int { return min(f.Primary.MaxBatch(), f.Fallback.MaxBatch()) }

// Run implements the batcher's Runner.
func (f *Failover) Run(ctx context.Context, reqs []*Request) error {
	if f.PrimaryHealthy() {
		err := f.Primary.Run(ctx, reqs)
		if !errors.Is(err, engine.ErrUnavailable) {
			if err == nil && f.onFallback.CompareAndSwap(true, false) {
				f.Logger.Info("model back on its primary engine", "model", f.Model, "engine", f.From)
			}
			return err
		}
	}
	if f.onFallback.CompareAndSwap(false, true) {
		f.Metrics.failedOver(f.Model, f.From, f.To)
		f.Logger.Warn("primary engine unavailable: serving on the fallback", "model", f.Model, "from", f.From, "to", f.To)
	}
	return f.Fallback.Run(ctx, reqs)
}
