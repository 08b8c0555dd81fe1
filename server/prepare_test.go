package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/wire"
)

// A model's refusal of a request's values is the client's to fix: a 400
// with the model's message, counted as invalid.
func TestModelInputErrorIs400(t *testing.T) {
	refusal := &models.InputError{Input: "x", Err: errors.New("element 2 is 100; want 0..99")}
	assert.Equal(t, http.StatusBadRequest, core.StatusOf(fmt.Errorf("step: %w", refusal)))
	assert.Equal(t, http.StatusBadRequest, core.StatusOf(models.ErrInput))

	f := newSumMax(t)
	f.program().Fail(refusal)
	s, _ := newTestServer(t, f)
	w := do(t, s, "POST", "/v2/models/summax/infer", []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`))
	assert.Equal(t, http.StatusBadRequest, w.Code)
	assert.Contains(t, errorOf(t, w), `input "x": element 2 is 100; want 0..99`)
	assert.Equal(t, 1.0, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", "invalid", "http")))
}

// stringsModel takes one BYTES input, s.
func stringsModel() *models.Model {
	return &models.Model{Name: "strs", Version: "1", Config: &models.Config{
		Inputs:  []models.TensorSpec{{Name: "s", Datatype: models.BYTES, Shape: []int{-1}}},
		Outputs: []models.TensorSpec{{Name: "y", Datatype: models.FP32, Shape: []int{-1, 2}}},
	}}
}

func TestStringInputs(t *testing.T) {
	m := stringsModel()
	req, err := wire.DecodeRequest([]byte(`{"inputs":[{"name":"s","datatype":"BYTES","shape":[2],"data":["The water is warm.","hello"]}]}`), -1, m, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, []string{"The water is warm.", "hello"}, req.Inputs[0].Strings)

	var blob []byte
	for _, s := range []string{"one", "two words"} {
		blob = binary.LittleEndian.AppendUint32(blob, uint32(len(s)))
		blob = append(blob, s...)
	}
	header := fmt.Sprintf(`{"inputs":[{"name":"s","datatype":"BYTES","shape":[2],"parameters":{"binary_data_size":%d}}]}`, len(blob))
	req, err = wire.DecodeRequest([]byte(header+string(blob)), len(header), m, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, []string{"one", "two words"}, req.Inputs[0].Strings)
	assert.Equal(t, 2, req.Rows)

	lying := `{"inputs":[{"name":"s","datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":8}}]}`
	for _, tc := range []struct {
		body      string
		headerLen int
		want      string
	}{
		{`{"inputs":[{"name":"s","datatype":"BYTES","shape":[1],"data":["caf` + "\xe9" + `"]}]}`, -1, `input "s": data is not valid UTF-8`},
		{`{"inputs":[{"name":"s","datatype":"BYTES","shape":[2],"data":["a"]}]}`, -1, "shape [2] needs 2 strings, data has 1"},
		{`{"inputs":[{"name":"s","datatype":"BYTES","shape":[1],"data":[7]}]}`, -1, "element 0 is 7; want a string"},
		{`{"inputs":[{"name":"s","datatype":"FP32","shape":[1],"data":[7]}]}`, -1, "datatype FP32, want BYTES"},
		{lying + "\x09\x00\x00\x00abcd", len(lying), "element 0: length 9 runs past the 4 bytes of binary data left"},
	} {
		_, err := wire.DecodeRequest([]byte(tc.body), tc.headerLen, m, 1<<20)
		require.Error(t, err, tc.body)
		assert.Equal(t, 400, core.StatusOf(err))
		assert.ErrorContains(t, err, tc.want)
	}
}

func TestVariableLengthInputs(t *testing.T) {
	m := &models.Model{Name: "ids", Version: "1", Config: &models.Config{
		Inputs: []models.TensorSpec{
			{Name: "ids", Datatype: models.INT64, Shape: []int{-1, -1}},
			{Name: "mask", Datatype: models.INT64, Shape: []int{-1, -1}},
		},
		Outputs: []models.TensorSpec{{Name: "y", Datatype: models.FP32, Shape: []int{-1, 2}}},
	}}
	req, err := wire.DecodeRequest([]byte(`{"inputs":[{"name":"ids","datatype":"INT64","shape":[2,3],"data":[[5,6,7],[8,9,0]]},{"name":"mask","datatype":"INT64","shape":[2,3],"data":[[1,1,1],[1,1,0]]}]}`), -1, m, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, []int64{2, 3}, req.Inputs[0].Shape)
	assert.Len(t, req.Inputs[0].Data, 6*8)

	for _, tc := range []struct{ body, want string }{
		{`{"inputs":[{"name":"ids","datatype":"INT64","shape":[1,0],"data":[]},{"name":"mask","datatype":"INT64","shape":[1,0],"data":[]}]}`, `input "ids": shape [1 0]: dimension 1`},
		{`{"inputs":[{"name":"ids","datatype":"INT64","shape":[1,2],"data":[1,2]}]}`, `missing input "mask"`},
		{`{"inputs":[{"name":"ids","datatype":"INT64","shape":[1,2],"data":[1,2.5]},{"name":"mask","datatype":"INT64","shape":[1,2],"data":[1,1]}]}`, `element 1: 2.5 is not an integer in the INT64 range`},
	} {
		_, err := wire.DecodeRequest([]byte(tc.body), -1, m, 1<<20)
		require.Error(t, err, tc.body)
		assert.Equal(t, 400, core.StatusOf(err), tc.body)
		assert.ErrorContains(t, err, tc.want)
	}
}

// Sixteen million strings for a shape of one are refused at the second.
func TestManyStringsForAShapeOfOne(t *testing.T) {
	m := stringsModel()
	body := `{"inputs":[{"name":"s","datatype":"BYTES","shape":[1],"data":[` + strings.Repeat(`"",`, 1<<20) + `""]}]}`
	allocs := testing.AllocsPerRun(1, func() {
		_, err := wire.DecodeRequest([]byte(body), -1, m, 1<<30)
		assert.ErrorContains(t, err, `input "s": more strings than the shape holds (1)`)
	})
	// A million strings built would be a million allocations; the bound
	// leaves room for what the race detector and the runtime add (a run
	// counted 20 under -race).
	assert.Less(t, allocs, 64.0, "nothing is built past the first string")

	var blob []byte
	for range 3 {
		blob = binary.LittleEndian.AppendUint32(blob, 0)
	}
	hdr := `{"inputs":[{"name":"s","datatype":"BYTES","shape":[2],"parameters":{"binary_data_size":12}}]}`
	_, err := wire.DecodeRequest([]byte(hdr+string(blob)), len(hdr), m, 1<<20)
	assert.ErrorContains(t, err, `input "s": more strings than the shape holds (2)`)
}
