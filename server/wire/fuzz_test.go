package wire

import (
	"errors"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stretchr/testify/require"
)

// sumMax is summax's model ([enginetest.SumMaxYAML]), loaded from a folder.
func sumMax(t *testing.T) *models.Model {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "summax")
	require.NoError(t, enginetest.WriteSumMax(dir))
	m, err := models.Load(dir)
	require.NoError(t, err)
	return m
}

func fuzzModels() []*models.Model {
	digits := &models.Model{Name: "digits", Version: "1", Config: &models.Config{
		Inputs:  []models.TensorSpec{{Name: "pixels", Datatype: models.FP32, Shape: []int{-1, 4}}},
		Outputs: []models.TensorSpec{{Name: "probabilities", Datatype: models.FP32, Shape: []int{-1, 2}}},
	}}
	return []*models.Model{digits}
}

// checkDecoded asserts what any accepted request must satisfy: every input
// holds exactly rows x row elements, and outputs are known.
func checkDecoded(t *testing.T, m *models.Model, req *InferRequest) {
	if req.Rows < 1 {
		t.Fatalf("accepted %d rows", req.Rows)
	}
	for i, s := range m.Config.Inputs {
		if got, want := len(req.Inputs[i].Data), req.Rows*s.RowBytes(0); got != want {
			t.Fatalf("input %s: %d bytes for %d rows, want %d", s.Name, got, req.Rows, want)
		}
		if err := checkFinite(req.Inputs[i].Data, s.Datatype); err != nil {
			t.Fatalf("accepted a non-finite value: %v", err)
		}
	}
	for _, o := range req.Outputs {
		if o.Index < 0 || o.Index >= len(m.Config.Outputs) {
			t.Fatalf("output index %d", o.Index)
		}
	}
}

// FuzzDecodeJSON feeds arbitrary bodies to the JSON request decoder: it must
// never panic, and what it accepts must be well-formed.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{
		`{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}`,
		`{"id":"x","inputs":[{"name":"pixels","datatype":"FP32","shape":[2,4],"data":[[1,2,3,4],[5,6,7,8]]}],"outputs":[{"name":"probabilities","parameters":{"binary_data":true}}]}`,
		`{"parameters":{"priority":1,"timeout":100},"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,4],"data":[1e-3,-2,3.5,NaN]}]}`,
		`{"inputs":[{"name":"pixels","datatype":"FP32","shape":[-1,4],"data":[]}]}`,
		`{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,4],"data":[[[[1]]],2,3,4]}]}`,
	} {
		f.Add([]byte(s))
	}
	m := fuzzModels()[0]
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeRequest(body, -1, m, 1<<20)
		if err != nil {
			if statusOf(err) != 400 {
				t.Fatalf("status %d for a bad body: %v", statusOf(err), err)
			}
			return
		}
		checkDecoded(t, m, req)
	})
}

// FuzzDecodeBinary feeds arbitrary binary-extension requests (a JSON header
// of the given length, then tensor bytes).
func FuzzDecodeBinary(f *testing.F) {
	h := `{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,4],"parameters":{"binary_data_size":16}}],"outputs":[{"name":"probabilities","parameters":{"binary_data":true}}]}`
	f.Add([]byte(h+"\x00\x00\x80?\x00\x00\x00@\x00\x00@@\x00\x00\x80@"), len(h))
	f.Add([]byte(h+"\x00\x00\xc0\x7f"), len(h))
	f.Add([]byte(`{}`), 5)
	m := fuzzModels()[0]
	f.Fuzz(func(t *testing.T, body []byte, headerLen int) {
		if headerLen < 0 {
			headerLen = -headerLen
		}
		req, err := DecodeRequest(body, headerLen, m, 1<<20)
		if err != nil {
			if statusOf(err) != 400 {
				t.Fatalf("status %d for a bad body: %v (header length %s)", statusOf(err), err, strconv.Itoa(headerLen))
			}
			return
		}
		checkDecoded(t, m, req)
	})
}

// statusOf is a refusal's HTTP status; 500 for any other error.
func statusOf(err error) int {
	var e *apierr.Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 500
}
