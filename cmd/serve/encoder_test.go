package main

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sentences of many lengths: from a few tokens to past the 64 seq bucket.
func sentences() []string {
	base := strings.Fields("the water is warm and the children play near the river while their mother reads a book about the sea and the mountain")
	var out []string
	for n := 1; n <= len(base); n += 2 {
		out = append(out, strings.Join(base[:n], " ")+".")
	}
	out = append(out, strings.Repeat("serving embedding models on the device is quick ", 7)) // > 64 tokens
	return out
}

func embed(t *testing.T, base string, texts ...string) [][]float32 {
	body, _ := json.Marshal(map[string]any{"inputs": []map[string]any{{"name": "text", "datatype": "BYTES", "shape": []int{len(texts)}, "data": texts}}})
	resp, out := post(t, base+"/v2/models/tiny-encoder/infer", body)
	require.Equal(t, 200, resp.StatusCode, string(out))
	var r inferResponse
	require.NoError(t, json.Unmarshal(out, &r))
	require.Equal(t, []int{len(texts), 128}, r.Outputs[0].Shape)
	var rows [][]float32
	for i := range texts {
		rows = append(rows, r.Outputs[0].Data[i*128:(i+1)*128])
	}
	return rows
}

func TestEncoderTextBatchedIn2DBuckets(t *testing.T) {
	p := start(t, "--batching.max_queue_delay", "5ms")
	texts := sentences()
	alone := make([][]float32, len(texts))
	for i, s := range texts {
		alone[i] = embed(t, p.base, s)[0]
		var norm float64
		for _, v := range alone[i] {
			norm += float64(v) * float64(v)
		}
		require.InDelta(t, 1, norm, 1e-4, "normalize: true gives unit vectors")
	}
	before := scrape(t, p.base)

	// 8 concurrent clients, each sending every sentence, in its own order.
	var wg sync.WaitGroup
	var mu sync.Mutex
	worst := 0.0
	for c := range 8 {
		wg.Go(func() {
			for k := range texts {
				i := (k*5 + c) % len(texts)
				got := embed(t, p.base, texts[i])[0]
				mu.Lock()
				for j := range got {
					worst = math.Max(worst, math.Abs(float64(got[j]-alone[i][j])))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("max abs difference batched vs one by one: %.2e", worst)
	assert.Less(t, worst, 1e-5)

	m := scrape(t, p.base)
	steps := metricSum(t, m, "stepserve_steps_total", `model="tiny-encoder"`) - metricSum(t, before, "stepserve_steps_total", `model="tiny-encoder"`)
	rows := metricSum(t, m, "stepserve_batch_size_sum", `model="tiny-encoder"`) - metricSum(t, before, "stepserve_batch_size_sum", `model="tiny-encoder"`)
	require.Equal(t, float64(8*len(texts)), rows)
	t.Logf("%d requests in %.0f steps", 8*len(texts), steps)
	assert.Less(t, steps, rows, "concurrent requests share steps")
	multi := 0.0
	for _, b := range []string{"b4xs32", "b4xs64", "b4xs128", "b16xs32", "b16xs64", "b16xs128"} {
		multi += metricSum(t, m, "stepserve_steps_total", `model="tiny-encoder"`, fmt.Sprintf(`bucket="%s"`, b))
	}
	assert.Greater(t, multi, 0.0, "some steps ran in multi-row buckets")
	assert.Greater(t, metricSum(t, m, "stepserve_steps_total", `model="tiny-encoder"`, `bucket="b1xs128"`)+metricSum(t, m, "stepserve_steps_total", `model="tiny-encoder"`, `bucket="b4xs128"`)+metricSum(t, m, "stepserve_steps_total", `model="tiny-encoder"`, `bucket="b16xs128"`), 0.0, "the long sentence used the 128 bucket")
	assert.Equal(t, metricSum(t, m, "stepserve_steps_total", `model="tiny-encoder"`), metricSum(t, m, "stepserve_steps_total", `model="tiny-encoder"`, `verdict="clean"`))
	assert.Greater(t, metricSum(t, m, "stepserve_padding_ratio_sum", `model="tiny-encoder"`), 0.0, "padding over both dimensions is measured")

	// Several texts in one request: the same embeddings as alone.
	batch := embed(t, p.base, texts[0], texts[len(texts)-1], texts[3])
	for k, i := range []int{0, len(texts) - 1, 3} {
		for j := range batch[k] {
			require.InDelta(t, alone[i][j], batch[k][j], 1e-5)
		}
	}
}
