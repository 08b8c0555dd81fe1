package server

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/server/triton"
)

func getStats(t *testing.T, s *Server, path string) triton.StatsResponse {
	t.Helper()
	w := do(t, s, "GET", path, nil)
	require.Equal(t, 200, w.Code, "%s: %s", path, w.Body.String())
	var st triton.StatsResponse
	dec := json.NewDecoder(w.Body)
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&st), path)
	return st
}

// The statistics extension counts what a client did: rows, steps,
// successes and failures, and the time each part of a request took.
func TestStatisticsCountRequests(t *testing.T) {
	s, _ := newTestServer(t, newSumMax(t))
	st := getStats(t, s, "/v2/models/summax/stats")
	require.Len(t, st.ModelStats, 1)
	zero := st.ModelStats[0]
	assert.Equal(t, "summax", zero.Name)
	assert.Equal(t, "1", zero.Version)
	assert.Zero(t, zero.LastInference, "no inference yet")
	assert.Zero(t, zero.InferenceCount)
	assert.Zero(t, zero.ExecutionCount, "the warm-up is not an execution")
	assert.Empty(t, zero.BatchStats)
	assert.NotNil(t, zero.BatchStats, "an empty list, not null")

	before := time.Now().UnixMilli()
	row := func(n int) []byte {
		data := "[1,2,3"
		for range n - 1 {
			data += ",1,2,3"
		}
		return []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[` + strconv.Itoa(n) + `,3],"data":` + data + `]}]}`)
	}
	for _, n := range []int{1, 3, 6} { // 6 rows: two steps of the 4 bucket, 4 and 2 rows
		require.Equal(t, 200, do(t, s, "POST", "/v2/models/summax/infer", row(n)).Code)
	}
	require.Equal(t, 400, do(t, s, "POST", "/v2/models/summax/infer", []byte(`{"inputs":[]}`)).Code)

	for _, path := range []string{"/v2/models/summax/stats", "/v2/models/summax/versions/1/stats"} {
		st = getStats(t, s, path)
		require.Len(t, st.ModelStats, 1, path)
		ms := st.ModelStats[0]
		assert.GreaterOrEqual(t, ms.LastInference, uint64(before), path)
		assert.LessOrEqual(t, ms.LastInference, uint64(time.Now().UnixMilli()), path)
		assert.Equal(t, uint64(10), ms.InferenceCount, "rows of the successful requests")
		assert.Equal(t, uint64(4), ms.ExecutionCount, "steps: 1, 3, then 4 and 2")
		is := ms.InferenceStats
		for what, d := range map[string]triton.DurationStat{"success": is.Success, "queue": is.Queue,
			"compute_input": is.ComputeInput, "compute_infer": is.ComputeInfer, "compute_output": is.ComputeOutput} {
			assert.Equal(t, uint64(3), d.Count, "%s %s: one per successful request", path, what)
			assert.Positive(t, d.Ns, "%s %s is measured", path, what)
		}
		assert.Equal(t, uint64(1), is.Fail.Count)
		assert.Positive(t, is.Fail.Ns)
		assert.GreaterOrEqual(t, is.Success.Ns, is.Queue.Ns+is.ComputeInfer.Ns, "a request's time holds its queue and steps")
		assert.Equal(t, triton.DurationStat{}, is.CacheHit, "no response cache: truly none")
		assert.Equal(t, triton.DurationStat{}, is.CacheMiss)

		sizes := map[uint64]uint64{}
		for _, b := range ms.BatchStats {
			sizes[b.BatchSize] = b.ComputeInfer.Count
			assert.Equal(t, b.ComputeInfer.Count, b.ComputeInput.Count)
			assert.Equal(t, b.ComputeInfer.Count, b.ComputeOutput.Count)
			assert.Positive(t, b.ComputeInfer.Ns)
		}
		assert.Equal(t, map[uint64]uint64{1: 1, 2: 1, 3: 1, 4: 1}, sizes, "by rows run, not by bucket")
	}

	assert.Equal(t, 404, do(t, s, "GET", "/v2/models/nope/stats", nil).Code)
	assert.Equal(t, 404, do(t, s, "GET", "/v2/models/summax/versions/2/stats", nil).Code)
}

// GET /v2/models/stats is every model's statistics, in name order.
func TestStatisticsOfEveryModel(t *testing.T) {
	repo := t.TempDir()
	for _, name := range []string{"b", "a"} {
		require.NoError(t, enginetest.WriteSumMax(filepath.Join(repo, name)))
	}
	set := liveSet(t, repo, &enginetest.Engine{Func: enginetest.SumMax})
	s, err := New(Options{Models: set})
	require.NoError(t, err)
	require.Equal(t, 200, do(t, s, "POST", "/v2/models/b/infer", []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[2,3],"data":[1,2,3,4,5,6]}]}`)).Code)

	st := getStats(t, s, "/v2/models/stats")
	require.Len(t, st.ModelStats, 2)
	assert.Equal(t, "a", st.ModelStats[0].Name)
	assert.Equal(t, "b", st.ModelStats[1].Name)
	assert.Zero(t, st.ModelStats[0].InferenceCount)
	assert.Equal(t, uint64(2), st.ModelStats[1].InferenceCount)
	assert.Equal(t, uint64(1), st.ModelStats[1].ExecutionCount)
}

// A server with inference tokens guards the statistics like the rest of
// /v2/models.
func TestStatisticsNeedTheInferenceToken(t *testing.T) {
	s, err := New(Options{Models: newSumMax(t).set, InferenceTokens: []string{"s3cret"}})
	require.NoError(t, err)
	for _, path := range []string{"/v2/models/stats", "/v2/models/summax/stats", "/v2/models/summax/buckets"} {
		assert.Equal(t, 401, do(t, s, "GET", path, nil).Code, path)
		assert.Equal(t, 200, do(t, s, "GET", path, nil, "Authorization", "Bearer s3cret").Code, path)
	}
}
