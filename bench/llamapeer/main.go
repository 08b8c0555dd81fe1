// Command llamapeer measures stepserve's generation against llama.cpp on
// the same decoder, weights and token ids, in one run with interleaved
// rounds, and prints the table of issue 31: prompt and decode tokens per
// second at one sequence, aggregate decode at many streams, time to first
// token, and the ratio of each.
//
// The decoder is SmolLM-135M-shaped with random weights (hidden 576, 30
// layers, 9 heads, 3 KV heads, intermediate 1536, vocab 8192), written as
// a Hugging Face folder that stepserve serves as it is and converted by
// bench/gguf for llama.cpp (float32, and float16 for the bfloat16 row).
// llama.cpp is node-llama-cpp's prebuilt CPU build from npm
// (bench/llama/package-lock.json), run by bench/llama/llama.js; stepserve
// is the server binary on a loopback port, asked over /v1/completions with
// token-id prompts, greedy, ignore_eos, streamed.
//
// Before anything is timed the greedy continuations are compared: stepserve
// float32, llama.cpp float32 and a hand-written PyTorch forward must give
// the same token ids.
//
//	make bench-llama
//	go run ./bench/llamapeer -rounds 3 -server bin/stepserve
package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/stepserve/stepserve/bench/internal/benchstat"
	"github.com/stepserve/stepserve/internal/randweights"
)

var (
	dir       = flag.String("dir", "bench/out/llama", "where the model folders and GGUF files are written")
	python    = flag.String("python", "/usr/bin/python3", "the Python with Debian's torch, for the reference")
	nodeBin   = flag.String("node", "node", "node, to run bench/llama/llama.js")
	server    = flag.String("server", "bin/stepserve", "the stepserve binary")
	rounds    = flag.Int("rounds", 3, "interleaved rounds")
	promptLen = flag.Int("prompt", 128, "prompt tokens")
	newTokens = flag.Int("new", 128, "tokens generated per sequence")
	streams   = flag.Int("streams", 16, "stepserve's concurrent streams")
	peerSeqs  = flag.Int("peer-seqs", 8, "llama.cpp's sequences on one context")
	threads   = flag.Int("threads", 0, "threads on each side (0: every CPU)")
	check     = flag.Int("check", 32, "greedy tokens compared before timing")
	vocab     = flag.Int("vocab", 8192, "vocabulary size")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "llamapeer:", err)
		os.Exit(1)
	}
}

var shape = randweights.Decoder{Arch: "LlamaForCausalLM", Hidden: 576, Layers: 30, Heads: 9, KVHeads: 3, Inter: 1536,
	MaxPosition: 8192, RopeTheta: 10000, Tied: true, BOS: 1, EOS: 2}

func run() error {
	if *threads == 0 {
		*threads = runtime.NumCPU()
	}
	shape.Vocab = *vocab
	repo := filepath.Join(*dir, "repo")
	m, err := prepare(repo)
	if err != nil {
		return err
	}
	fmt.Printf("Generation: stepserve's CPU engine vs llama.cpp (node-llama-cpp %s), %s, %d threads each\n", peerVersion(), benchstat.CPULine(), *threads)
	fmt.Printf("model: SmolLM-135M shape (hidden 576, 30 layers, 9 heads, 3 KV heads, intermediate 1536, vocab %d), random weights, tied embeddings\n", *vocab)
	weights := int64(0)
	for _, t := range m.Weights.Tensors {
		weights += int64(t.Numel())
	}
	bw := readBandwidth(*threads)
	fmt.Printf("weights: %d parameters; a decode step reads %.1f MB (float32) or %.1f MB (bfloat16/float16) of them; memory read bandwidth measured now: %.1f GB/s\n",
		weights, float64(4*weights)/1e6, float64(2*weights)/1e6, bw/1e9)
	fmt.Printf("prompt %d tokens, %d new tokens, greedy; %d rounds, interleaved\n\n", *promptLen, *newTokens, *rounds)

	srv, err := startServer(*server, repo, *threads)
	if err != nil {
		return err
	}
	defer srv.stop()
	f32, err := startPeer(filepath.Join(*dir, "smollm-f32.gguf"), *threads, *peerSeqs)
	if err != nil {
		return err
	}
	defer f32.stop()
	f16, err := startPeer(filepath.Join(*dir, "smollm-f16.gguf"), *threads, *peerSeqs)
	if err != nil {
		return err
	}
	defer f16.stop()

	if err := agree(srv, f32, f16, m); err != nil {
		return err
	}

	type row struct {
		name       string
		ours, peer []float64
		unit       string
	}
	rows := []*row{
		{name: "prefill, one sequence (f32)", unit: "tokens/s"},
		{name: "decode, one sequence (f32)", unit: "tokens/s"},
		{name: "prefill, one sequence (bf16 vs f16)", unit: "tokens/s"},
		{name: "decode, one sequence (bf16 vs f16)", unit: "tokens/s"},
		{name: fmt.Sprintf("decode, %d streams vs %d sequences (f32)", *streams, *peerSeqs), unit: "tokens/s"},
		{name: fmt.Sprintf("decode, %d streams vs %d sequences (bf16 vs f16)", *streams, *peerSeqs), unit: "tokens/s"},
	}
	var ttft50, ttft99, peer50, peer99 []float64
	warm := prompts(1, *promptLen, 999)
	if _, err := srv.generate("smollm", warm, 4); err != nil {
		return err
	}
	if _, err := srv.generate("smollm-bf16", warm, 4); err != nil {
		return err
	}
	for r := range *rounds {
		one := prompts(1, *promptLen, 10+r)
		for i, side := range []struct {
			model string
			peer  *peer
		}{{"smollm", f32}, {"smollm-bf16", f16}} {
			p, err := side.peer.generate(one, *newTokens)
			if err != nil {
				return err
			}
			o, err := srv.generate(side.model, one, *newTokens)
			if err != nil {
				return err
			}
			rows[2*i].peer = append(rows[2*i].peer, p.prefill(*promptLen))
			rows[2*i].ours = append(rows[2*i].ours, o.prefill(*promptLen))
			rows[2*i+1].peer = append(rows[2*i+1].peer, p.decode())
			rows[2*i+1].ours = append(rows[2*i+1].ours, o.decode())
		}
		for i, side := range []struct {
			model string
			peer  *peer
		}{{"smollm", f32}, {"smollm-bf16", f16}} {
			p, err := side.peer.generate(prompts(*peerSeqs, *promptLen, 20+r), *newTokens)
			if err != nil {
				return err
			}
			o, err := srv.generate(side.model, prompts(*streams, *promptLen, 30+r), *newTokens)
			if err != nil {
				return err
			}
			rows[4+i].peer = append(rows[4+i].peer, p.aggregate())
			rows[4+i].ours = append(rows[4+i].ours, o.aggregate())
		}
		// Time to first token, prompts of 32 to 256 tokens arriving
		// together.
		o, err := srv.generate("smollm", mixed(*streams, 40+r), 16)
		if err != nil {
			return err
		}
		p, err := f32.generate(mixed(*peerSeqs, 40+r), 16)
		if err != nil {
			return err
		}
		a, b := o.ttftPercentiles()
		ttft50, ttft99 = append(ttft50, a), append(ttft99, b)
		a, b = p.ttftPercentiles()
		peer50, peer99 = append(peer50, a), append(peer99, b)
	}

	fmt.Printf("%-48s %12s %12s %8s  %s\n", "", "stepserve", "llama.cpp", "ratio", "ratio per round")
	for _, r := range rows {
		ratios := make([]float64, len(r.ours))
		for i := range ratios {
			ratios[i] = r.ours[i] / r.peer[i]
		}
		fmt.Printf("%-48s %12.1f %12.1f %7.2fx  %s (%s)\n", r.name, benchstat.Median(r.ours), benchstat.Median(r.peer), benchstat.Median(ratios), list(ratios, "%.2f"), r.unit)
	}
	fmt.Printf("%d streams' aggregate over one stream: %.1fx (llama.cpp's %d sequences over one: %.1fx)\n",
		*streams, benchstat.Median(rows[4].ours)/benchstat.Median(rows[1].ours), *peerSeqs, benchstat.Median(rows[4].peer)/benchstat.Median(rows[1].peer))
	fmt.Printf("time to first token, prompts of 32-256 tokens arriving together: stepserve %d streams p50 %.0f ms, p99 %.0f ms; llama.cpp %d sequences p50 %.0f ms, p99 %.0f ms\n",
		*streams, 1000*benchstat.Median(ttft50), 1000*benchstat.Median(ttft99), *peerSeqs, 1000*benchstat.Median(peer50), 1000*benchstat.Median(peer99))
	for i, r := range rows[:4] {
		if i%2 == 1 {
			bytes := float64(4 * weights)
			if i == 3 {
				bytes /= 2
			}
			ours := benchstat.Median(r.ours) * bytes
			fmt.Printf("%s: stepserve reads weights at %.1f GB/s, %.0f%% of the measured %.1f GB/s (llama.cpp %.0f%%)\n",
				r.name, ours/1e9, 100*ours/bw, bw/1e9, 100*benchstat.Median(r.peer)*bytes/bw)
		}
	}
	return nil
}

// run is one measurement: per sequence, its tokens, and when (seconds
// from the start) its first and last arrived.
type result struct {
	tokens      [][]int32
	first, last []float64
	wall        float64
}

func (r *result) prefill(promptLen int) float64 { return float64(promptLen) / r.first[0] }

func (r *result) decode() float64 {
	return float64(len(r.tokens[0])-1) / (r.last[0] - r.first[0])
}

func (r *result) aggregate() float64 {
	n := 0
	for _, t := range r.tokens {
		n += len(t)
	}
	return float64(n) / r.wall
}

func (r *result) ttftPercentiles() (p50, p99 float64) {
	s := slices.Clone(r.first)
	slices.Sort(s)
	return s[len(s)/2], s[int(math.Ceil(0.99*float64(len(s))))-1]
}

// settle lets the other side's threads go quiet (llama.cpp's spin a
// while after a graph; stepserve's crew after a step) before a side is
// timed.
func settle() { time.Sleep(300 * time.Millisecond) }

func list(v []float64, format string) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf(format, x)
	}
	return strings.Join(parts, ", ")
}
