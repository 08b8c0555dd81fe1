package main

import (
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReplicasOnTwoTorchWorkers serves digits with instances {devices:
// all} on two torch workers (rbln.torch_workers 2): a replica on each.
// SIGKILL to one worker under load costs no request and no readiness: the
// other replica takes every batch, a step caught in the dead worker runs
// again there, and the killed worker comes back with its replica.
func TestReplicasOnTwoTorchWorkers(t *testing.T) {
	p := start(t, "--model_repository", torchRepo(t, "instances: {devices: all}\n"), "--rbln.torch_workers", "2")
	want := probabilities(t, p.base, heldout(t)[:3])
	m := scrape(t, p.base)
	assert.Equal(t, 2.0, metricSum(t, m, "stepserve_model_replicas", `model="digits"`, `engine="torch"`))
	assert.Equal(t, 2.0, metricSum(t, m, "stepserve_model_replicas_healthy", `model="digits"`))
	for _, d := range []string{"cpu0", "cpu1"} {
		assert.Equal(t, 1.0, metricSum(t, m, "stepserve_worker_up", `engine="torch"`, `device="`+d+`"`))
	}

	stop := make(chan struct{})
	done := make(chan struct{})
	var codes map[int]int
	go func() { codes = hammerDigits(t, p.base, 4, stop); close(done) }()
	time.Sleep(300 * time.Millisecond)
	pids := regexp.MustCompile(`msg="torch worker up" engine=torch device=cpu0 pid=(\d+)`).FindStringSubmatch(p.logs.String())
	require.NotNil(t, pids, "no worker for cpu0 started")
	pid, _ := strconv.Atoi(pids[1])
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	killed := time.Now()

	healthy := func() float64 {
		return metricSum(t, scrape(t, p.base), "stepserve_model_replicas_healthy", `model="digits"`)
	}
	readyAll, sawOne := true, false
	for time.Since(killed) < 60*time.Second {
		readyAll = readyAll && status(t, "GET", p.base+"/v2/health/ready") == 200
		h := healthy()
		sawOne = sawOne || h == 1
		if sawOne && h == 2 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	back := time.Since(killed).Round(time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	close(stop)
	<-done
	t.Logf("SIGKILL of one of two workers under load: replica back after %v; answers %v", back, codes)
	assert.True(t, sawOne, "the killed worker's replica was seen down")
	assert.Equal(t, 2.0, healthy(), "and back")
	assert.True(t, readyAll, "ready throughout: min_ready 1")
	assert.Equal(t, map[int]int{200: codes[200]}, codes, "every request succeeded")
	assert.Greater(t, codes[200], 0)

	got := probabilities(t, p.base, heldout(t)[:3])
	for i := range want {
		assert.InDelta(t, want[i], got[i], 1e-4)
	}
	m = scrape(t, p.base)
	assert.Equal(t, 1.0, metricSum(t, m, "stepserve_worker_restarts_total", `device="cpu0"`))
	assert.Zero(t, metricSum(t, m, "stepserve_worker_restarts_total", `device="cpu1"`))
	for _, d := range []string{"cpu0", "cpu1"} {
		assert.Greater(t, metricSum(t, m, "stepserve_device_steps_total", `model="digits"`, `device="`+d+`"`), 0.0, "steps on %s", d)
	}
}
