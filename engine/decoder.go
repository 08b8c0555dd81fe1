package engine

import (
	"context"

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
