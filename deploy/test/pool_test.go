package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The pool: tiny-llama servers of one CPU thread each, 4 sequences at a
// time (so a burst queues) and the shipped 128 blocks of 16 tokens, which
// hold about four of the workload's system prompts besides the running
// sequences: a server that sees every prompt evicts some.
const (
	poolServers  = 3
	poolMaxSeqs  = 4
	poolKVBlocks = 128
)

// The workload: bursts of chat requests, each opening with one of a few
// shared system prompts (about 400 tokens each, 25 blocks) drawn with
// Zipf popularity, then a user turn of its own.
const (
	benchSeed        = 50
	benchPrompts     = 8
	benchZipfS       = 1.2
	benchBursts      = 40
	benchBurstSize   = 12
	benchBurstGap    = 200 * time.Millisecond // between bursts
	benchArrivalMean = 3 * time.Millisecond   // between requests of a burst
	benchMaxTokens   = 24
	benchRounds      = 3
)

// poolRepository is the model repository each server of the pool loads.
func poolRepository(t *testing.T, maxSeqs int) string {
	return repository(t, func(name, yaml string) string {
		if name != "tiny-llama" {
			return yaml
		}
		yaml = strings.Replace(yaml, "max_num_seqs: 16", "max_num_seqs: "+strconv.Itoa(maxSeqs), 1)
		return strings.Replace(yaml, "kv_cache_blocks: 128", fmt.Sprintf("kv_cache_blocks: %d\n  block_size: 16", poolKVBlocks), 1)
	})
}

func startPool(t *testing.T, maxSeqs int) []*server {
	repo := poolRepository(t, maxSeqs)
	servers := make([]*server, poolServers)
	for i := range servers {
		servers[i] = startServer(t, "--model_repository", repo, "--engine.cpu_threads", "1")
	}
	return servers
}

// systemPrompt is shared prompt k: its first characters differ from every
// other's, so two prompts share no KV block.
func systemPrompt(k int) string {
	r := rand.New(rand.NewSource(int64(1000 + k)))
	words := []string{"answer", "politely", "cite", "sources", "never", "guess", "tables", "briefly", "customer", "refund",
		"policy", "escalate", "summarize", "ticket", "account", "billing"}
	var b strings.Builder
	fmt.Fprintf(&b, "You are assistant %d of the support desk.", k)
	for b.Len() < 560 {
		b.WriteString(" " + words[r.Intn(len(words))])
	}
	return b.String()
}

func chatBody(system, user string, maxTokens int) []byte {
	body, _ := json.Marshal(map[string]any{"model": "tiny-llama", "stream": true, "max_tokens": maxTokens,
		"ignore_eos": true, "temperature": 0, "messages": []map[string]string{
			{"role": "system", "content": system}, {"role": "user", "content": user}}})
	return body
}

var poolClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// stream sends a streamed chat request and reads it to its end. ttft is
// the time from start to the first chunk that carries text.
func stream(ctx context.Context, s *server, body []byte, start time.Time) (ttft time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, "POST", s.base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := poolClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("%d %s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" || ttft != 0 {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct{ Content string }
			}
		}
		if json.Unmarshal([]byte(data), &chunk) == nil && len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Content != "" {
			ttft = time.Since(start)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if ttft == 0 {
		return 0, fmt.Errorf("no text in the stream")
	}
	return ttft, nil
}

// prefixCounters sums the pool's prefix-cache counters: prompt tokens
// looked up and those the cache held.
func prefixCounters(t *testing.T, servers []*server) (hits, queries float64) {
	for _, s := range servers {
		parser := expfmt.NewTextParser(model.LegacyValidation)
		families, err := parser.TextToMetricFamilies(strings.NewReader(s.get(t, "/metrics")))
		require.NoError(t, err)
		for _, m := range families["vllm:prefix_cache_hits_total"].GetMetric() {
			hits += m.GetCounter().GetValue()
		}
		for _, m := range families["vllm:prefix_cache_queries_total"].GetMetric() {
			queries += m.GetCounter().GetValue()
		}
	}
	return hits, queries
}

// arrival is one request of the workload, at an offset from the start.
type arrival struct {
	at   time.Duration
	body []byte
}

// workload is the benchmark's request stream, the same for every policy.
func workload() []arrival {
	r := rand.New(rand.NewSource(benchSeed))
	zipf := rand.NewZipf(r, benchZipfS, 1, benchPrompts-1)
	systems := make([]string, benchPrompts)
	for k := range systems {
		systems[k] = systemPrompt(k)
	}
	var out []arrival
	var at time.Duration
	for b := range benchBursts {
		for i := range benchBurstSize {
			at += time.Duration(r.ExpFloat64() * float64(benchArrivalMean))
			user := fmt.Sprintf("Burst %d, customer %d: my order %d arrived late, what now?", b, i, r.Intn(100000))
			out = append(out, arrival{at: at, body: chatBody(systems[zipf.Uint64()], user, benchMaxTokens)})
		}
		at += benchBurstGap
	}
	return out
}

// result is one policy's run, or several runs merged.
type result struct {
	policy        string
	ttfts, routes []time.Duration
	errors        int
	hits, queries float64 // prefix-cache tokens over the run
	perServer     []int
	wall          time.Duration
}

// runWorkload sends the workload to the pool, each request where r
// routes it when it arrives, and measures.
func runWorkload(t *testing.T, policy string, servers []*server, r router, load []arrival) result {
	ctx := context.Background()
	hits0, queries0 := prefixCounters(t, servers)
	res := result{policy: policy, perServer: make([]int, len(servers))}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for i, a := range load {
		time.Sleep(time.Until(start.Add(a.at)))
		wg.Go(func() {
			arrived := time.Now()
			idx, err := r.route(ctx, fmt.Sprintf("req-%d", i), a.body)
			routed := time.Since(arrived)
			var ttft time.Duration
			if err == nil {
				ttft, err = stream(ctx, servers[idx], a.body, arrived)
			}
			mu.Lock()
			defer mu.Unlock()
			res.routes = append(res.routes, routed)
			if err != nil {
				res.errors++
				t.Logf("%s request %d: %v", policy, i, err)
				return
			}
			res.perServer[idx]++
			res.ttfts = append(res.ttfts, ttft)
		})
	}
	wg.Wait()
	res.wall = time.Since(start)
	hits, queries := prefixCounters(t, servers)
	res.hits, res.queries = hits-hits0, queries-queries0
	return res
}

// merge adds run o to r.
func (r result) merge(o result) result {
	r.ttfts = append(slices.Clone(r.ttfts), o.ttfts...)
	r.routes = append(slices.Clone(r.routes), o.routes...)
	r.errors += o.errors
	r.hits += o.hits
	r.queries += o.queries
	r.wall += o.wall
	per := make([]int, len(o.perServer))
	for i := range per {
		per[i] = o.perServer[i]
		if i < len(r.perServer) {
			per[i] += r.perServer[i]
		}
	}
	r.perServer = per
	return r
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))]
}

func (r result) row(label string) string {
	ttfts, routes := slices.Sorted(slices.Values(r.ttfts)), slices.Sorted(slices.Values(r.routes))
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	return fmt.Sprintf("| %s | %s | %d | %d | %s | %s | %.1f%% | %v | %s | %.1f s |", r.policy, label, len(ttfts), r.errors,
		ms(percentile(ttfts, 0.5)), ms(percentile(ttfts, 0.99)), 100*r.hits/r.queries, r.perServer,
		ms(percentile(routes, 0.5)), r.wall.Seconds())
}

// policy is a way to route, built over a pool whose scraper runs.
type policy struct {
	name string
	mk   func(ctx context.Context, s *scraper) (router, error)
}

// runPolicy runs the workload once on a fresh pool (cold prefix caches,
// an empty picker), which the subtest's end stops.
func runPolicy(t *testing.T, p policy, load []arrival) result {
	servers := startPool(t, poolMaxSeqs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Round-robin reads nothing, but its servers answer the same scrapes,
	// so both policies pay for them.
	s, err := newScraper(ctx, servers)
	require.NoError(t, err)
	r, err := p.mk(ctx, s)
	require.NoError(t, err)
	return runWorkload(t, p.name, servers, r, load)
}

// TestPoolBenchmark (issue 50, item 3): one skewed chat workload on a pool
// of three stepservers, routed round-robin and by GAIE's endpoint picker
// (its scheduler with the default profile, fed by its metrics client), in
// benchRounds rounds whose order alternates, each run on a fresh pool so
// every run starts with cold prefix caches. It prints time to first token
// and the pool's prefix-cache hit rate side by side, per run and over all
// runs; it asserts no timing. POOL_BENCH=1 runs it (make
// bench-pool); POOL_BENCH_OUT names a file for the table.
func TestPoolBenchmark(t *testing.T) {
	if os.Getenv("POOL_BENCH") != "1" {
		t.Skip("POOL_BENCH=1 runs the pool benchmark (make bench-pool)")
	}
	load := workload()
	policies := []policy{
		{"round-robin", func(context.Context, *scraper) (router, error) { return &roundRobin{n: poolServers}, nil }},
		{"GAIE scheduler", func(ctx context.Context, s *scraper) (router, error) { return newGAIEPicker(ctx, s) }},
	}
	var rows []string
	all := make([]result, len(policies))
	for round := range benchRounds {
		for j := range policies {
			// Alternate which policy goes first, so neither always runs
			// on a machine the other has just warmed (or heated).
			i := (j + round) % len(policies)
			t.Run(fmt.Sprintf("%s/%d", policies[i].name, round+1), func(t *testing.T) {
				res := runPolicy(t, policies[i], load)
				rows = append(rows, res.row(fmt.Sprintf("run %d", round+1)))
				all[i] = all[i].merge(res)
				all[i].policy = res.policy
			})
		}
	}
	for _, r := range all {
		rows = append(rows, r.row("all runs"))
	}
	table := strings.Join(append([]string{
		fmt.Sprintf("%d servers (tiny-llama, 1 CPU thread each, max_num_seqs %d, %d KV blocks of 16 tokens); %d requests a run in %d bursts of %d (%v apart, %v mean gap within); %d system prompts of ~400 tokens drawn Zipf s=%.1f (the most popular: %.0f%% of requests); %d output tokens; seed %d; GAIE weights queue %d, kv-cache %d, prefix %d; scrape every %v",
			poolServers, poolMaxSeqs, poolKVBlocks, len(load), benchBursts, benchBurstSize, benchBurstGap, benchArrivalMean,
			benchPrompts, benchZipfS, 100*topShare(load), benchMaxTokens, benchSeed,
			queueScorerWeight, kvCacheScorerWeight, prefixScorerWeight, eppRefresh),
		"",
		"| policy | run | requests | errors | p50 TTFT | p99 TTFT | prefix-cache hit rate | requests per server | p50 routing | wall |",
		"|---|---|---|---|---|---|---|---|---|---|",
	}, rows...), "\n")
	t.Log("\n" + table)
	if out := os.Getenv("POOL_BENCH_OUT"); out != "" {
		require.NoError(t, os.WriteFile(out, []byte(table+"\n"), 0o644))
	}
}

// topShare is the share of the workload's requests that open with its
// most popular system prompt.
func topShare(load []arrival) float64 {
	counts := map[string]int{}
	for _, a := range load {
		var body struct{ Messages []struct{ Content string } }
		json.Unmarshal(a.body, &body)
		counts[body.Messages[0].Content]++
	}
	top := 0
	for _, c := range counts {
		top = max(top, c)
	}
	return float64(top) / float64(len(load))
}

// The GAIE-driven picker reads the pool's real state: with one server's
// queue long (max_num_seqs 1 and a dozen long generations sent to it
// directly) it routes new requests elsewhere, and a request whose system
// prompt was routed before goes where that one went.
func TestPoolPickerFollowsQueueAndPrefix(t *testing.T) {
	servers := startPool(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := newScraper(ctx, servers)
	require.NoError(t, err)
	g, err := newGAIEPicker(ctx, s)
	require.NoError(t, err)
	t.Log("GAIE's scheduler: ", g.config)
	for scorer, weight := range map[string]int{"queue-scorer": queueScorerWeight,
		"kv-cache-utilization-scorer": kvCacheScorerWeight, "prefix-cache-scorer": prefixScorerWeight} {
		assert.Contains(t, g.config, fmt.Sprintf("%s/%s: %d.000000", scorer, scorer, weight))
	}

	for i := range 12 {
		go stream(ctx, servers[0], chatBody("busy", fmt.Sprintf("long %d", i), 900), time.Now())
	}
	require.Eventually(t, func() bool { return s.metrics(0).WaitingQueueSize >= 4 }, 20*time.Second, 10*time.Millisecond,
		"the scraper never saw server 0's queue")

	for k := range 4 {
		idx, err := g.route(ctx, fmt.Sprintf("away-%d", k), chatBody(systemPrompt(k), "hello", 4))
		require.NoError(t, err)
		assert.NotEqual(t, 0, idx, "request %d went to the server with %d waiting", k, s.metrics(0).WaitingQueueSize)
	}

	first, err := g.route(ctx, "affinity-0", chatBody(systemPrompt(7), "first question", 4))
	require.NoError(t, err)
	_, err = stream(ctx, servers[first], chatBody(systemPrompt(7), "first question", 4), time.Now())
	require.NoError(t, err)
	for k := range 3 {
		// The producer records a routed prefix asynchronously, as in EPP.
		time.Sleep(20 * time.Millisecond)
		idx, err := g.route(ctx, fmt.Sprintf("affinity-%d", k+1), chatBody(systemPrompt(7), fmt.Sprintf("question %d", k), 4))
		require.NoError(t, err)
		assert.Equal(t, first, idx, "a request sharing a routed system prompt")
	}
}
