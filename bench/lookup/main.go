// Command lookup measures speculative decoding by prompt lookup
// (generation.speculative) on the CPU engine: decode tokens/s of the
// same requests with and without it, through the continuous batcher
// (generation.Loop) the server runs, interleaved round by round, with the
// share of drafted tokens kept and a check that the text is the same.
//
// The model is a SmolLM-135M shape (hidden 576, 30 layers, 9 heads, 3 KV
// heads, intermediate 1536) with random weights, written to a temporary
// directory (nothing is downloaded). A random model quotes nothing, so
// the "quote" workload's model is the same weights with two changes that
// leave its cost per token as it is: its output projection's rows are
// the embeddings in a fixed random order (the next token's row is the
// current token's embedding), and its layers' writes to the residual
// stream are scaled down by -residual. Its greedy text is then a walk
// through a fixed permutation of the vocabulary, and a prompt holding a
// document walked that way, then an instruction, then the document's
// first words, is continued by quoting the document: what a summary
// quoting its source, an edit of code or a retrieval answer does. The
// "edited" workload quotes a document in which one token in about
// editEvery was replaced: the quote differs there, as a revision of its source
// does, and drafts are cut short at each difference. The "loop" workload
// is the random model's greedy text on random prompts, which falls into a
// loop within tens of tokens, as small models' greedy text often does.
//
//	go run ./bench/lookup [-rounds 3] [-new 128] [-k 4] [-streams 1,4] [-dtype f32|bf16|q8_0]
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stepserve/stepserve/bench/internal/benchstat"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/internal/randweights"
	"github.com/stepserve/stepserve/models"
)

func main() {
	rounds := flag.Int("rounds", 3, "rounds of each measurement, plain and prompt lookup interleaved")
	newTokens := flag.Int("new", 128, "tokens generated per sequence")
	k := flag.Int("k", 4, "num_speculative_tokens")
	streams := flag.String("streams", "1,4", "concurrent sequences, comma-separated")
	vocab := flag.Int("vocab", 49152, "vocabulary size (SmolLM's is 49152)")
	dtype := flag.String("dtype", "f32", "weights: f32, bf16 or q8_0")
	residual := flag.Float64("residual", 0.05, "the quote model's scale of the layers' residual writes")
	flag.Parse()
	var ns []int
	for _, s := range strings.Split(*streams, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "lookup: -streams %q: want positive counts, comma-separated\n", *streams)
			os.Exit(2)
		}
		ns = append(ns, n)
	}
	if err := run(*rounds, *newTokens, *k, ns, *vocab, *dtype, float32(*residual)); err != nil {
		fmt.Fprintln(os.Stderr, "lookup:", err)
		os.Exit(1)
	}
}

const (
	docLen    = 400 // the quoted document's tokens
	cueLen    = 8   // the document's first tokens, repeated after the instruction
	randomLen = 256 // the loop workload's prompts
	editEvery = 12  // the edited workload's differences
)

func run(rounds, newTokens, k int, streams []int, vocab int, dtype string, residual float32) error {
	dir, err := os.MkdirTemp("", "stepserve-lookup")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	tok, err := os.ReadFile("models/testdata/tokenizers/bpe.json")
	if err != nil {
		return fmt.Errorf("run from the repository root: %w", err)
	}
	shape := randweights.SmolLM(vocab)
	most := slices.Max(streams)
	yaml := fmt.Sprintf("engine: cpu\ngeneration:\n  max_num_seqs: %d\n  max_model_len: 1024\n  max_batch_tokens: 512\n", most)
	switch dtype {
	case "f32":
	case "bf16":
		yaml += "device_dtype: bfloat16\n"
	case "q8_0":
		yaml += "quantization: q8_0\n"
	default:
		return fmt.Errorf("-dtype %q: want f32, bf16 or q8_0", dtype)
	}
	folder := filepath.Join(dir, "smollm")
	if err := randweights.WriteDecoderFolder(folder, randweights.DecoderFolder{Shape: shape, Seed: 1, Tokenizer: tok, ModelYAML: yaml, Generator: "bench/lookup"}); err != nil {
		return err
	}
	fmt.Printf("prompt lookup (speculative decoding, num_speculative_tokens %d, n-grams 4 down to 2), CPU engine, %s, %d threads (kernels %s)\n",
		k, benchstat.CPULine(), runtime.NumCPU(), cpufallback.Kernels())
	fmt.Printf("model: SmolLM-135M shape, vocab %d, %s, random weights; %d new tokens a sequence, %d rounds, plain and lookup interleaved\n\n", vocab, dtype, newTokens, rounds)
	fmt.Printf("%-8s %7s | %14s %14s | %-22s | %8s | %s\n", "workload", "streams", "plain tok/s", "lookup tok/s", "ratio median (spread)", "kept", "same text")
	for _, model := range []string{"quote", "random"} {
		m, err := models.Load(folder)
		if err != nil {
			return err
		}
		var perm []int32
		workloads := []string{"loop"}
		if model == "quote" {
			perm, workloads = quoting(m, residual), []string{"quote", "edited"}
		}
		dec, err := cpufallback.Engine{}.LoadDecoder(context.Background(), m)
		if err != nil {
			return err
		}
		opts := m.Config.Generation.Loop()
		opts.PrefixCaching = false // each round computes its prompts
		plain, stopPlain, err := start(opts, dec, nil)
		if err != nil {
			return err
		}
		opts.PromptLookup = generation.PromptLookup{Tokens: k, MaxN: 4, MinN: 2}
		var accepted, drafted atomic.Int64
		looked, stopLooked, err := start(opts, dec, func(step *generation.Step, _ time.Duration, _ generation.State) {
			accepted.Add(int64(step.AcceptedTokens))
			drafted.Add(int64(step.DraftTokens))
		})
		if err != nil {
			return err
		}
		for _, workload := range workloads {
			for _, n := range streams {
				var a, b, ratios []float64
				sampling := generation.Sampling{Logprobs: -1}
				same := true
				accepted.Store(0)
				drafted.Store(0)
				for r := range rounds + 1 { // the first round warms up
					rng := rand.New(rand.NewPCG(uint64(r), uint64(n)))
					ps := make([][]int32, n)
					for i := range ps {
						switch workload {
						case "quote":
							ps[i] = quotePrompt(perm, rng, 0)
						case "edited":
							ps[i] = quotePrompt(perm, rng, editEvery)
						default:
							ps[i] = randomPrompt(vocab, rng)
						}
					}
					// Alternate which goes first.
					order := []*runner{plain, looked}
					if r%2 == 1 {
						order = []*runner{looked, plain}
					}
					res := map[*runner]outcome{}
					for _, x := range order {
						o, err := x.generate(ps, newTokens, sampling)
						if err != nil {
							return err
						}
						res[x] = o
					}
					for i := range ps {
						same = same && slices.Equal(res[plain].tokens[i], res[looked].tokens[i])
					}
					if r == 0 {
						accepted.Store(0)
						drafted.Store(0)
						continue
					}
					a, b = append(a, res[plain].rate), append(b, res[looked].rate)
					ratios = append(ratios, res[looked].rate/res[plain].rate)
				}
				kept := "-"
				if d := drafted.Load(); d > 0 {
					kept = fmt.Sprintf("%.0f%%", 100*float64(accepted.Load())/float64(d))
				}
				fmt.Printf("%-8s %7d | %14.1f %14.1f | %6.2fx (%.2f-%.2f)%6s | %8s | %v\n", workload, n, benchstat.Median(a), benchstat.Median(b),
					benchstat.Median(ratios), slices.Min(ratios), slices.Max(ratios), "", kept, same)
			}
		}
		stopPlain()
		stopLooked()
		dec.Close()
	}
	fmt.Println("\ntok/s: tokens generated over the time from each sequence's first token to its last (decode, prefill excluded), summed over the streams;")
	fmt.Println("kept: drafted tokens the model drew too; same text: every sequence's tokens equal with and without prompt lookup.")
	return nil
}

// quoting turns m into the quote workload's model (the package doc) and
// returns the permutation its greedy text walks: the token after t is
// perm[t].
func quoting(m *models.Model, residual float32) []int32 {
	d := m.Decoder
	V, H := d.Config.Vocab, d.Config.Hidden
	rng := rand.New(rand.NewPCG(7, 7))
	perm := make([]int32, V)
	for i := range perm {
		perm[i] = int32(i)
	}
	rng.Shuffle(V, func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
	head := make([]float32, V*H)
	for t := range V {
		copy(head[int(perm[t])*H:(int(perm[t])+1)*H], d.Embed[t*H:(t+1)*H])
	}
	d.Head = &models.Linear{In: H, Out: V, Weight: head}
	for i := range d.Layers {
		for _, w := range [][]float32{d.Layers[i].O.Weight, d.Layers[i].Down.Weight} {
			for j := range w {
				w[j] *= residual
			}
		}
	}
	return perm
}

// quotePrompt is a document walked through perm from a random token
// (past the cue, a token every edit/2 to 3*edit/2 replaced by a random
// one, when edit is not 0), an instruction of random tokens, and the
// document's first cueLen tokens.
func quotePrompt(perm []int32, rng *rand.Rand, edit int) []int32 {
	V := len(perm)
	doc := []int32{int32(3 + rng.IntN(V-3))}
	for len(doc) < docLen {
		doc = append(doc, perm[doc[len(doc)-1]])
	}
	p := slices.Clone(doc)
	for i := cueLen + rng.IntN(edit+1); edit > 0 && i < len(p); i += edit/2 + rng.IntN(edit+1) {
		p[i] = int32(3 + rng.IntN(V-3))
	}
	for range 16 {
		p = append(p, int32(3+rng.IntN(V-3)))
	}
	return append(p, doc[:cueLen]...)
}

func randomPrompt(vocab int, rng *rand.Rand) []int32 {
	p := make([]int32, randomLen)
	for i := range p {
		p[i] = int32(3 + rng.IntN(vocab-3))
	}
	return p
}

type runner struct {
	loop *generation.Loop
}

type outcome struct {
	tokens [][]int32
	rate   float64 // decode tokens/s, summed over the sequences
}

func start(opts generation.Options, dec generation.Model, observe func(*generation.Step, time.Duration, generation.State)) (*runner, func(), error) {
	loop, err := generation.NewLoop(opts, dec)
	if err != nil {
		return nil, nil, err
	}
	loop.Observe = observe
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { loop.Run(ctx); close(done) }()
	return &runner{loop}, func() { cancel(); <-done }, nil
}

// generate runs ps together, n tokens each (no end token).
func (r *runner) generate(ps [][]int32, n int, sampling generation.Sampling) (outcome, error) {
	out := outcome{tokens: make([][]int32, len(ps))}
	rates := make([]float64, len(ps))
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		st, err := r.loop.Generate(context.Background(), generation.Request{Prompt: p, MaxTokens: n, Sampling: sampling})
		if err != nil {
			return out, err
		}
		wg.Go(func() {
			var first, last time.Time
			for {
				ev, ok := st.Next(context.Background())
				if !ok {
					break
				}
				if ev.Err != nil {
					errs[i] = ev.Err
					return
				}
				if ev.Last() {
					break
				}
				if first.IsZero() {
					first = time.Now()
				}
				last = time.Now()
				out.tokens[i] = append(out.tokens[i], ev.Token)
			}
			if len(out.tokens[i]) > 1 {
				rates[i] = float64(len(out.tokens[i])-1) / last.Sub(first).Seconds()
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return out, err
		}
	}
	for _, v := range rates {
		out.rate += v
	}
	return out, nil
}
