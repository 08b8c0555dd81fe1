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
	// warm-up) or lets Step compile on first use (lazy). It places the
	// model as m.Config.Instances says ([Placement]): more than one
	// replica makes a [Replicated] Program.
	Load(ctx context.Context, m *models.Model, buckets []bucketing.Shape) (Program, error)
}

// DtypeEngine is an engine that says which dtype it computes a model's
// floats in ("float32", "bfloat16", "float16"): what the model
// configuration reports beside the configured device_dtype, which an
// engine may not follow (the host CPU computes float16 models in
// float32).
type DtypeEngine interface {
	ComputeDtype(cfg *models.Config) string
}

// Program is one model loaded on an engine. Its methods may be called from
// several goroutines, but at most one Step per Program runs at a time: the
// caller serializes steps, because they share staging buffers. A model
// loaded several times (model.yaml's instances) is a [Replicated] Program,
// each of whose [Replica]s steps on its own.
type Program interface {
	Stepper
	// Close releases the device memory and staging buffers.
	Close() error
}

// ErrBucket is returned for a bucket index the program was not loaded with.
var ErrBucket = errors.New("engine: no such bucket")

// ErrUnavailable is wrapped by errors of a program whose device is down
// (its worker crashed, hung or is restarting): the step did not run, and the
// requests may be retried later or elsewhere.
var ErrUnavailable = errors.New("engine: device unavailable")

// ErrStepLost is wrapped, with [ErrUnavailable], by a step that was
// running when its device or worker went down. The step may have been
// the cause (an input that crashes or hangs a user's module), so its
// requests are answered with the error and never run again elsewhere:
// retrying them would take the next device down too.
var ErrStepLost = errors.New("engine: the device went down while running the step")

// A ModelError is a load that failed for the model's own files (a torch
// module that does not import, a factory that raises, outputs that do not
// match model.yaml): its message names the file and, where it can, the
// line, and callers add the model's name and no more of their own path to
// it.
type ModelError struct{ Msg string }

func (e *ModelError) Error() string { return e.Msg }

// ContextAdvisor is a [Decoder] whose decode steps run in context
// partitions (buckets.context): it records each decode step's rows and
// longest context, and advises the partitions that would have read the
// fewest key positions ([bucketing.AdviseContexts]); maxBuckets 0 is as
// many decode programs as it has now.
type ContextAdvisor interface {
	AdviseContexts(maxBuckets int) (bucketing.Advice, error)
}

// ProgramReporter is a [Program] that reports its compiled programs, one
// per bucket (per replica for a replicated one), in bucket order.
type ProgramReporter interface {
	Programs(ctx context.Context) []ProgramReport
}
