package triton

import (
	"strings"
	"testing"

	"github.com/stepserve/stepserve/models"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An encoder's token_type_ids are optional, and its sequence variable.
func TestEncoderDims(t *testing.T) {
	enc, err := models.ParseConfig(strings.NewReader(`architecture: encoder
encoder: {vocab_size: 8, hidden: 4, layers: 1, heads: 1, intermediate: 8, max_position: 32}
inputs:
  - {name: input_ids, datatype: INT64, shape: [-1, -1]}
  - {name: attention_mask, datatype: INT64, shape: [-1, -1]}
  - {name: token_type_ids, datatype: INT64, shape: [-1, -1]}
outputs: [{name: e, datatype: FP32, shape: [-1, 4]}]
buckets: {batch: [1], seq: [32]}
`))
	require.NoError(t, err)
	for _, in := range enc.Inputs {
		assert.Equal(t, in.Name == "token_type_ids", enc.OptionalInput(in.Name), in.Name)
		assert.Equal(t, []int64{-1}, dims(in), "the sequence is variable")
	}
}

func TestTritonDatatypes(t *testing.T) {
	for dt, want := range map[models.Datatype]string{
		models.BOOL: "TYPE_BOOL", models.UINT8: "TYPE_UINT8", models.UINT64: "TYPE_UINT64", models.INT8: "TYPE_INT8",
		models.INT32: "TYPE_INT32", models.INT64: "TYPE_INT64", models.FP16: "TYPE_FP16", models.BF16: "TYPE_BF16",
		models.FP32: "TYPE_FP32", models.FP64: "TYPE_FP64", models.BYTES: "TYPE_STRING",
	} {
		assert.Equal(t, want, tritonDatatype(dt))
	}
}
