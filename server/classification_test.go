package server

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/internal/half"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/wire"
	"github.com/stepserve/stepserve/serving"
)

// newLabelledSumMax serves summax with a labels file on y: its two
// elements are a row's sum and max.
func newLabelledSumMax(t *testing.T, labels string) *Server {
	t.Helper()
	repo := t.TempDir()
	dir := filepath.Join(repo, "summax")
	require.NoError(t, enginetest.WriteSumMax(dir))
	yaml := strings.Replace(enginetest.SumMaxYAML, "shape: [-1, 2]}", "shape: [-1, 2], labels: labels.txt}", 1)
	require.NoError(t, os.WriteFile(filepath.Join(dir, models.ConfigFile), []byte(yaml), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "labels.txt"), []byte(labels), 0o644))
	set := liveSet(t, repo, &enginetest.Engine{Func: enginetest.SumMax})
	s, err := New(Options{Models: set, MaxBodyBytes: 4096})
	require.NoError(t, err)
	return s
}

type classResponse struct {
	Outputs []struct {
		Name       string
		Datatype   string
		Shape      []int
		Data       []string
		Parameters map[string]int
	}
}

func classifyRequest(rows, output string) []byte {
	return []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[2,3],"data":` + rows + `}],"outputs":[` + output + `]}`)
}

// An output asked for with classification k answers BYTES [rows, k]:
// "value:index:label" for each row's k highest values, highest first.
func TestClassificationJSON(t *testing.T) {
	s := newLabelledSumMax(t, "sum\nmax\n")
	for _, tt := range []struct {
		name, rows string
		k          int
		want       []string
	}{
		{"top 2", `[[1,2,3],[-1,-2,-3]]`, 2, []string{"6:0:sum", "3:1:max", "-1:1:max", "-6:0:sum"}},
		{"top 1", `[[1,2,3],[-1,-2,-3]]`, 1, []string{"6:0:sum", "-1:1:max"}},
		{"ties keep the lower index first", `[[1,0,0],[0.5,0,0]]`, 2, []string{"1:0:sum", "1:1:max", "0.5:0:sum", "0.5:1:max"}},
	} {
		w := do(t, s, "POST", "/v2/models/summax/infer", classifyRequest(tt.rows, `{"name":"y","parameters":{"classification":`+strconv.Itoa(tt.k)+`}}`))
		require.Equal(t, 200, w.Code, "%s: %s", tt.name, w.Body.String())
		var r classResponse
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &r), tt.name)
		require.Len(t, r.Outputs, 1)
		assert.Equal(t, "y", r.Outputs[0].Name, tt.name)
		assert.Equal(t, "BYTES", r.Outputs[0].Datatype, tt.name)
		assert.Equal(t, []int{2, tt.k}, r.Outputs[0].Shape, tt.name)
		assert.Equal(t, tt.want, r.Outputs[0].Data, tt.name)
	}

	// classification 0 is the raw output, as in Triton.
	w := do(t, s, "POST", "/v2/models/summax/infer", classifyRequest(`[[1,2,3],[4,5,6]]`, `{"name":"y","parameters":{"classification":0}}`))
	require.Equal(t, 200, w.Code, w.Body.String())
	assert.Contains(t, w.Body.String(), `"datatype":"FP32","shape":[2,2],"data":[6,3,15,6]`)
}

// A classified output asked for as binary data is Triton's binary BYTES:
// each element a 4-byte little-endian length and its text; so is one
// under the request's binary_data_output.
func TestClassificationBinary(t *testing.T) {
	s := newLabelledSumMax(t, "sum\n\n") // max has no label
	for _, tt := range []struct{ name, body string }{
		{"output binary_data", string(classifyRequest(`[[1,2,3],[4,5,6]]`, `{"name":"y","parameters":{"classification":2,"binary_data":true}}`))},
		{"request binary_data_output", strings.Replace(string(classifyRequest(`[[1,2,3],[4,5,6]]`, `{"name":"y","parameters":{"classification":2}}`)), `{"inputs"`, `{"parameters":{"binary_data_output":true},"inputs"`, 1)},
	} {
		w := do(t, s, "POST", "/v2/models/summax/infer", []byte(tt.body))
		require.Equal(t, 200, w.Code, "%s: %s", tt.name, w.Body.String())
		n, err := strconv.Atoi(w.Header().Get("Inference-Header-Content-Length"))
		require.NoError(t, err, tt.name)
		var r classResponse
		require.NoError(t, json.Unmarshal(w.Body.Bytes()[:n], &r), tt.name)
		assert.Equal(t, "BYTES", r.Outputs[0].Datatype, tt.name)
		assert.Equal(t, []int{2, 2}, r.Outputs[0].Shape, tt.name)
		part := w.Body.Bytes()[n:]
		assert.Len(t, part, r.Outputs[0].Parameters["binary_data_size"], tt.name)
		var got []string
		for len(part) >= 4 {
			l := binary.LittleEndian.Uint32(part)
			got = append(got, string(part[4:4+l]))
			part = part[4+l:]
		}
		assert.Empty(t, part, tt.name)
		assert.Equal(t, []string{"6:0:sum", "3:1", "15:0:sum", "6:1"}, got, tt.name)
	}
}

func TestClassificationErrors(t *testing.T) {
	s := newLabelledSumMax(t, "sum\nmax\n")
	for _, tt := range []struct{ param, want string }{
		{`3`, `output "y": classification 3 asks for more classes than the output's 2 elements per row`},
		{`-1`, `output "y": parameter classification must be a non-negative integer (the number of classes to return), got -1`},
		{`"2"`, `parameter classification must be a non-negative integer`},
		{`1.5`, `parameter classification must be a non-negative integer`},
		{`true`, `parameter classification must be a non-negative integer`},
	} {
		w := do(t, s, "POST", "/v2/models/summax/infer", classifyRequest(`[[1,2,3],[4,5,6]]`, `{"name":"y","parameters":{"classification":`+tt.param+`}}`))
		assert.Equal(t, 400, w.Code, tt.param)
		assert.Contains(t, errorOf(t, w), tt.want, tt.param)
	}
}

// Ranking compares in the output's own datatype: integers beyond
// float64's precision, half-precision floats; NaN ranks last.
func TestClassifyDatatypes(t *testing.T) {
	pack := func(dt models.Datatype, vals ...float64) []byte {
		var b []byte
		for _, v := range vals {
			b = append(b, dt.Encode(v)...)
		}
		return b
	}
	big := []byte{}
	for _, v := range []int64{1 << 60, 1<<60 + 1, -5} {
		big = binary.LittleEndian.AppendUint64(big, uint64(v))
	}
	nan := pack(models.FP32, 1, 2)
	nan = binary.LittleEndian.AppendUint32(nan, math.Float32bits(float32(math.NaN())))
	nan = append(nan, pack(models.FP32, 0)...)
	for _, tt := range []struct {
		dt    models.Datatype
		width int
		data  []byte
		want  []string
	}{
		{models.INT64, 3, big, []string{"1152921504606846977:1", "1152921504606846976:0", "-5:2"}},
		{models.UINT8, 3, pack(models.UINT8, 7, 200, 9), []string{"200:1", "9:2", "7:0"}},
		{models.INT32, 3, pack(models.INT32, -7, -2, -9), []string{"-2:1", "-7:0", "-9:2"}},
		{models.FP16, 3, pack(models.FP16, 0.5, 0.25, 1.5), []string{"1.5:2", "0.5:0", "0.25:1"}},
		{models.BF16, 3, pack(models.BF16, 0.5, 2, 1), []string{"2:1", "1:2", "0.5:0"}},
		{models.FP64, 3, pack(models.FP64, 0.1, 0.3, 0.2), []string{"0.3:1", "0.2:2", "0.1:0"}},
		{models.FP32, 4, nan, []string{"2:1", "1:0", "0:3", "NaN:2"}},
	} {
		spec := models.TensorSpec{Name: "o", Datatype: tt.dt, Shape: []int{-1, tt.width}}
		assert.Equal(t, tt.want, wire.Classify(spec, nil, tt.data, 1, tt.width), tt.dt)
	}
	// Subnormal and negative half floats read right.
	assert.Equal(t, float32(-2), half.ToFloat32(0xc000))
	assert.Equal(t, float32(5.960464477539063e-08), half.ToFloat32(0x0001))
}

// The shipped digits model on the CPU engine: a held-out 7 classified
// with the shipped labels.
func TestClassifyShippedDigits(t *testing.T) {
	repo := t.TempDir()
	require.NoError(t, os.CopyFS(filepath.Join(repo, "digits"), os.DirFS("../model_repository/digits")))
	set, err := serving.New(serving.Options{Repository: repo, DefaultEngine: "cpu",
		Engines: map[string]serving.Engine{"cpu": {Engine: cpufallback.Engine{}}}})
	require.NoError(t, err)
	t.Cleanup(func() { set.Close() })
	require.NoError(t, set.LoadAll(context.Background()))
	require.NoError(t, set.Warmup(context.Background()))
	s, err := New(Options{Models: set})
	require.NoError(t, err)
	seven := `[0,0,2,13,16,14,1,0, 0,0,11,12,7,16,3,0, 0,0,9,3,2,16,3,0, 0,0,0,0,9,11,0,0,
		0,0,2,11,15,13,3,0, 0,0,4,15,16,13,3,0, 0,0,0,14,8,0,0,0, 0,0,5,15,4,0,0,0]`
	w := do(t, s, "POST", "/v2/models/digits/infer", []byte(`{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,64],"data":`+seven+`}],
		"outputs":[{"name":"probabilities","parameters":{"classification":3}}]}`))
	require.Equal(t, 200, w.Code, w.Body.String())
	var r classResponse
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &r))
	got := r.Outputs[0].Data
	require.Len(t, got, 3)
	first := strings.Split(got[0], ":")
	require.Len(t, first, 3, got[0])
	assert.Equal(t, []string{"7", "seven"}, first[1:])
	p, err := strconv.ParseFloat(first[0], 32)
	require.NoError(t, err)
	assert.Greater(t, p, 0.99)
	prev := p
	for _, c := range got[1:] {
		v, err := strconv.ParseFloat(strings.Split(c, ":")[0], 32)
		require.NoError(t, err)
		assert.LessOrEqual(t, v, prev, "highest first")
		prev = v
	}
}
