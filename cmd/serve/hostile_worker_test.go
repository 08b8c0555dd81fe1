package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slowBody is a single-row request to the slow model (writeSlowTorch)
// whose first value is v.
func slowBody(v float32) []byte {
	b, _ := json.Marshal(map[string]any{"inputs": []map[string]any{{"name": "x", "datatype": "FP32", "shape": []int{1, 4}, "data": []float32{v, 1, 2, 3}}}})
	return b
}

// answersNormally is whether the slow model answers a plain request with
// y = 2x.
func answersNormally(t *testing.T, base string) bool {
	resp, err := patient.Post(base+"/v2/models/slow/infer", "application/json", strings.NewReader(string(slowBody(5))))
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var r inferResponse
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&r) != nil || len(r.Outputs) == 0 {
		return false
	}
	return len(r.Outputs[0].Data) == 4 && r.Outputs[0].Data[0] == 10
}

// TestHangingStepDoesNotTakeTheModelDownForGood (issue 28, item 5): a step
// whose input hangs the user's module past rbln.stall_timeout, sent four
// times (one more than the restarts a model's reload may fail in a row):
// each is answered 503 and run once (never replayed by the re-warm, which
// runs on zeros, nor on another replica); each time the worker restarts,
// the model comes back and answers plain requests, and the server lives.
func TestHangingStepDoesNotTakeTheModelDownForGood(t *testing.T) {
	repo := t.TempDir()
	mark := writeSlowTorch(t, repo, "slow", "")
	p := startCapped(t, hostileMemoryCap, "--model_repository", repo, "--rbln.stall_timeout", "2s")
	require.True(t, answersNormally(t, p.base))
	rss0 := p.rss(t)

	const hostile = 4
	for i := range hostile {
		begin := time.Now()
		resp, body := post(t, p.base+"/v2/models/slow/infer", slowBody(9999))
		t.Logf("hostile step %d: %d after %v: %s", i+1, resp.StatusCode, time.Since(begin).Round(time.Millisecond), strings.TrimSpace(string(body)))
		assert.Equal(t, 503, resp.StatusCode, "the request running when its worker died is answered")
		begin = time.Now()
		ok := assert.Eventually(t, func() bool { return answersNormally(t, p.base) }, 60*time.Second, 100*time.Millisecond,
			"the model comes back after hostile step %d", i+1)
		t.Logf("model back after %v", time.Since(begin).Round(time.Millisecond))
		if !ok {
			break
		}
	}
	b, err := os.ReadFile(mark)
	require.NoError(t, err)
	assert.Equal(t, hostile, strings.Count(string(b), "hostile step"), "each hostile input ran once: never replayed")
	m := scrape(t, p.base)
	t.Logf("worker restarts %v, model reloads ok %v failed %v", metricSum(t, m, "stepserve_worker_restarts_total"),
		metricSum(t, m, "stepserve_worker_model_reloads_total", `outcome="ok"`), metricSum(t, m, "stepserve_worker_model_reloads_total", `outcome="failed"`))
	assert.Equal(t, float64(hostile), metricSum(t, m, "stepserve_worker_restarts_total"))
	assert.Equal(t, float64(hostile), metricSum(t, m, "stepserve_worker_model_reloads_total", `outcome="ok"`))
	assert.True(t, p.alive())
	assert.Less(t, p.rss(t), rss0+128<<20)
}

// TestFloodingModuleDoesNotWedgeItsModel (issue 28, item 6): a step that
// prints 2,000,000 lines is answered, the log gets a bounded share of them
// (the rest counted as dropped), the server's CPU stays modest, and the
// model answers afterwards.
func TestFloodingModuleDoesNotWedgeItsModel(t *testing.T) {
	repo := t.TempDir()
	writeSlowTorch(t, repo, "slow", "")
	p := startCapped(t, hostileMemoryCap, "--model_repository", repo, "--rbln.stall_timeout", "60s")
	require.True(t, answersNormally(t, p.base))
	cpu0, log0 := p.cpuSeconds(t), len(p.logs.String())

	begin := time.Now()
	resp, body := post(t, p.base+"/v2/models/slow/infer", slowBody(7777))
	cpu, logged := p.cpuSeconds(t)-cpu0, len(p.logs.String())-log0
	t.Logf("flooding step: %d after %v; server CPU %.2fs, log grew %d bytes", resp.StatusCode, time.Since(begin).Round(time.Millisecond), cpu, logged)
	assert.Equal(t, 200, resp.StatusCode, string(body))
	assert.Less(t, logged, 1<<20, "the log takes a bounded share of the flood")
	dropped := metricSum(t, scrape(t, p.base), "stepserve_worker_output_lines_dropped_total")
	t.Logf("worker output lines dropped: %v", dropped)
	assert.Greater(t, dropped, 1.9e6)
	assert.Less(t, cpu, 60.0, "reading the flood costs the server little (the old reader logged every line)")
	assert.True(t, answersNormally(t, p.base))
	assert.True(t, p.alive())
}

// cpuSeconds is the server process's CPU time so far (user and system;
// its workers are processes of their own).
func (p *process) cpuSeconds(t *testing.T) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	require.NoError(t, err, "the server is gone")
	// The fields after the command's closing parenthesis: utime and stime
	// are the 12th and 13th, in clock ticks (100 a second on Linux).
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, err1 := strconv.ParseFloat(fields[11], 64)
	stime, err2 := strconv.ParseFloat(fields[12], 64)
	require.NoError(t, errors.Join(err1, err2))
	return (utime + stime) / 100
}
