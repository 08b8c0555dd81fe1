// Command generate measures the CPU engine's generation on a
// SmolLM-135M-shaped decoder with random weights (hidden 576, 30 layers,
// 9 heads, 3 KV heads, intermediate 1536): prefill and decode at one
// sequence, aggregate decode at many concurrent streams, and time to
// first token, through the continuous batcher (generation.Loop) the
// server runs. It writes the model into a temporary directory; nothing is
// downloaded.
//
//	go run ./bench/generate [-vocab 49152] [-streams 16] [-prompt 128] [-new 128]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/stepserve/stepserve/bench/internal/benchstat"

	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/internal/randweights"
	"github.com/stepserve/stepserve/models"
)

func main() {
	vocab := flag.Int("vocab", 49152, "vocabulary size (SmolLM's is 49152)")
	streams := flag.Int("streams", 16, "concurrent streams for the aggregate figure")
	prompt := flag.Int("prompt", 128, "prompt tokens at one sequence")
	newTokens := flag.Int("new", 128, "tokens generated per sequence")
	rounds := flag.Int("rounds", 3, "rounds of each measurement (the median is reported)")
	flag.Parse()
	if err := run(*vocab, *streams, *prompt, *newTokens, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "generate:", err)
		os.Exit(1)
	}
}

func run(vocab, streams, promptLen, newTokens, rounds int) error {
	dir, err := os.MkdirTemp("", "stepserve-genbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	tok, err := os.ReadFile("models/testdata/tokenizers/bpe.json")
	if err != nil {
		return fmt.Errorf("run from the repository root: %w", err)
	}
	shape := randweights.SmolLM(vocab)
	folder := filepath.Join(dir, "smollm")
	yaml := fmt.Sprintf("engine: cpu\ngeneration:\n  max_num_seqs: %d\n  max_model_len: 2304\n  max_batch_tokens: 256\n", max(streams, 1)+1)
	if err := randweights.WriteDecoderFolder(folder, randweights.DecoderFolder{Shape: shape, Seed: 1, Tokenizer: tok, ModelYAML: yaml, Generator: "bench/generate"}); err != nil {
		return err
	}
	m, err := models.Load(folder)
	if err != nil {
		return err
	}
	dec, err := cpufallback.Engine{}.LoadDecoder(context.Background(), m)
	if err != nil {
		return err
	}
	defer dec.Close()
	g := m.Config.Generation
	loop, err := generation.NewLoop(g.Loop(), dec)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	loop.Observe = func(step *generation.Step, took time.Duration, st generation.State) {
		chunk := false
		for _, w := range step.Work {
			chunk = chunk || w.End-w.Start > 1
		}
		if chunk {
			chunkSteps.mu.Lock()
			chunkSteps.ends = append(chunkSteps.ends, time.Now())
			chunkSteps.took = append(chunkSteps.took, took)
			chunkSteps.mu.Unlock()
		}
		if os.Getenv("GENBENCH_STEPS") != "" && len(step.Work) > 0 && took > 300*time.Millisecond {
			fmt.Fprintf(os.Stderr, "step: %d works, %d tokens, %v; running %d waiting %d free %d\n", len(step.Work), step.Tokens(), took, st.Running, st.Waiting, st.BlocksFree)
		}
	}
	go loop.Run(ctx)

	cpu := benchstat.CPULine()
	fmt.Printf("CPU engine generation, %s, %d threads (kernels %s)\n", cpu, runtime.NumCPU(), cpufallback.Kernels())
	fmt.Printf("model: SmolLM-135M shape (hidden 576, 30 layers, 9 heads, 3 KV heads, intermediate 1536, vocab %d), float32, random weights\n", vocab)
	fmt.Printf("KV cache: %d bytes a token (float32)\n", m.Config.Decoder.KVBytesPerToken(4))
	var weightBytes int64
	for _, t := range m.Weights.Tensors {
		weightBytes += int64(t.Numel()) * 4
	}
	fmt.Printf("weights: %.1f MiB read per decode step\n\n", float64(weightBytes)/(1<<20))

	// Warm up.
	if _, err := generate(loop, prompts(1, promptLen, vocab, 0), 8); err != nil {
		return err
	}
	var prefill, decode1, agg []float64
	var ttftP50, ttftP99 []float64
	for r := range rounds {
		one, err := generate(loop, prompts(1, promptLen, vocab, 1+10*r), newTokens)
		if err != nil {
			return err
		}
		prefill = append(prefill, float64(promptLen)/one[0].ttft.Seconds())
		decode1 = append(decode1, float64(newTokens-1)/one[0].last.Sub(one[0].first).Seconds())

		began := time.Now()
		mixed := prompts(streams, 0, vocab, 2+10*r) // new prompts each round: nothing cached
		rs, err := generate(loop, mixed, newTokens)
		if err != nil {
			return err
		}
		wall := time.Since(began).Seconds()
		agg = append(agg, float64(streams*newTokens)/wall)
		var ttfts []float64
		for _, r := range rs {
			ttfts = append(ttfts, r.ttft.Seconds())
		}
		slices.Sort(ttfts)
		ttftP50 = append(ttftP50, ttfts[len(ttfts)/2])
		ttftP99 = append(ttftP99, ttfts[len(ttfts)-1])
	}
	fmt.Printf("prefill, one sequence of %d tokens:   %7.1f tokens/s (median of %d: %s)\n", promptLen, benchstat.Median(prefill), rounds, list(prefill))
	fmt.Printf("decode, one sequence:                  %7.1f tokens/s (%s)\n", benchstat.Median(decode1), list(decode1))
	fmt.Printf("decode, %d concurrent streams:         %7.1f tokens/s aggregate (%s; generated tokens over the wall time from their arrival, prefill included), %.1fx one stream\n", streams, benchstat.Median(agg), list(agg), benchstat.Median(agg)/benchstat.Median(decode1))
	fmt.Printf("time to first token, %d streams (prompts 32-256 tokens, arriving together): p50 %.0f ms, max %.0f ms\n",
		streams, 1000*benchstat.Median(ttftP50), 1000*benchstat.Median(ttftP99))

	// Prefix caching: a 512-token system prompt, then another request
	// with the same 512 tokens and a different question.
	var cold, warm []float64
	for r := range rounds {
		system := prompts(1, 512, vocab, 100+r)[0]
		first := append(slices.Clone(system), prompts(1, 16, vocab, 200+r)[0]...)
		second := append(slices.Clone(system), prompts(1, 16, vocab, 300+r)[0]...)
		a, err := generate(loop, [][]int32{first}, 1)
		if err != nil {
			return err
		}
		b, err := generate(loop, [][]int32{second}, 1)
		if err != nil {
			return err
		}
		cold, warm = append(cold, a[0].ttft.Seconds()), append(warm, b[0].ttft.Seconds())
	}
	fmt.Printf("prefix cache, 512-token system prompt + 16: first token %.0f ms cold, %.0f ms with the prefix cached: %.1fx sooner (%s; %s ms)\n",
		1000*benchstat.Median(cold), 1000*benchstat.Median(warm), benchstat.Median(cold)/benchstat.Median(warm), ms(cold), ms(warm))

	// Chunked prefill: the gaps between tokens of 16 running streams,
	// before and while a 2,000-token prompt is prefilled beside them, in
	// steps of at most max_batch_tokens (256) tokens, and the longest of
	// those steps.
	var before, during, chunkStep []float64
	for r := range rounds {
		b, d, c, err := chunked(loop, streams, vocab, r)
		if err != nil {
			return err
		}
		before, during, chunkStep = append(before, b), append(during, d), append(chunkStep, c)
	}
	fmt.Printf("chunked prefill (steps of at most 256 tokens): p99 inter-token gap of %d streams %.0f ms before, %.0f ms while a 2,000-token prompt is prefilled beside them (+%.0f ms); its longest step %.0f ms (%s; %s; %s ms)\n",
		streams, 1000*benchstat.Median(before), 1000*benchstat.Median(during), 1000*(benchstat.Median(during)-benchstat.Median(before)), 1000*benchstat.Median(chunkStep), ms(before), ms(during), ms(chunkStep))
	return nil
}

// chunkSteps records when each step with a prompt chunk ended and how
// long it took.
var chunkSteps struct {
	mu   sync.Mutex
	ends []time.Time
	took []time.Duration
}

// chunked runs streams decoding, sends a 2,000-token prompt once they
// all have tokens, and returns the 99th percentile of the gaps between
// two tokens of any stream before it arrived and while it was prefilled
// (until its first token), and the longest step of its prefill.
func chunked(loop *generation.Loop, streams, vocab, round int) (before, during, step float64, err error) {
	var mu sync.Mutex
	times := make([][]time.Time, streams)
	var wg sync.WaitGroup
	errs := make([]error, streams)
	started := make(chan struct{}, streams)
	for i, p := range prompts(streams, 32, vocab, 400+round) {
		st, e := loop.Generate(context.Background(), generation.Request{Prompt: p, MaxTokens: 160, Sampling: generation.Sampling{Logprobs: -1}})
		if e != nil {
			return 0, 0, 0, e
		}
		wg.Go(func() {
			n := 0
			for {
				ev, ok := st.Next(context.Background())
				if !ok || ev.Last() {
					return
				}
				if ev.Err != nil {
					errs[i] = ev.Err
					return
				}
				mu.Lock()
				times[i] = append(times[i], time.Now())
				mu.Unlock()
				if n++; n == 8 {
					started <- struct{}{}
				}
			}
		})
	}
	for range streams {
		<-started
	}
	arrive := time.Now()
	long, e := generate(loop, prompts(1, 2000, vocab, 500+round), 1)
	if e != nil {
		return 0, 0, 0, e
	}
	firstToken := arrive.Add(long[0].ttft)
	wg.Wait()
	chunkSteps.mu.Lock()
	for i, end := range chunkSteps.ends {
		if end.After(arrive) && !end.After(firstToken.Add(time.Millisecond)) {
			step = max(step, chunkSteps.took[i].Seconds())
		}
	}
	chunkSteps.ends, chunkSteps.took = nil, nil
	chunkSteps.mu.Unlock()
	for _, e := range errs {
		if e != nil {
			return 0, 0, 0, e
		}
	}
	var gapsBefore, gapsDuring []float64
	for _, ts := range times {
		for k := 1; k < len(ts); k++ {
			gap := ts[k].Sub(ts[k-1]).Seconds()
			switch {
			case ts[k].Before(arrive):
				gapsBefore = append(gapsBefore, gap)
			case ts[k-1].Before(firstToken):
				gapsDuring = append(gapsDuring, gap)
			}
		}
	}
	return p99(gapsBefore), p99(gapsDuring), step, nil
}

type result struct {
	ttft        time.Duration
	first, last time.Time
}

// prompts are n prompts of length tokens each (0: mixed, 32 to 256).
func prompts(n, length, vocab, seed int) [][]int32 {
	out := make([][]int32, n)
	for i := range out {
		l := length
		if l == 0 {
			l = 32 + (i*97)%225
		}
		p := make([]int32, l)
		for j := range p {
			p[j] = int32((seed*7919 + i*131 + j*37 + 11) % vocab)
		}
		out[i] = p
	}
	return out
}

func generate(loop *generation.Loop, ps [][]int32, n int) ([]result, error) {
	out := make([]result, len(ps))
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() {
			start := time.Now()
			st, err := loop.Generate(context.Background(), generation.Request{Prompt: p, MaxTokens: n, Sampling: generation.Sampling{Logprobs: -1}})
			if err != nil {
				errs[i] = err
				return
			}
			for k := 0; ; k++ {
				ev, ok := st.Next(context.Background())
				if !ok {
					return
				}
				if ev.Err != nil {
					errs[i] = ev.Err
					return
				}
				if ev.Last() {
					return
				}
				now := time.Now()
				if k == 0 {
					out[i].ttft, out[i].first = now.Sub(start), now
				}
				out[i].last = now
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func p99(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(len(s)-1, int(0.99*float64(len(s))))]
}

// ms lists seconds as milliseconds.
func ms(v []float64) string {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = 1000 * x
	}
	return list(out)
}

func list(v []float64) string {
	out := ""
	for i, x := range v {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf("%.1f", x)
	}
	return out
}
