package main

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// metricSum adds the values of every sample of name whose labels contain
// all of want.
func metricSum(t *testing.T, text, name string, want ...string) float64 {
	t.Helper()
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(m[1], w)
		}
		if ok {
			v, err := strconv.ParseFloat(m[2], 64)
			require.NoError(t, err)
			sum += v
		}
	}
	return sum
}

func scrape(t *testing.T, base string) string {
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// hammer sends each digit from 64 concurrent clients and checks every
// answer against the single-request answer.
func hammer(t *testing.T, base string, digits []digit, clients int) {
	var wg sync.WaitGroup
	errs := make(chan string, len(digits))
	next := make(chan int, len(digits))
	for i := range digits {
		next <- i
	}
	close(next)
	for range clients {
		wg.Go(func() {
			for i := range next {
				resp, err := http.Post(base+"/v2/models/digits/infer", "application/json", strings.NewReader(string(jsonRequest(strconv.Itoa(i), digits[i:i+1]))))
				if err != nil {
					errs <- err.Error()
					continue
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var r inferResponse
				if resp.StatusCode != 200 || json.Unmarshal(body, &r) != nil || r.ID != strconv.Itoa(i) {
					errs <- string(body)
					continue
				}
				if argmax(r.Outputs[0].Data) != digits[i].want {
					errs <- "request " + strconv.Itoa(i) + ": wrong class"
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestDynamicBatchingUnderConcurrency(t *testing.T) {
	// 10 ms for a batch to gather: the 64 clients share two cores with the
	// server (and, in a cold CI run, with the compiler), and come back
	// more slowly than a 2 ms window counts on.
	p := start(t, "--batching.max_queue_delay", "10ms")
	digits := heldout(t)
	// The expected class of each digit is what the model answers alone;
	// batching must not change any answer.
	for i := range digits {
		digits[i].want = classifyOne(t, p.base, digits[i])
	}
	before := scrape(t, p.base)
	stepsBefore := metricSum(t, before, "stepserve_steps_total")

	hammer(t, p.base, digits, 64)

	m := scrape(t, p.base)
	stepCount := metricSum(t, m, "stepserve_batch_size_count") - metricSum(t, before, "stepserve_batch_size_count")
	rows := metricSum(t, m, "stepserve_batch_size_sum") - metricSum(t, before, "stepserve_batch_size_sum")
	require.Equal(t, float64(len(digits)), rows, "every row ran exactly once")
	mean := rows / stepCount
	t.Logf("64 clients: %d requests in %.0f steps, mean batch size %.2f", len(digits), stepCount, mean)
	assert.Greater(t, mean, 4.0)
	assert.Equal(t, metricSum(t, m, "stepserve_steps_total")-stepsBefore, stepCount)
	assert.Equal(t, metricSum(t, m, "stepserve_steps_total"), metricSum(t, m, "stepserve_steps_total", `verdict="clean"`), "every step is clean")
	assert.Equal(t, metricSum(t, m, "stepserve_steps_total"), metricSum(t, m, "stepserve_transfers_total", `direction="h2d"`))
	assert.Equal(t, 1.0, metricSum(t, m, "stepserve_model_ready", `model="digits"`, `engine="cpu"`))
	assert.Greater(t, metricSum(t, m, "stepserve_bucket_compile_duration_seconds", `bucket="b32"`), 0.0)
	assert.Equal(t, 0.0, metricSum(t, m, "stepserve_queue_depth", `model="digits"`))
	assert.Greater(t, metricSum(t, m, "stepserve_queue_duration_seconds_count"), 0.0)

	// The buckets endpoint agrees with the metrics.
	resp, err := http.Get(p.base + "/v2/models/digits/buckets")
	require.NoError(t, err)
	defer resp.Body.Close()
	var st struct {
		Buckets []struct {
			Bucket        string
			Steps, Clean  float64
			Overhead      float64
			MeanBatchSize float64             `json:"mean_batch_size"`
			QueueSeconds  struct{ Count int } `json:"queue_seconds"`
			StepSeconds   struct {
				Count int
				P50   float64
				P99   float64
			} `json:"step_seconds"`
		}
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	require.Len(t, st.Buckets, 4)
	var steps, queued float64
	for _, b := range st.Buckets {
		assert.Equal(t, b.Steps, metricSum(t, m, "stepserve_steps_total", `bucket="`+b.Bucket+`"`), b.Bucket)
		assert.Equal(t, b.Steps, b.Clean, b.Bucket)
		assert.Zero(t, b.Overhead, b.Bucket)
		assert.LessOrEqual(t, b.StepSeconds.P50, b.StepSeconds.P99, b.Bucket)
		steps += b.Steps
		queued += float64(b.QueueSeconds.Count)
	}
	assert.Equal(t, metricSum(t, m, "stepserve_steps_total"), steps)
	assert.Equal(t, float64(2*len(digits)), queued, "every request's queue wait is counted once")

	// So do Triton's statistics.
	resp, err = http.Get(p.base + "/v2/models/digits/stats")
	require.NoError(t, err)
	defer resp.Body.Close()
	type duration struct{ Count, Ns uint64 }
	var ts struct {
		ModelStats []struct {
			Name           string
			InferenceCount uint64 `json:"inference_count"`
			ExecutionCount uint64 `json:"execution_count"`
			InferenceStats struct {
				Success, Fail, Queue duration
				ComputeInput         duration `json:"compute_input"`
				ComputeInfer         duration `json:"compute_infer"`
				ComputeOutput        duration `json:"compute_output"`
			} `json:"inference_stats"`
			BatchStats []struct {
				BatchSize    uint64   `json:"batch_size"`
				ComputeInfer duration `json:"compute_infer"`
			} `json:"batch_stats"`
		} `json:"model_stats"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&ts))
	require.Len(t, ts.ModelStats, 1)
	ms := ts.ModelStats[0]
	n := uint64(2 * len(digits))
	assert.Equal(t, n, ms.InferenceCount, "a row each")
	assert.Equal(t, uint64(steps), ms.ExecutionCount)
	for what, d := range map[string]duration{"success": ms.InferenceStats.Success, "queue": ms.InferenceStats.Queue,
		"compute_input": ms.InferenceStats.ComputeInput, "compute_infer": ms.InferenceStats.ComputeInfer, "compute_output": ms.InferenceStats.ComputeOutput} {
		assert.Equal(t, n, d.Count, what)
		assert.Positive(t, d.Ns, what)
	}
	assert.Zero(t, ms.InferenceStats.Fail.Count)
	var executions, batchRows uint64
	for _, b := range ms.BatchStats {
		executions += b.ComputeInfer.Count
		batchRows += b.BatchSize * b.ComputeInfer.Count
	}
	assert.Equal(t, ms.ExecutionCount, executions)
	assert.Equal(t, n, batchRows, "the batch sizes add up to the rows")
}

// classifyOne classifies one digit with a single request.
func classifyOne(t *testing.T, base string, d digit) int {
	resp, body := post(t, base+"/v2/models/digits/infer", jsonRequest("x", []digit{d}))
	require.Equal(t, 200, resp.StatusCode, string(body))
	var r inferResponse
	require.NoError(t, json.Unmarshal(body, &r))
	return argmax(r.Outputs[0].Data)
}
