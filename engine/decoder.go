package engine

import (
	"context"
	"time"

	"github.com/stepserve/stepserve/bucketing"

	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/models"
)

// DecoderEngine is an engine that runs decoder language models
// (architecture decoder): their weights and KV cache resident, a step
// computing prompt chunks and decodes together and sampling each
// sequence's next token on the device.
type DecoderEngine interface {
	LoadDecoder(ctx context.Context, m *models.Model) (Decoder, error)
}

// Decoder is a decoder model loaded on an engine: the model of a
// generation loop, one Step at a time.
type Decoder interface {
	generation.Model
	// Close releases the weights and the KV cache.
	Close() error
}

// WeightReleaser is a Decoder that keeps its own copy of the products'
// weights (packed for its kernels, or on its device): once it is loaded,
// ReleaseWeights drops the model's float32 tensors it no longer reads, so
// a served model holds its weights once. The model must not be loaded on
// an engine again afterwards.
type WeightReleaser interface {
	ReleaseWeights(m *models.Model)
}

// StepObserver is a Decoder whose device steps can be watched: each
// step's bucket (an index into Shapes), its real rows, how long it took
// and its explain report, as a Runner's steps are.
type StepObserver interface {
	Shapes() []bucketing.Shape
	ObserveSteps(func(bucket, rows int, padding float64, took time.Duration, x Explain))
	// Warmups is each bucket's second warm-up run's explain report, in
	// Shapes' order: the caller judges them as a Runner's warm-up is
	// judged (steps.Check, the engine's strict_warmup).
	Warmups() []Explain
}
