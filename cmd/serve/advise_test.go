package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// adviceAnswer is GET .../buckets/advice's body.
type adviceAnswer struct {
	Name       string `json:"name"`
	MaxBuckets int    `json:"max_buckets"`
	Advice     struct {
		Batch          []int   `json:"batch"`
		Seq            []int   `json:"seq"`
		Programs       int     `json:"programs"`
		CurrentBatch   []int   `json:"current_batch"`
		CurrentSeq     []int   `json:"current_seq"`
		PaddingNow     float64 `json:"padding_ratio_current"`
		PaddingAdvised float64 `json:"padding_ratio_advised"`
		WorkRatio      float64 `json:"work_ratio"`
		Steps          int64   `json:"steps"`
		YAML           string  `json:"model_yaml"`
	} `json:"advice"`
}

func getAdvice(t *testing.T, base, model, query string) adviceAnswer {
	t.Helper()
	resp, err := http.Get(base + "/v2/models/" + model + "/buckets/advice" + query)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var a adviceAnswer
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&a))
	return a
}

// skewed sends the digits model a skewed workload one request at a time
// (so that each request is one step): mostly 5 and 6 rows, a few of 20.
func skewed(t *testing.T, base string, rows []digit) {
	t.Helper()
	for i := range 60 {
		n := []int{5, 6, 5, 6, 20}[i%5]
		resp, body := post(t, base+"/v2/models/digits/infer", jsonRequest(fmt.Sprint(i), rows[:n]))
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	}
}

// TestBucketAdviceLowersPadding is the advisor end to end: a skewed
// workload on digits (buckets 1, 4, 16, 32: its 5- and 6-row steps run in
// the 16 bucket), the advice for three buckets, that advice applied to
// model.yaml and the model reloaded, and the same workload again: the
// padding the reloaded model reports is the padding the advice promised,
// and well under what it was.
func TestBucketAdviceLowersPadding(t *testing.T) {
	repo := t.TempDir()
	dir := filepath.Join(repo, "digits")
	require.NoError(t, os.CopyFS(dir, os.DirFS("../../model_repository/digits")))
	p := startCmd(t, exec.Command(binPath, "--server.addr", "127.0.0.1:0", "--model_repository", repo,
		"--server.enable_model_control", "--batching.max_queue_delay", "0s"))
	rows := heldout(t)

	resp, err := http.Get(p.base + "/v2/models/digits/buckets/advice")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusConflict, resp.StatusCode, "no advice before any traffic")

	skewed(t, p.base, rows)
	a := getAdvice(t, p.base, "digits", "?max_buckets=3")
	assert.Equal(t, 3, a.MaxBuckets)
	assert.Equal(t, []int{1, 4, 16, 32}, a.Advice.CurrentBatch)
	assert.Equal(t, []int{5, 6, 20}, a.Advice.Batch)
	assert.Equal(t, int64(60), a.Advice.Steps)
	// Now: 5 and 6 rows in 16, 20 in 32 -> real 5+6+5+6+20 = 42 of 16*4+32 = 96.
	assert.InDelta(t, 1-42.0/96, a.Advice.PaddingNow, 1e-6)
	assert.InDelta(t, 0, a.Advice.PaddingAdvised, 1e-6)
	assert.Equal(t, "buckets:\n  batch: [5, 6, 20]\n", a.Advice.YAML)

	// The same advice, as a person reads it.
	out, err := exec.Command(binPath, "advise", "--url", p.base, "--model", "digits", "--max-buckets", "3").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "60 steps recorded")
	assert.Regexp(t, `now: +batch \[1 4 16 32\] +4 programs, +56\.2% of the device work is padding`, string(out))
	assert.Regexp(t, `advised: +batch \[5 6 20\] +3 programs, +0\.0% of the device work is padding`, string(out))
	assert.Contains(t, string(out), "buckets:\n  batch: [5, 6, 20]\n")
	out, err = exec.Command(binPath, "advise", "--url", p.base, "--model", "nosuch").CombinedOutput()
	assert.Error(t, err)
	assert.Contains(t, string(out), "404")

	// Apply it and serve the same traffic.
	yaml, err := os.ReadFile(filepath.Join(dir, "model.yaml"))
	require.NoError(t, err)
	applied := regexp.MustCompile(`(?m)^buckets:\n  batch: \[[^\]]*\]\n`).ReplaceAllString(string(yaml), a.Advice.YAML)
	require.NotEqual(t, string(yaml), applied)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.yaml"), []byte(applied), 0o644))
	resp, body := post(t, p.base+"/v2/repository/models/digits/load", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	skewed(t, p.base, rows)
	b := getAdvice(t, p.base, "digits", "?max_buckets=3")
	assert.Equal(t, []int{5, 6, 20}, b.Advice.CurrentBatch)
	assert.Equal(t, int64(60), b.Advice.Steps, "a reload starts a new record")
	assert.InDelta(t, a.Advice.PaddingAdvised, b.Advice.PaddingNow, 1e-6, "the reloaded model pads as the advice said")
	assert.Less(t, b.Advice.PaddingNow, a.Advice.PaddingNow-0.5)
	// And the per-bucket stats, counted by the steps, agree.
	resp, err = http.Get(p.base + "/v2/models/digits/buckets")
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.NotContains(t, string(body), `"bucket":"b32"`)
	assert.True(t, strings.Contains(string(body), `"mean_padding_ratio":0`), "%s", body)

	resp, err = http.Get(p.base + "/v2/models/digits/buckets/advice?max_buckets=zero")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

// TestBucketAdviceForText advises a sequence model: tiny-encoder's batch
// x seq grid, for traffic of short texts, keeps the longest seq bucket (the
// longest text it accepts) and lowers the padding.
func TestBucketAdviceForText(t *testing.T) {
	p := start(t, "--batching.max_queue_delay", "0s")
	for i := range 20 {
		texts := []string{`"a short query"`, `"another short one here"`}[:1+i%2]
		body := `{"inputs":[{"name":"text","datatype":"BYTES","shape":[` + fmt.Sprint(len(texts)) + `],"data":[` + strings.Join(texts, ",") + `]}]}`
		resp, out := post(t, p.base+"/v2/models/tiny-encoder/infer", []byte(body))
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", out)
	}
	a := getAdvice(t, p.base, "tiny-encoder", "")
	assert.Equal(t, 12, a.MaxBuckets, "by default as many programs as now")
	assert.Equal(t, []int{32, 64, 128}, a.Advice.CurrentSeq)
	assert.Equal(t, 128, a.Advice.Seq[len(a.Advice.Seq)-1], "the longest text accepted stays accepted")
	assert.Equal(t, []int{1, 2}, a.Advice.Batch)
	assert.LessOrEqual(t, a.Advice.Programs, 12)
	assert.Less(t, a.Advice.PaddingAdvised, a.Advice.PaddingNow)
	assert.Contains(t, a.Advice.YAML, "  seq: [32, ")
}
