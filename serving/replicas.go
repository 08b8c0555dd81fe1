package serving

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/steps"
)

// replicas runs a model's batches on its replicas (model.yaml's
// instances), one runner each: every batch goes to the least-loaded
// healthy replica, and the batcher keeps as many batches in flight as
// there are replicas ([batching.Parallel]). Load is counted per replica
// and per device, since replicas that share a device (lanes) share its
// time: a batch goes to the replica with the fewest steps in flight, then
// to the one whose device has the fewest, then to each in turn. A batch
// whose replica turns out to be down (its device went away:
// [engine.ErrUnavailable]) runs once more on another healthy replica, so
// that its requests are answered instead of failing.
type replicas struct {
	model  string
	logger *slog.Logger
	reps   []*replica

	mu     sync.Mutex
	device map[string]int // steps in flight per device
	next   int            // where the round of equally loaded replicas starts
}

// replica is one replica's runner and its steps in flight (under
// replicas.mu).
type replica struct {
	runner   *steps.Runner
	inFlight int
}

func newReplicas(model string, runners []*steps.Runner, logger *slog.Logger) *replicas {
	d := &replicas{model: model, logger: logger, device: map[string]int{}}
	for _, r := range runners {
		d.reps = append(d.reps, &replica{runner: r})
	}
	return d
}

// MaxBatch implements [batching.Runner]: the replicas share the model's
// grid.
func (d *replicas) MaxBatch() int { return d.reps[0].runner.MaxBatch() }

// Parallelism implements [batching.Parallel]: one batch per replica.
func (d *replicas) Parallelism() int { return len(d.reps) }

// Healthy counts the replicas that can step now.
func (d *replicas) Healthy() int {
	n := 0
	for _, r := range d.reps {
		if r.runner.Healthy() {
			n++
		}
	}
	return n
}

// anyHealthy reports whether a replica can step now.
func (d *replicas) anyHealthy() bool {
	for _, r := range d.reps {
		if r.runner.Healthy() {
			return true
		}
	}
	return false
}

// Run implements [batching.Runner].
func (d *replicas) Run(ctx context.Context, reqs []*steps.Request) error {
	first := d.pick(nil)
	err := d.run(ctx, first, reqs)
	if !errors.Is(err, engine.ErrUnavailable) || errors.Is(err, engine.ErrStepLost) {
		// A batch whose step took its device down is answered, not run
		// again on another replica: it may have been the cause.
		return err
	}
	again := d.pick(first)
	if again == nil {
		return err
	}
	d.logger.Warn("replica unavailable: running its batch on another", "model", d.model,
		"from", first.runner.Device(), "to", again.runner.Device(), "err", err)
	return d.run(ctx, again, reqs)
}

func (d *replicas) run(ctx context.Context, r *replica, reqs []*steps.Request) error {
	defer d.release(r)
	return r.runner.Run(ctx, reqs)
}

// pick chooses the replica for a batch and counts the batch in flight on
// it. Without a healthy replica, the first pick is the least loaded of
// all (its step says why it cannot run, or runs if its device has just
// come back); a second pick, for a batch that failed on other, is a
// healthy replica or none.
func (d *replicas) pick(other *replica) *replica {
	d.mu.Lock()
	defer d.mu.Unlock()
	var best *replica
	bestAt := 0
	better := func(r, than *replica) bool {
		if r.inFlight != than.inFlight {
			return r.inFlight < than.inFlight
		}
		return d.device[r.runner.Device()] < d.device[than.runner.Device()]
	}
	for _, healthyOnly := range []bool{true, false} {
		for i := range d.reps {
			at := (d.next + i) % len(d.reps)
			r := d.reps[at]
			if r == other || (healthyOnly && !r.runner.Healthy()) {
				continue
			}
			if best == nil || better(r, best) {
				best, bestAt = r, at
			}
		}
		if best != nil || other != nil {
			break
		}
	}
	if best == nil {
		return nil
	}
	d.next = bestAt + 1
	best.inFlight++
	d.device[best.runner.Device()]++
	return best
}

func (d *replicas) release(r *replica) {
	d.mu.Lock()
	r.inFlight--
	d.device[r.runner.Device()]--
	d.mu.Unlock()
}
