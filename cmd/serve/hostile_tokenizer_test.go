package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hundredLetterWords is about n bytes of text: words of 100 random
// lowercase letters, which WordPiece must split letter by letter against
// the tiny vocabulary, the most work a word under BERT's 100-character
// limit can ask for.
func hundredLetterWords(n int) string {
	r := rand.New(rand.NewPCG(13, 13))
	var b strings.Builder
	b.Grow(n + 101)
	for b.Len() < n {
		for range 100 {
			b.WriteByte(byte('a' + r.IntN(26)))
		}
		b.WriteByte(' ')
	}
	return b.String()
}

// encoderVariant copies tiny-encoder in repo to a model named name, with its
// truncate: true replaced, and one-row steps only: the variants take one
// text at a time, and their staging stays out of the server's memory.
func encoderVariant(t *testing.T, repo, name, replacement string) {
	dir := filepath.Join(repo, name)
	require.NoError(t, os.CopyFS(dir, os.DirFS(filepath.Join(repo, "tiny-encoder"))))
	yaml, err := os.ReadFile(filepath.Join(dir, "model.yaml"))
	require.NoError(t, err)
	require.Contains(t, string(yaml), "truncate: true")
	require.Contains(t, string(yaml), "batch: [1, 4, 16, 64]")
	yaml = []byte(strings.NewReplacer("truncate: true", replacement, "batch: [1, 4, 16, 64]", "batch: [1]").Replace(string(yaml)))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.yaml"), yaml, 0o644))
}

// TestHostileTokenizerText sends 10 MB of 100-letter words as one text to
// an encoder that truncates (tiny-encoder) and to one that does not
// (strict, tiny-encoder with encoder.truncate: false): the first embeds
// the first 128 tokens, the second refuses the text by its byte length
// before tokenizing it. Neither tokenizes 10 MB, so the server answers
// within its CPU and memory budget, stays up and embeds normal text as
// before. In a soak run, a third encoder (counted) takes texts up to
// 16 MiB without truncating: it tokenizes all 10 MB, in time linear in
// the text and memory bounded by the largest bucket, to count the tokens
// it refuses.
func TestHostileTokenizerText(t *testing.T) {
	repo := hostileRepo(t)
	encoderVariant(t, repo, "strict", "truncate: false")
	encoderVariant(t, repo, "counted", "truncate: false\n  max_text_bytes: 16777216")

	p := startCapped(t, hostileMemoryCap, "--model_repository", repo, "--server.max_body_bytes", "16MiB")
	const normal = "The water is warm."
	want := embed(t, p.base, normal)[0]
	rssBefore := p.rss(t)

	text := hundredLetterWords(10 << 20)
	body, err := json.Marshal(map[string]any{"inputs": []map[string]any{{"name": "text", "datatype": "BYTES", "shape": []int{1}, "data": []string{text}}}})
	require.NoError(t, err)
	type hostileText struct {
		model  string
		status int
		want   string
	}
	cases := []hostileText{
		{"tiny-encoder", 200, `"shape":[1,128]`},
		{"strict", 400, fmt.Sprintf(`input \"text\": element 0 is %d bytes, more than the %d of encoder.max_text_bytes (by default 32 bytes per token of the largest seq bucket); shorten it, raise encoder.max_text_bytes, or set encoder.truncate: true`, len(text), 32*128)},
	}
	if soak() {
		cases = append(cases, hostileText{"counted", 400, "text is longer than the largest sequence bucket: "})
	}
	for _, tc := range cases {
		cpu := metricSum(t, scrape(t, p.base), "process_cpu_seconds_total")
		began := time.Now()
		resp, out := post(t, p.base+"/v2/models/"+tc.model+"/infer", body)
		took := time.Since(began)
		cpu = metricSum(t, scrape(t, p.base), "process_cpu_seconds_total") - cpu
		t.Logf("%s: %d in %v, %.2f CPU-seconds, peak RSS %.0f MiB", tc.model, resp.StatusCode, took.Round(time.Millisecond), cpu, float64(p.peakRSS(t))/(1<<20))
		assert.Equal(t, tc.status, resp.StatusCode, "%s: %.300s", tc.model, out)
		assert.Contains(t, string(out), tc.want, tc.model)
		require.True(t, p.alive())
		assert.Less(t, p.peakRSS(t), int64(256<<20), "peak RSS: the text is tokenized up to the largest bucket, not kept as tokens")
	}

	assert.Equal(t, want, embed(t, p.base, normal)[0], "normal text embeds as before")
	rss := p.rss(t)
	t.Logf("rss %.0f MiB before, %.0f MiB after", float64(rssBefore)/(1<<20), float64(rss)/(1<<20))
	assert.Less(t, rss, rssBefore+128<<20, "the 10 MB text leaves no tokens behind")
}
