package main

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// torchRepo is a repository with the digits model on the torch engine:
// the Python worker on the host CPU, which is what these tests have.
func torchRepo(t *testing.T, extra string) string { return workerRepo(t, "torch", extra) }

// workerRepo is a repository with the digits model on engine.
func workerRepo(t *testing.T, engine, extra string) string {
	repo := t.TempDir()
	copyDigits(t, repo, "digits", "")
	path := filepath.Join(repo, "digits", "model.yaml")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(b), "engine: cpu", "engine: "+engine, 1)+extra), 0o644))
	return repo
}

func fakeRBLNPath(t *testing.T) string {
	p, err := filepath.Abs("../../engine/rbln/worker/testdata/fake_torch_rbln")
	require.NoError(t, err)
	return p
}

var workerPID = regexp.MustCompile(`msg="torch worker up" engine=torch device=cpu pid=(\d+)`)

// latestWorkerPID is the pid of the newest worker the server logged.
func latestWorkerPID(t *testing.T, p *process) int {
	m := workerPID.FindAllStringSubmatch(p.logs.String(), -1)
	require.NotEmpty(t, m, "no worker started")
	pid, _ := strconv.Atoi(m[len(m)-1][1])
	return pid
}

func probabilities(t *testing.T, base string, rows []digit) []float32 {
	resp, body := post(t, base+"/v2/models/digits/infer", jsonRequest("x", rows))
	require.Equal(t, 200, resp.StatusCode, string(body))
	var r inferResponse
	require.NoError(t, json.Unmarshal(body, &r))
	return r.Outputs[0].Data
}

// TestDigitsOnTheTorchEngine serves digits through a real worker process
// on the host CPU (engine torch) and compares every probability with the
// CPU engine's, through the HTTP API.
func TestDigitsOnTheTorchEngine(t *testing.T) {
	onTorch := start(t, "--model_repository", torchRepo(t, ""))
	onCPU := start(t)
	digits := heldout(t)[:120]
	worst := 0.0
	correct := 0
	for i := 0; i < len(digits); i += 40 {
		rows := digits[i : i+40]
		a, b := probabilities(t, onTorch.base, rows), probabilities(t, onCPU.base, rows)
		for j := range a {
			worst = math.Max(worst, math.Abs(float64(a[j]-b[j])))
		}
		for r, d := range rows {
			if argmax(a[r*10:(r+1)*10]) == d.label {
				correct++
			}
		}
	}
	t.Logf("torch worker vs CPU engine: max abs difference %.2e; accuracy %d/%d", worst, correct, len(digits))
	assert.Less(t, worst, 1e-4)
	m := scrape(t, onTorch.base)
	assert.Equal(t, 1.0, metricSum(t, m, "stepserve_worker_up", `engine="torch"`, `device="cpu"`))
	assert.Equal(t, 1.0, metricSum(t, m, "stepserve_model_ready", `model="digits"`, `engine="torch"`))
	assert.Greater(t, metricSum(t, m, "stepserve_steps_total", `engine="torch"`, `verdict="unmeasured"`), 0.0,
		"without torch_rbln the worker cannot run explain: its steps are unmeasured, not clean")
	assert.Zero(t, metricSum(t, m, "stepserve_steps_total", `verdict="clean"`))
	assert.Zero(t, metricSum(t, m, "stepserve_steps_total", `engine="rbln"`), "nothing ran under the rbln name")
}

// TestTheRBLNEngineRefusesTheHost: a model on engine rbln where the worker
// has no RBLN device is refused, and the server says why, rather than
// serving it from the host CPU under the rbln name.
func TestTheRBLNEngineRefusesTheHost(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"without torch_rbln", nil, "torch_rbln is not importable"},
		{"torch_rbln sees no device", []string{"--rbln.devices", "3", "--rbln.env", "PYTHONPATH=" + fakeRBLNPath(t)},
			"torch.rbln.is_available() is False: no RBLN device visible to this process (RBLN_VISIBLE_DEVICES=3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runBinary(append([]string{"--server.addr", "127.0.0.1:0", "--model_repository", workerRepo(t, "rbln", "")}, tc.args...)...)
			require.Error(t, err, out)
			assert.Equal(t, 1, err.(*exec.ExitError).ExitCode())
			assert.Contains(t, out, "engine rbln computes only on an RBLN device, and this worker has none")
			assert.Contains(t, out, tc.want)
		})
	}
}

func TestFailoverEngineNames(t *testing.T) {
	assert.Equal(t, "", failoverEngine("none"))
	assert.Equal(t, "cpu", failoverEngine("cpufallback"))
	assert.Equal(t, "torch", failoverEngine("torch"))
}

// TestExplainSignalsThroughTheServer scripts torch.rbln with the test double
// and checks each signal in the metrics and the explain endpoint.
func TestExplainSignalsThroughTheServer(t *testing.T) {
	scenarioPath := filepath.Join(t.TempDir(), "scenario.json")
	write := func(s string) { require.NoError(t, os.WriteFile(scenarioPath, []byte(s), 0o644)) }
	const clean = `{"verdict":{"clean":true,"reasons":[]},"dump":{"dispatch":{"cpu_fallback":0,"recompile_miss":0},
		"hidden_host_bounce":{"total_count":0,"total_bytes":0,"by_site":{}},"wall_ns":1000,
		"runtime":{"by_primitive":{"h2v":{"calls":1},"v2h":{"calls":1}}}},
		"memory":{"npu.0.chiplet.0.allocated.current":1048576,"npu.0.chiplet.0.reserved.current":2097152}}`
	write(clean)
	p := start(t, "--model_repository", torchRepo(t, ""),
		"--rbln.env", "PYTHONPATH="+fakeRBLNPath(t)+",STEPSERVE_FAKE_RBLN_SCENARIO="+scenarioPath)
	digit := heldout(t)[:1]

	probabilities(t, p.base, digit)
	m := scrape(t, p.base)
	assert.Equal(t, 1.0, metricSum(t, m, "stepserve_steps_total", `verdict="clean"`, `bucket="b1"`, `engine="torch"`),
		"where torch_rbln offers explain, the torch engine's steps are measured")
	assert.Zero(t, metricSum(t, m, "stepserve_device_memory_bytes"), "a worker on the host CPU reads no NPU's memory")

	for _, tc := range []struct {
		name, scenario, signal string
		count, bytes           float64
	}{
		{"cpu_fallback", `{"verdict":{"clean":false,"reasons":["cpu_fallback: aten::nonzero"]},"dump":{"dispatch":{"cpu_fallback":1,"recompile_miss":0},"cpu_fallback_by_op":{"aten::nonzero":1},"runtime":{"by_primitive":{"h2v":{"calls":1},"v2h":{"calls":1}}}},"report":"[overhead: 1 signal] cpu_fallback aten::nonzero"}`, "cpu_fallback", 1, 0},
		{"recompile", `{"verdict":{"clean":false,"reasons":["recompile"]},"dump":{"dispatch":{"cpu_fallback":0,"recompile_miss":1},"runtime":{"by_primitive":{"h2v":{"calls":1},"v2h":{"calls":1}}}},"report":"[overhead: 1 signal] recompile"}`, "recompile", 1, 0},
		{"host bounce, older keys", `{"verdict":{"clean":false,"reasons":["host_bounce"]},"dump":{"hidden_host_bounce":{"total_count":2,"total_bytes":8192,"by_site":{"m.py:1":2}},"rebel_runtime":{"by_primitive":{"h2v":{"calls":1},"v2h":{"calls":1}}}},"report":"[overhead: 1 signal] host_bounce"}`, "host_bounce", 2, 8192},
		{"extra h2d", `{"verdict":{"clean":true,"reasons":[]},"dump":{"runtime":{"by_primitive":{"h2v":{"calls":1},"h2v_multi":{"calls":2},"v2h":{"calls":1}}}}}`, "extra_h2d", 2, 0},
		{"missing d2h", `{"verdict":{"clean":true,"reasons":[]},"dump":{"runtime":{"by_primitive":{"h2v":{"calls":1},"v2h":{"calls":0}}}}}`, "missing_d2h", 1, 0},
	} {
		write(tc.scenario)
		probabilities(t, p.base, digit)
		m := scrape(t, p.base)
		assert.Equal(t, tc.count, metricSum(t, m, "stepserve_step_signals_total", `signal="`+tc.signal+`"`), tc.name)
		if tc.bytes > 0 {
			assert.Equal(t, tc.bytes, metricSum(t, m, "stepserve_host_bounce_bytes_total"), tc.name)
		}
		resp, err := http.Get(p.base + "/v2/models/digits/explain")
		require.NoError(t, err)
		var ex struct {
			NonCleanSteps []struct {
				Signals map[string]int64
				Explain struct {
					Report  string
					Reasons []string
				}
			} `json:"non_clean_steps"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&ex))
		resp.Body.Close()
		require.NotEmpty(t, ex.NonCleanSteps, tc.name)
		assert.Equal(t, int64(tc.count), ex.NonCleanSteps[0].Signals[tc.signal], tc.name)
		if !strings.Contains(tc.signal, "_d2h") && !strings.Contains(tc.signal, "_h2d") {
			assert.Contains(t, ex.NonCleanSteps[0].Explain.Report, tc.signal, "the report text reaches the explain endpoint")
		}
	}
	m = scrape(t, p.base)
	assert.Equal(t, 5.0, metricSum(t, m, "stepserve_steps_total", `verdict="overhead"`))

	// Unknown fields: nothing known fired, but nobody counted the copies:
	// unmeasured, not clean.
	write(`{"verdict":{"clean":true},"dump":{"dispatch":"?"}}`)
	probabilities(t, p.base, digit)
	m = scrape(t, p.base)
	assert.Equal(t, 1.0, metricSum(t, m, "stepserve_steps_total", `verdict="clean"`))
	assert.Equal(t, 1.0, metricSum(t, m, "stepserve_steps_total", `verdict="unmeasured"`))
	// An explain region that raises: the step is served, unmeasured.
	write(`{"raise_on_enter":true}`)
	probabilities(t, p.base, digit)
	assert.Equal(t, 2.0, metricSum(t, scrape(t, p.base), "stepserve_steps_total", `verdict="unmeasured"`))
}

// hammerDigits sends single-row requests from clients until stop, and
// returns the status of every answer; a request that gets no answer within
// 30s fails the test.
func hammerDigits(t *testing.T, base string, clients int, stop <-chan struct{}) map[int]int {
	codes := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second}
	body := jsonRequest("x", heldout(t)[:1])
	for range clients {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := client.Post(base+"/v2/models/digits/infer", "application/json", strings.NewReader(string(body)))
				if err != nil {
					t.Errorf("request not answered: %v", err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				codes[resp.StatusCode]++
				mu.Unlock()
				if resp.StatusCode == 503 {
					time.Sleep(10 * time.Millisecond) // Retry-After, shortened
				}
			}
		})
	}
	wg.Wait()
	return codes
}

// TestWorkerKilledMidLoad kills the worker with SIGKILL while clients send
// requests: every request is answered (200, or 503 while the device is
// down), none hangs, and the model is ready again after the restart.
func TestWorkerKilledMidLoad(t *testing.T) {
	p := start(t, "--model_repository", torchRepo(t, ""))
	codes, unready, ready := workerFaultUnderLoad(t, p, 8, syscall.SIGKILL)
	t.Logf("SIGKILL mid-load: not ready after %v, ready again after %v; answers %v", unready, ready, codes)
	assert.Greater(t, codes[200], 0)
	m := scrape(t, p.base)
	assert.Equal(t, 1.0, metricSum(t, m, "stepserve_worker_restarts_total", `engine="torch"`, `device="cpu"`))
	assert.Equal(t, 1.0, metricSum(t, m, "stepserve_worker_up", `engine="torch"`, `device="cpu"`))
	assert.Equal(t, float64(codes[503]), metricSum(t, m, "stepserve_requests_total", `model="digits"`, `outcome="rejected"`))
}

// workerFaultUnderLoad sends sig to the worker while clients send
// single-row requests, waits for the server to report not ready and then
// ready again, and returns the clients' answers (each checked to be 200 or
// 503, none missing) and how long after the signal each change came.
func workerFaultUnderLoad(t *testing.T, p *process, clients int, sig syscall.Signal) (codes map[int]int, unready, ready time.Duration) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { codes = hammerDigits(t, p.base, clients, stop); close(done) }()
	time.Sleep(300 * time.Millisecond)
	sent := time.Now()
	require.NoError(t, syscall.Kill(latestWorkerPID(t, p), sig))
	require.Eventually(t, func() bool { return status(t, "GET", p.base+"/v2/health/ready") == 503 }, 10*time.Second, time.Millisecond, "not ready while the worker is down")
	unready = time.Since(sent).Round(time.Millisecond)
	require.Eventually(t, func() bool { return status(t, "GET", p.base+"/v2/health/ready") == 200 }, 60*time.Second, 5*time.Millisecond)
	ready = time.Since(sent).Round(time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	close(stop)
	<-done
	for code := range codes {
		assert.Contains(t, []int{200, 503}, code)
	}
	return codes, unready, ready
}

// TestFailoverToTheCPUEngine: with engine.failover: cpufallback, a dead
// worker costs no request and no readiness; the failover is counted.
func TestFailoverToTheCPUEngine(t *testing.T) {
	p := start(t, "--model_repository", torchRepo(t, ""), "--engine.failover", "cpufallback")
	want := probabilities(t, p.base, heldout(t)[:3])
	stop := make(chan struct{})
	var codes map[int]int
	done := make(chan struct{})
	go func() { codes = hammerDigits(t, p.base, 4, stop); close(done) }()
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, syscall.Kill(latestWorkerPID(t, p), syscall.SIGKILL))
	readyAll := true
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		readyAll = readyAll && status(t, "GET", p.base+"/v2/health/ready") == 200
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	<-done
	assert.True(t, readyAll, "readiness stays true on the fallback")
	assert.Equal(t, map[int]int{200: codes[200]}, codes, "every request succeeded")
	got := probabilities(t, p.base, heldout(t)[:3])
	for i := range want {
		assert.InDelta(t, want[i], got[i], 1e-4)
	}
	m := scrape(t, p.base)
	assert.Equal(t, 1.0, metricSum(t, m, "stepserve_engine_failovers_total", `model="digits"`, `from="torch"`, `to="cpu"`))
	assert.Greater(t, metricSum(t, m, "stepserve_steps_total", `engine="cpu"`, `model="digits"`), 0.0)
}
