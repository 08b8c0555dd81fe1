package wire

import (
	"math/rand/v2"
	"testing"

	"github.com/stepserve/stepserve/models"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// jsonValueBytes bounds what appendJSONData writes for any value.
func TestJSONValueBytesBoundsAppendJSONData(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	longest := func(dt models.Datatype, bits func(i int) uint64) int {
		n := 0
		v := make([]byte, dt.Size())
		for i := range 100000 {
			x := bits(i)
			for k := range v {
				v[k] = byte(x >> (8 * k))
			}
			out, err := AppendJSONData(nil, v, dt)
			if err == nil {
				n = max(n, len(out)-2+1) // less the brackets, plus a comma
			}
		}
		return n
	}
	edges := []uint64{0, 1, 0x80000001, 0x00800000, 0x80800001, 0x7f7fffff, 0xff7fffff, 0x8000000000000001, 0x0010000000000000, 0x8010000000000001, 0xffefffffffffffff, 1 << 63, 1<<63 - 1, 1 << 31, 1<<31 - 1}
	for _, dt := range []models.Datatype{models.FP32, models.FP64, models.INT32, models.INT64, models.BOOL} {
		got := longest(dt, func(i int) uint64 {
			if i < len(edges) {
				return edges[i]
			}
			return rng.Uint64()
		})
		assert.LessOrEqual(t, got, jsonValueBytes(dt), dt)
		assert.Greater(t, got, jsonValueBytes(dt)-3, "%s: the bound is close", dt)
	}
}

// textModel serves one BYTES input, text, as tiny-encoder does.
func textModel(t *testing.T) *models.Model {
	m, err := models.Load("../../model_repository/tiny-encoder")
	require.NoError(t, err)
	return m
}

func TestFootprintFromDeclaredShapes(t *testing.T) {
	m := sumMax(t)
	_, f, err := ParseRequest([]byte(`{"id":"a<b","inputs":[{"name":"x","datatype":"FP32","shape":[5,3],"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}]}`), -1, m, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, Footprint{Rows: 5, inputs: 5 * 3 * 4, Outputs: 5 * 2 * 4,
		JSON: 64 + int64(len("summax")+len("1")+6*3) + 112 + int64(len("y")+21*2) + 5*2*16}, f)

	// Text: every row may take the longest seq bucket.
	tm := textModel(t)
	_, f, err = ParseRequest([]byte(`{"inputs":[{"name":"text","datatype":"BYTES","shape":[2],"data":["a",""]}]}`), -1, tm, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, int64(2*16+len(`["a",""]`)), f.inputs, "string headers and the text")
	assert.Equal(t, tm.StepBytes(2, 128), f.step)
	assert.Equal(t, int64(2*128*4), f.Outputs)
	assert.Zero(t, f.Binary)

	hdr := `{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":7}}],"outputs":[{"name":"embedding","parameters":{"binary_data":true}}]}`
	_, f, err = ParseRequest([]byte(hdr+"\x03\x00\x00\x00abc"), len(hdr), tm, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, int64(16+7), f.inputs)
	assert.Equal(t, int64(128*4), f.Binary, "binary outputs are the output buffers, sent as they are")
	assert.Less(t, f.JSON, int64(512))
}
