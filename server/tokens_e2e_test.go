package server

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// paddedTokens reads, from the padding metric's step counts per bucket,
// the tokens tiny-encoder's steps computed (bucket rows x seq, padding
// included; warm-up is not counted), and the most any step computed.
func paddedTokens(t *testing.T, metrics string) (total, most int) {
	re := regexp.MustCompile(`stepserve_padding_ratio_count\{bucket="b(\d+)xs(\d+)",model="tiny-encoder"\} (\d+)`)
	for _, m := range re.FindAllStringSubmatch(metrics, -1) {
		rows, _ := strconv.Atoi(m[1])
		seq, _ := strconv.Atoi(m[2])
		steps, _ := strconv.Atoi(m[3])
		if steps > 0 {
			total += steps * rows * seq
			most = max(most, rows*seq)
		}
	}
	return total, most
}

// One long document and 63 short queries, sent at once through
// /v1/embeddings: without max_batch_tokens they run as one step padded to
// the document's length (64x128); with it, no step pads more than the
// budget, the padded tokens fall, and the requests the budget deferred are
// counted. Every request is answered, with the vectors it gets alone.
func TestMaxBatchTokensEndToEnd(t *testing.T) {
	long := strings.Repeat("a long document about nothing at all ", 12)
	texts := []string{long}
	for i := range 63 {
		texts = append(texts, fmt.Sprintf("query %d", i))
	}
	run := func(budget int) (total, most int, deferrals string) {
		batching := "batching: {max_queue_delay: 1s}\n"
		if budget > 0 {
			batching = fmt.Sprintf("batching: {max_queue_delay: 1s, max_batch_tokens: %d}\n", budget)
		}
		fx := newTextFixture(t, textOptions{onlyTiny: true, tinyBatch: batching})
		got := make([][]float32, len(texts))
		var wg sync.WaitGroup
		for i, text := range texts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, b := fx.post(t, "/v1/embeddings", map[string]any{"input": text, "model": "tiny-encoder"})
				if !assert.Equal(t, 200, st, string(b)) {
					return
				}
				var resp openaiEmbeddingsResponse
				decodeStrict(t, b, &resp)
				got[i] = floats(t, resp.Data[0].Embedding)
			}()
		}
		wg.Wait()
		m := fx.metrics(t)
		total, most = paddedTokens(t, m)
		d := regexp.MustCompile(`stepserve_batch_token_deferrals_total\{model="tiny-encoder"\} (\d+)`).FindStringSubmatch(m)
		require.NotNil(t, d, "the deferral counter")
		want := fx.oipEmbeddings(t, "tiny-encoder", texts)
		for i := range texts {
			require.Len(t, got[i], len(want[i]), "text %d", i)
			for k := range got[i] {
				assert.InDelta(t, want[i][k], got[i][k], 1e-5, "text %d element %d", i, k)
			}
		}
		return total, most, d[1]
	}
	total, most, deferrals := run(0)
	assert.Equal(t, 64*128, total, "one step, padded to the document")
	assert.Equal(t, 64*128, most)
	assert.Equal(t, "0", deferrals)

	const budget = 16 * 128
	bTotal, bMost, bDeferrals := run(budget)
	t.Logf("padded tokens: %d without max_batch_tokens, %d with %d (largest step %d)", total, bTotal, budget, bMost)
	assert.LessOrEqual(t, bMost, budget, "no step pads past the budget")
	assert.Less(t, bTotal, total, "fewer padded tokens")
	assert.NotEqual(t, "0", bDeferrals, "the budget deferred requests")
}
