package engine

import (
	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/models"
)

// TensorLayout places one tensor in a staging buffer.
type TensorLayout struct {
	Name     string
	Datatype models.Datatype
	// Shape is the bucket's concrete shape: the batch dimension is the
	// bucket's batch size.
	Shape []int
	// Offset and Bytes locate the tensor in the buffer.
	Offset, Bytes int
	// RowBytes is the size of one batch row.
	RowBytes int
	// Pad is one element of the value a row shorter than the bucket's
	// sequence is padded with, in the tensor's datatype; nil pads with
	// zeros.
	Pad []byte
}

// Layout is how a bucket's staging buffers are packed: every step input, in
// order, back to back in one buffer (so that filling the device costs one
// copy), and every output likewise in the other.
type Layout struct {
	Bucket            bucketing.Shape
	Inputs, Outputs   []TensorLayout
	InBytes, OutBytes int
}

// NewLayout packs cfg's signature for bucket s. Both engines and the step
// use it, so they agree on where every tensor lives.
func NewLayout(cfg *models.Config, s bucketing.Shape) Layout {
	l := Layout{Bucket: s}
	l.Inputs, l.InBytes = pack(cfg.StepInputs(), s)
	l.Outputs, l.OutBytes = pack(cfg.Outputs, s)
	return l
}

func pack(specs []models.TensorSpec, s bucketing.Shape) ([]TensorLayout, int) {
	out := make([]TensorLayout, len(specs))
	off := 0
	for i, spec := range specs {
		shape := append([]int{s.Batch}, spec.Shape[1:]...)
		row := spec.RowBytes(s.Seq)
		out[i] = TensorLayout{
			Name:     spec.Name,
			Datatype: spec.Datatype,
			Shape:    shape,
			Offset:   off,
			Bytes:    row * s.Batch,
			RowBytes: row,
		}
		if spec.Pad != nil && *spec.Pad != 0 {
			out[i].Pad = spec.Datatype.Encode(*spec.Pad)
		}
		// Tensors are packed back to back, so that a buffer of inputs of one
		// dtype is one flat tensor: one copy fills the device buffer, and
		// several outputs concatenated in the graph come back in one copy.
		off += row * s.Batch
	}
	return out, off
}
