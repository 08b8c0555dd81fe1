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
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stepserve/stepserve/bench/internal/benchstat"

	"github.com/stepserve/stepserve/bench/gguf"
	"github.com/stepserve/stepserve/internal/randweights"
	"github.com/stepserve/stepserve/models"
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

// prepare writes the model folders (float32, and bfloat16 weights opted
// into by model.yaml over the same files) and the GGUF files, and returns
// the model as stepserve reads it.
func prepare(repo string) (*models.Model, error) {
	tok, err := randweights.ByteLevelTokenizer(shape.Vocab)
	if err != nil {
		return nil, err
	}
	yaml := func(extra string) string {
		return fmt.Sprintf("engine: cpu\n%sgeneration:\n  max_num_seqs: %d\n  max_model_len: 2304\n  max_batch_tokens: 256\n", extra, max(*streams, *peerSeqs))
	}
	f32 := filepath.Join(repo, "smollm")
	if err := os.RemoveAll(repo); err != nil {
		return nil, err
	}
	if err := randweights.WriteDecoderFolder(f32, randweights.DecoderFolder{Shape: shape, Seed: 1, Tokenizer: tok,
		ModelYAML: yaml(""), Generator: "bench/llamapeer"}); err != nil {
		return nil, err
	}
	bf16 := filepath.Join(repo, "smollm-bf16")
	if err := os.MkdirAll(bf16, 0o755); err != nil {
		return nil, err
	}
	for _, f := range []string{"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"} {
		if err := os.Link(filepath.Join(f32, f), filepath.Join(bf16, f)); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(bf16, "model.yaml"), []byte(yaml("device_dtype: bfloat16\n")), 0o644); err != nil {
		return nil, err
	}
	m, err := models.Load(f32)
	if err != nil {
		return nil, err
	}
	for _, g := range []struct {
		name string
		typ  gguf.Type
	}{{"smollm-f32.gguf", gguf.F32}, {"smollm-f16.gguf", gguf.F16}} {
		if err := gguf.WriteLlama(filepath.Join(*dir, g.name), m.Config.Decoder, m.Weights, gguf.Options{Name: "smollm-shape", Type: g.typ, BOS: shape.BOS, EOS: shape.EOS}); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// agree compares greedy continuations of two prompts: stepserve float32,
// llama.cpp float32 and the PyTorch reference must be identical; the
// half-precision pair is reported (their roundings differ: bfloat16 keeps
// 8 bits of mantissa, float16 11).
func agree(srv *stepserve, f32, f16 *peer, m *models.Model) error {
	ps := [][]int32{prompts(1, *promptLen, 1)[0], prompts(1, 48, 2)[0]}
	ours, err := srv.generate("smollm", ps, *check)
	if err != nil {
		return err
	}
	theirs, err := f32.generate(ps[:1], *check)
	if err != nil {
		return err
	}
	theirs2, err := f32.generate(ps[1:], *check)
	if err != nil {
		return err
	}
	ref, err := reference(ps, *check)
	if err != nil {
		return err
	}
	for i := range ps {
		peerTokens := theirs.tokens[0]
		if i == 1 {
			peerTokens = theirs2.tokens[0]
		}
		if !slices.Equal(ours.tokens[i], ref[i]) || !slices.Equal(peerTokens, ref[i]) {
			return fmt.Errorf("greedy tokens disagree on prompt %d (%d tokens):\n  stepserve %v\n  llama.cpp %v\n  torch     %v",
				i, len(ps[i]), ours.tokens[i], peerTokens, ref[i])
		}
	}
	fmt.Printf("agreement: %d greedy tokens after each of 2 prompts identical from stepserve (float32), llama.cpp (f32 GGUF) and PyTorch\n", *check)
	half, err := srv.generate("smollm-bf16", ps[:1], *check)
	if err != nil {
		return err
	}
	h16, err := f16.generate(ps[:1], *check)
	if err != nil {
		return err
	}
	fmt.Printf("half precision: stepserve bfloat16 matches the float32 tokens for %d of %d, llama.cpp f16 for %d of %d (leading tokens equal)\n\n",
		common(half.tokens[0], ref[0]), *check, common(h16.tokens[0], ref[0]), *check)
	return nil
}

func common(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// reference runs engine/cpufallback/testdata/llama_ref.py on the float32
// folder.
func reference(ps [][]int32, n int) ([][]int32, error) {
	in, err := json.Marshal(ps)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(*python, "engine/cpufallback/testdata/llama_ref.py", filepath.Join(*dir, "repo", "smollm"), strconv.Itoa(n), "float32")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("the PyTorch reference: %w\n%s", err, stderr.String())
	}
	var ref [][]int32
	return ref, json.Unmarshal(out, &ref)
}

// prompts are n prompts of length token ids each, past the special and
// byte ids.
func prompts(n, length, seed int) [][]int32 {
	out := make([][]int32, n)
	for i := range out {
		p := make([]int32, length)
		for j := range p {
			p[j] = int32(259 + (seed*7919+i*131+j*37+11)%(*vocab-259))
		}
		out[i] = p
	}
	return out
}

// mixed are n prompts of 32 to 256 tokens.
func mixed(n, seed int) [][]int32 {
	out := make([][]int32, n)
	for i := range out {
		out[i] = prompts(1, 32+(i*97)%225, seed*100+i)[0]
	}
	return out
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

// peer is a running bench/llama/llama.js.
type peer struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	logs bytes.Buffer
}

func startPeer(model string, threads, seqs int) (*peer, error) {
	p := &peer{cmd: exec.Command(*nodeBin, "bench/llama/llama.js", model, strconv.Itoa(threads), strconv.Itoa(seqs))}
	p.cmd.Stderr = &p.logs
	var err error
	if p.in, err = p.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.out = bufio.NewReaderSize(out, 1<<20)
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("node bench/llama/llama.js (run make bench-llama, which installs it): %w", err)
	}
	var hello struct {
		Ready bool `json:"ready"`
	}
	if err := p.read(&hello); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *peer) read(v any) error {
	line, err := p.out.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("llama.js: %w\n%s", err, p.logs.String())
	}
	return json.Unmarshal(line, v)
}

// settle lets the other side's threads go quiet (llama.cpp's spin a
// while after a graph; stepserve's crew after a step) before a side is
// timed.
func settle() { time.Sleep(300 * time.Millisecond) }

func (p *peer) generate(ps [][]int32, n int) (*result, error) {
	settle()
	q, _ := json.Marshal(map[string]any{"prompts": ps, "n": n})
	if _, err := p.in.Write(append(q, '\n')); err != nil {
		return nil, err
	}
	var a struct {
		Tokens [][]int32 `json:"tokens"`
		First  []float64 `json:"first"`
		Last   []float64 `json:"last"`
		Wall   float64   `json:"wall"`
	}
	if err := p.read(&a); err != nil {
		return nil, err
	}
	for i, t := range a.Tokens {
		if len(t) != n {
			return nil, fmt.Errorf("llama.cpp gave %d tokens for prompt %d, not %d", len(t), i, n)
		}
	}
	return &result{tokens: a.Tokens, first: a.First, last: a.Last, wall: a.Wall}, nil
}

func (p *peer) stop() {
	p.in.Close()
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
}

func peerVersion() string {
	b, err := os.ReadFile("bench/llama/node_modules/node-llama-cpp/package.json")
	if err != nil {
		return "?"
	}
	var v struct {
		Version string `json:"version"`
	}
	json.Unmarshal(b, &v)
	return v.Version
}

// stepserve is the server binary serving the repository.
type stepserve struct {
	cmd    *exec.Cmd
	base   string
	client *http.Client
	logs   bytes.Buffer
}

func startServer(bin, repo string, threads int) (*stepserve, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	s := &stepserve{base: "http://" + addr, client: &http.Client{Timeout: 10 * time.Minute}}
	s.cmd = exec.Command(bin, "--server.addr", addr, "--server.grpc_addr=", "--model_repository", repo,
		"--engine.cpu_threads", strconv.Itoa(threads), "--log.level", "warn")
	s.cmd.Stdout, s.cmd.Stderr = &s.logs, &s.logs
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s (make build): %w", bin, err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for _, m := range []string{"smollm", "smollm-bf16"} {
		for {
			resp, err := s.client.Get(s.base + "/v2/models/" + m + "/ready")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				s.stop()
				return nil, fmt.Errorf("%s did not serve %s within 3 minutes:\n%s", bin, m, s.logs.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return s, nil
}

func (s *stepserve) stop() {
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	s.cmd.Wait()
}

// generate sends every prompt at once, each its own streamed
// /v1/completions request, and collects the token ids as they arrive.
func (s *stepserve) generate(model string, ps [][]int32, n int) (*result, error) {
	settle()
	r := &result{tokens: make([][]int32, len(ps)), first: make([]float64, len(ps)), last: make([]float64, len(ps))}
	errs := make([]error, len(ps))
	start := time.Now()
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { errs[i] = s.one(model, p, n, start, r, i) })
	}
	wg.Wait()
	r.wall = time.Since(start).Seconds()
	return r, errors.Join(errs...)
}

func (s *stepserve) one(model string, prompt []int32, n int, start time.Time, r *result, i int) error {
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0,
		"ignore_eos": true, "stream": true, "logprobs": 0, "return_tokens_as_token_ids": true})
	resp, err := s.client.Post(s.base+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s: %s", model, resp.Status, b)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		now := time.Since(start).Seconds()
		var c struct {
			Choices []struct {
				Logprobs *struct {
					Tokens []string `json:"tokens"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return err
		}
		for _, ch := range c.Choices {
			if ch.Logprobs == nil {
				continue
			}
			for _, t := range ch.Logprobs.Tokens {
				id, err := strconv.Atoi(strings.TrimPrefix(t, "token_id:"))
				if err != nil {
					return fmt.Errorf("token %q: %w", t, err)
				}
				if len(r.tokens[i]) == 0 {
					r.first[i] = now
				}
				r.tokens[i] = append(r.tokens[i], int32(id))
				r.last[i] = now
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if len(r.tokens[i]) != n {
		return fmt.Errorf("%s gave %d tokens, not %d", model, len(r.tokens[i]), n)
	}
	return nil
}

func list(v []float64, format string) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf(format, x)
	}
	return strings.Join(parts, ", ")
}
