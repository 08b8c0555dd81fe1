// Package engine is the contract between the step and the engines that run
// it: an [Engine] loads a model once (weights resident from then on) and
// hands back a [Program] that compiles and runs one graph per shape bucket,
// reading and writing the bucket's staging buffers, and returns an
// [Explain] report for every step.
//
// Engines live in sub-packages (engine/cpufallback, engine/rbln). This
// package knows nothing of requests or HTTP.
package engine

import (
	"context"
	"errors"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/models"
)

// Engine loads models onto one kind of device.
type Engine interface {
	// Name is the engine's metric label: "cpu", "torch" or "rbln".
	Name() string
	// Load makes m's weights resident and allocates a staging pair for each
	// bucket. It compiles nothing: the caller compiles each bucket (eager
	// warm-up) or lets Step compile on first use (lazy).
	Load(ctx context.Context, m *models.Model, buckets []bucketing.Shape) (Program, error)
}

// Program is one model loaded on an engine. Its methods may be called from
// several goroutines, but at most one Step per Program runs at a time: the
// caller serializes steps, because they share staging buffers.
type Program interface {
	// Compile builds bucket's graph if it is not built yet.
	Compile(ctx context.Context, bucket int) error
	// Step runs bucket's graph: one copy of the input staging onto the
	// device, the graph, one copy of the packed outputs back to the output
	// staging. A bucket not compiled before is compiled first, and the
	// report counts that as a recompile.
	Step(ctx context.Context, bucket int) (Explain, error)
	// Staging returns bucket's input and output buffers, laid out as
	// [NewLayout] says. They live as long as the Program.
	Staging(bucket int) (in, out []byte)
	// Healthy reports whether steps can run now; false while the device
	// behind the program is down or being restarted.
	Healthy() bool
	// Close releases the device memory and staging buffers.
	Close() error
}

// ErrBucket is returned for a bucket index the program was not loaded with.
var ErrBucket = errors.New("engine: no such bucket")

// ErrUnavailable is wrapped by errors of a program whose device is down
// (its worker crashed, hung or is restarting): the step did not run, and the
// requests may be retried later or elsewhere.
var ErrUnavailable = errors.New("engine: device unavailable")
