package wire

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/stepserve/stepserve/models"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A response with classified outputs stays within the JSON its footprint
// charged, whatever the labels hold.
func TestClassificationFitsItsFootprint(t *testing.T) {
	labels := []string{strings.Repeat(`"\`, models.MaxLabelBytes/2), "tab\there"}
	m := &models.Model{Name: "summax", Version: "1", Labels: [][]string{labels}, Config: &models.Config{
		Outputs: []models.TensorSpec{{Name: "y", Datatype: models.FP32, Shape: []int{-1, 2}}},
	}}
	data := fp32le(-1.1754944e-38, -3.4028235e+38, 1, 2)
	for _, bin := range []bool{false, true} {
		req := &InferRequest{Rows: 2, Outputs: []OutputChoice{{Index: 0, Binary: bin, Classes: 2}}}
		f := FootprintOf(m, req, 0, 0)
		b := []byte{}
		b, parts := AppendClassOutput(b, nil, m, req.Outputs[0], data, 2)
		if bin {
			require.Len(t, parts, 1)
			assert.LessOrEqual(t, int64(len(parts[0])), f.classes)
		} else {
			require.Empty(t, parts)
			assert.True(t, json.Valid(b), string(b))
			var out struct{ Data []string }
			require.NoError(t, json.Unmarshal(b, &out))
			assert.Equal(t, labels[0], strings.SplitN(out.Data[0], ":", 3)[2])
			assert.Equal(t, labels[1], strings.SplitN(out.Data[1], ":", 3)[2])
		}
		assert.LessOrEqual(t, int64(len(b)), f.JSON, "binary %v", bin)
	}
}

func fp32le(vals ...float32) []byte {
	var b []byte
	for _, v := range vals {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

// Outputs classification cannot rank are refused.
func TestClassificationParamRefusesUnrankable(t *testing.T) {
	for _, spec := range []models.TensorSpec{
		{Name: "t", Datatype: models.BYTES, Shape: []int{-1, 4}},
		{Name: "b", Datatype: models.BOOL, Shape: []int{-1, 4}},
		{Name: "s", Datatype: models.FP32, Shape: []int{-1, -1}},
	} {
		_, err := classificationParam(WireParams{Pairs: ParamPairs{{Key: "classification", Raw: json.RawMessage("1")}}}, spec)
		assert.Error(t, err, spec.Name)
	}
}
