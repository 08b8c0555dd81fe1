package serving

import (
	"context"
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/models"
)

// prepare hands the decoded inputs to the step as they are, and gives
// every output room for the request's rows.
func TestPrepareHandsDecodedInputsToTheModel(t *testing.T) {
	m := &models.Model{Name: "summax", Version: "1", Config: &models.Config{
		Inputs:  []models.TensorSpec{{Name: "x", Datatype: models.FP32, Shape: []int{-1, 3}}},
		Outputs: []models.TensorSpec{{Name: "y", Datatype: models.FP32, Shape: []int{-1, 2}}},
	}}
	data := make([]byte, 0, 24)
	for _, v := range []float32{1, 2, 3, 4, 5, 6} {
		data = binary.LittleEndian.AppendUint32(data, math.Float32bits(v))
	}
	req := &Request{Rows: 2, Inputs: []models.Input{{Shape: []int64{2, 3}, Data: data}}}
	res, err := prepare(m, req)
	require.NoError(t, err)
	sr := res.step
	assert.Equal(t, 2, sr.Rows)
	assert.Zero(t, sr.Seq)
	assert.Equal(t, 6, sr.Elements)
	require.Len(t, sr.Inputs, 1)
	assert.Same(t, &data[0], &sr.Inputs[0][0], "the decoded data goes to the step as it is")
	require.Len(t, res.Outputs, 1)
	assert.Len(t, res.Outputs[0], 2*8, "room for 2 rows of y (FP32 [-1 2])")
	assert.Equal(t, 2, res.Rows)
	assert.Zero(t, res.Tokens(), "not an encoder")
}

// summaxRows is one row of summax's x.
func summaxRows(x ...float32) *Request {
	data := make([]byte, 0, 12)
	for _, v := range x {
		data = binary.LittleEndian.AppendUint32(data, math.Float32bits(v))
	}
	return &Request{Rows: 1, Inputs: []models.Input{{Shape: []int64{1, 3}, Data: data}}}
}

// A request that meets its model replaced by a reload (the old version no
// longer takes requests) runs on the successor when the signature is the
// same, and says so; one whose model was unloaded is refused as draining.
func TestInferRunsOnTheSuccessorOfAReloadedModel(t *testing.T) {
	w := newWorld(t, []string{"a"})
	w.ready(t)
	ctx := context.Background()
	old, ok := w.set.Model("a")
	require.True(t, ok)
	ran, res, err := old.Infer(ctx, summaxRows(1, 2, 3))
	require.NoError(t, err)
	assert.Same(t, old, ran)
	y := res.Outputs[0]
	assert.Equal(t, []float32{6, 3}, []float32{math.Float32frombits(binary.LittleEndian.Uint32(y)), math.Float32frombits(binary.LittleEndian.Uint32(y[4:]))})

	require.NoError(t, w.set.Load(ctx, "a")) // a reload: the old version drains
	cur, ok := w.set.Model("a")
	require.True(t, ok)
	require.NotSame(t, old, cur)
	ran, res, err = old.Infer(ctx, summaxRows(4, 5, 6))
	require.NoError(t, err, "the old version's request runs on its successor")
	assert.Same(t, cur, ran)
	assert.Equal(t, float32(15), math.Float32frombits(binary.LittleEndian.Uint32(res.Outputs[0])))

	require.NoError(t, w.set.Unload(ctx, "a"))
	_, _, err = cur.Infer(ctx, summaxRows(1, 1, 1))
	assert.ErrorIs(t, err, ErrDraining, "no successor: refused")
}
