package server

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/models"
)

// float16SumMax serves summax on an engine that computes in float16, with
// extra appended to its model.yaml.
func float16SumMax(t *testing.T, extra string) *fixture {
	f := &fixture{repo: t.TempDir(), eng: &enginetest.Engine{Func: enginetest.SumMax, Dtype: "float16"}}
	dir := filepath.Join(f.repo, "summax")
	require.NoError(t, enginetest.WriteSumMax(dir))
	require.NoError(t, os.WriteFile(filepath.Join(dir, models.ConfigFile), []byte(enginetest.SumMaxYAML+extra), 0o644))
	f.set = liveSet(t, f.repo, f.eng)
	return f
}

// A finite float input beyond float16's range, for a model computing in
// float16, is refused naming the input, the element and the range (staging
// would make it infinite), or clamped where model.yaml says so (issue 33,
// item 9). On the float32 engine the same value passes.
func TestFloat16RangeIsRefusedOrClamped(t *testing.T) {
	big := []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,70000,-2]}]}`)
	s, _ := newTestServer(t, float16SumMax(t, ""))
	w := do(t, s, "POST", "/v2/models/summax/infer", big)
	require.Equal(t, http.StatusBadRequest, w.Code, w.Body.String())
	assert.Contains(t, w.Body.String(), `input \"x\": element 1 is 70000, outside the range float16 holds (±65504)`)
	assert.Contains(t, w.Body.String(), "float16_overflow: clamp")
	w = do(t, s, "POST", "/v2/models/summax/infer", []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,65504,-65504]}]}`))
	require.Equal(t, http.StatusOK, w.Code, "the range's ends pass: %s", w.Body.String())

	s, _ = newTestServer(t, float16SumMax(t, "float16_overflow: clamp\n"))
	w = do(t, s, "POST", "/v2/models/summax/infer", big)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	var r response
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &r))
	assert.Equal(t, []float32{1 + 65504 - 2, 65504}, r.Outputs[0].Data, "sum and max of the clamped row")

	s, _ = newTestServer(t, newSumMax(t))
	w = do(t, s, "POST", "/v2/models/summax/infer", big)
	require.Equal(t, http.StatusOK, w.Code, "a float32 engine holds it: %s", w.Body.String())
}
