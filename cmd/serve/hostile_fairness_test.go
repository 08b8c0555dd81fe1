package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// largeRows is the rows of the large requests below: ten steps of
// tiny-encoder's largest bucket (64 rows of 128 tokens), a few seconds of
// CPU.
const largeRows = 640

// largeEmbedBody is one tiny-encoder request of largeRows texts that each
// fill the longest sequence bucket; extra is added to its "parameters".
func largeEmbedBody(t *testing.T, extra map[string]any) []byte {
	text := strings.Repeat("serving embedding models on the device is quick ", 20)
	data := make([]string, largeRows)
	for i := range data {
		data[i] = text
	}
	r := map[string]any{"inputs": []map[string]any{{"name": "text", "datatype": "BYTES", "shape": []int{largeRows}, "data": data}}}
	if extra != nil {
		r["parameters"] = extra
	}
	b, err := json.Marshal(r)
	require.NoError(t, err)
	return b
}

// sendLarge posts body to tiny-encoder under ctx and reports the status
// (0 when the client gave up) on the returned channel.
func sendLarge(ctx context.Context, base string, body []byte) <-chan int {
	out := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v2/models/tiny-encoder/infer", strings.NewReader(string(body)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out <- resp.StatusCode
	}()
	return out
}

// encoderSteps is how many steps tiny-encoder has run.
func encoderSteps(t *testing.T, base string) float64 {
	return metricSum(t, scrape(t, base), "stepserve_steps_total", `model="tiny-encoder"`)
}

// settle waits until tiny-encoder has run no step for a few scrapes in a
// row (bounded), and returns the steps and the process's CPU seconds then.
func settle(t *testing.T, base string) (steps, cpu float64) {
	last, still := -1.0, 0
	for range 200 {
		m := scrape(t, base)
		steps, cpu = metricSum(t, m, "stepserve_steps_total", `model="tiny-encoder"`), metricSum(t, m, "process_cpu_seconds_total")
		if steps == last {
			if still++; still == 3 {
				return steps, cpu
			}
		} else {
			last, still = steps, 0
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("tiny-encoder kept running steps")
	return 0, 0
}

// TestLargeRequestDoesNotHoldTheModel: a request that spans many steps
// yields between them, so a small request sent after it is answered before
// it finishes; and one whose client disconnects, or whose deadline passes,
// stops at the next step, is counted cancelled or timeout, and leaves the
// server's CPU idle.
func TestLargeRequestDoesNotHoldTheModel(t *testing.T) {
	p := startCapped(t, hostileMemoryCap, "--model_repository", hostileRepo(t))
	body := largeEmbedBody(t, nil)
	embed(t, p.base, "warm up the response path")
	rss0 := p.rss(t)
	outcomes := func() (cancelled, timeout, success float64) {
		m := scrape(t, p.base)
		return metricSum(t, m, "stepserve_requests_total", `model="tiny-encoder"`, `outcome="cancelled"`),
			metricSum(t, m, "stepserve_requests_total", `model="tiny-encoder"`, `outcome="timeout"`),
			metricSum(t, m, "stepserve_requests_total", `model="tiny-encoder"`, `outcome="success"`)
	}

	// A small request sent while the large one runs is answered first.
	steps0, cpu0 := settle(t, p.base)
	start := time.Now()
	large := sendLarge(context.Background(), p.base, body)
	require.Eventually(t, func() bool { return encoderSteps(t, p.base) > steps0 }, 30*time.Second, 10*time.Millisecond,
		"the large request started")
	atSmall := encoderSteps(t, p.base)
	sent := time.Now()
	embed(t, p.base, "The water is warm.")
	waited := time.Since(sent)
	answered := encoderSteps(t, p.base)
	largeDone := false
	select {
	case status := <-large:
		largeDone = true
		assert.Equal(t, 200, status)
	default:
	}
	assert.False(t, largeDone, "the small request was answered only after the large one finished")
	t.Logf("small request sent after %v steps of the large one, answered after %v (in %v)", atSmall-steps0, answered-steps0, waited.Round(time.Millisecond))
	if !largeDone {
		assert.Equal(t, 200, <-large)
	}
	wall := time.Since(start)
	stepsFull, cpu1 := settle(t, p.base)
	fullCPU := cpu1 - cpu0
	rss1 := p.rss(t)
	t.Logf("the large request: %v steps, %.2f CPU-seconds, %v", stepsFull-steps0, fullCPU, wall.Round(time.Millisecond))
	require.Greater(t, fullCPU, 0.5, "the large request is worth measuring")
	assert.Less(t, answered, stepsFull, "steps of the large request were left when the small one was answered")

	// A large request whose client disconnects after two steps stops.
	cancelled0, timeout0, success0 := outcomes()
	ctx, cancel := context.WithCancel(context.Background())
	large = sendLarge(ctx, p.base, body)
	require.Eventually(t, func() bool { return encoderSteps(t, p.base) >= stepsFull+2 }, 30*time.Second, 10*time.Millisecond,
		"the large request ran two steps")
	cancel()
	assert.Equal(t, 0, <-large)
	assert.Eventually(t, func() bool { c, _, _ := outcomes(); return c > cancelled0 }, 30*time.Second, 50*time.Millisecond,
		"the disconnected request is counted cancelled")
	stepsCancelled, cpu2 := settle(t, p.base)
	cancelledCPU := cpu2 - cpu1
	c, _, s := outcomes()
	t.Logf("cancelled after two steps: %v steps ran, %.2f CPU-seconds (%.0f%% of the full run); cancelled +%v, success +%v",
		stepsCancelled-stepsFull, cancelledCPU, 100*cancelledCPU/fullCPU, c-cancelled0, s-success0)
	assert.Equal(t, cancelled0+1, c)
	assert.Equal(t, success0, s, "a disconnected request is not a success")
	assert.Less(t, stepsCancelled-stepsFull, (stepsFull-steps0)/2, "its remaining steps did not run")
	assert.Less(t, cancelledCPU, fullCPU/2, "the server stopped working for it")

	// A large request whose deadline passes while it runs is answered 504.
	deadline := wall / 10 // about a step
	large = sendLarge(context.Background(), p.base, largeEmbedBody(t, map[string]any{"timeout": deadline.Microseconds()}))
	assert.Equal(t, 504, <-large)
	stepsTimeout, _ := settle(t, p.base)
	_, to, s := outcomes()
	t.Logf("a %v deadline: %v steps ran; timeout +%v", deadline.Round(time.Millisecond), stepsTimeout-stepsCancelled, to-timeout0)
	assert.Equal(t, timeout0+1, to)
	assert.Equal(t, success0, s)
	assert.Less(t, stepsTimeout-stepsCancelled, (stepsFull-steps0)/2, "its remaining steps did not run")

	// Still alive, correct, and its memory back within bounds.
	require.True(t, p.alive())
	d := heldout(t)[0]
	assert.Equal(t, d.label, classifyOne(t, p.base, d))
	embed(t, p.base, "The water is warm.")
	rss := p.rss(t)
	t.Logf("rss %.1f MiB, %.1f MiB after a large request, %.1f MiB at the end", float64(rss0)/(1<<20), float64(rss1)/(1<<20), float64(rss)/(1<<20))
	assert.Less(t, rss1, rss0+256<<20, "a large request's memory is bounded")
	assert.Less(t, rss, rss1+64<<20, "stopped requests leave no memory behind")
}
