// Command run is `make bench`: it starts stepserve, the plain net/http
// baseline (bench/baseline) and the FastAPI + PyTorch peer
// (bench/peers), loads each with wrk on loopback (stepserve's gRPC API
// with bench/grpcload), runs the engine and
// allocation benchmarks and the same products through OpenBLAS (numpy),
// all in one run, and writes bench/REPORT.md with every figure, its
// baseline and the ratio. Absolute numbers drift on shared machines; the
// ratios, taken minutes apart on the same machine, are what count.
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/stepserve/stepserve/bench/internal/benchstat"
)

// tokenBudget is section 2b's batching.max_batch_tokens.
const tokenBudget = 2048

var (
	duration = flag.Duration("d", 9*time.Second, "wrk time per measurement, split over its rounds")
	rounds   = flag.Int("rounds", 3, "rounds per measurement, interleaved with the figures it is compared to; the median counts")
	out      = flag.String("out", "bench/REPORT.md", "report file")
	bin      = flag.String("stepserve", "bin/stepserve", "stepserve binary")
	baseline = flag.String("baseline", "bin/baseline", "baseline binary")
	python   = flag.String("python", "/usr/bin/python3", "Python with torch, numpy, fastapi, uvicorn")
	grpcload = flag.String("grpcload", "bin/grpcload", "the gRPC load generator (bench/grpcload)")
	only     = flag.String("only", "", `"grpc": sections 1b and 1c only (gRPC beside HTTP, large inputs, shared memory), printed and not written to the report`)
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type result struct {
	rps       float64
	p50, p99  time.Duration
	mean      time.Duration // h2load's mean latency, where it reports no percentiles
	non2xx    int
	requests  int     // answered
	clientCPU float64 // the gRPC load generator's CPU time over wall time
	serverCPU float64 // µs of the server's CPU time per request answered, where measured
}

func (r result) String() string {
	if r.p50 == 0 && r.mean > 0 {
		return fmt.Sprintf("%.0f req/s, mean %v", r.rps, r.mean)
	}
	return fmt.Sprintf("%.0f req/s, p50 %v, p99 %v", r.rps, r.p50, r.p99)
}

type report struct {
	bytes.Buffer
}

func (r *report) line(format string, args ...any) {
	fmt.Fprintf(r, format+"\n", args...)
}

func run() error {
	tmp, err := os.MkdirTemp("", "stepserve-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bodies, err := writeBodies(tmp)
	if err != nil {
		return err
	}

	// The engine and allocation benchmarks first, while nothing else runs.
	fmt.Fprintln(os.Stderr, "engine steps")
	goBench, err := goBenchmarks()
	if err != nil {
		return err
	}
	numpy, err := numpyBenchmarks()
	if err != nil {
		return err
	}
	alloc, err := handlerAllocs()
	if err != nil {
		return err
	}
	trip, err := workerRoundTrip()
	if err != nil {
		return err
	}
	decodeTrips, err := workerDecodeTrips()
	if err != nil {
		return err
	}

	// The servers.
	nobatch, err := noBatchRepository(tmp)
	if err != nil {
		return err
	}
	stop := []func(){}
	defer func() {
		for _, s := range stop {
			s()
		}
	}()
	pids := map[string]int{} // each server's process, by name
	start := func(name string, args []string, env []string, ready string) (string, error) {
		addr, err := freeAddr()
		if err != nil {
			return "", err
		}
		host, port, _ := net.SplitHostPort(addr)
		for i, a := range args {
			args[i] = strings.NewReplacer("ADDR", addr, "HOST", host, "PORT", port).Replace(a)
		}
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = append(os.Environ(), env...)
		var logs bytes.Buffer
		cmd.Stdout, cmd.Stderr = &logs, &logs
		// Its own process group, so that stopping it stops uvicorn's
		// workers too.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.WaitDelay = 2 * time.Second
		if err := cmd.Start(); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		stop = append(stop, func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
		pids[name] = cmd.Process.Pid
		base := "http://" + addr
		deadline := time.Now().Add(90 * time.Second)
		probe := &http.Client{Timeout: 2 * time.Second}
		for time.Now().Before(deadline) {
			if resp, err := probe.Get(base + ready); err == nil {
				resp.Body.Close()
				if resp.StatusCode < 500 {
					return base, nil
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		return "", fmt.Errorf("%s did not start in 90s:\n%s", name, logs.String())
	}
	fmt.Fprintln(os.Stderr, "starting servers")
	grpcAddr, err := freeAddr()
	if err != nil {
		return err
	}
	serve, err := start("stepserve", []string{*bin, "--server.addr", "ADDR", "--server.grpc_addr", grpcAddr, "--model_repository", "model_repository", "--log.level", "warn"}, nil, "/v2/health/ready")
	if err != nil {
		return err
	}
	if *only == "grpc" {
		var r report
		r.line("%s; %d interleaved rounds per figure, the median shown", benchstat.CPULine(), max(*rounds, 1))
		r.line("")
		if err := reportGRPC(&r, tmp, serve, grpcAddr, pids["stepserve"], bodies); err != nil {
			return err
		}
		if err := reportLarge(&r, tmp, serve, grpcAddr, pids["stepserve"]); err != nil {
			return err
		}
		fmt.Print(r.String())
		return nil
	}
	serveNB, err := start("stepserve (no batching)", []string{*bin, "--server.addr", "ADDR", "--server.grpc_addr=", "--model_repository", nobatch, "--batching.max_queue_delay", "0", "--log.level", "warn"}, nil, "/v2/health/ready")
	if err != nil {
		return err
	}
	embedNB, err := embedRepository(tmp, "embed", 0)
	if err != nil {
		return err
	}
	embedTB, err := embedRepository(tmp, "embed-budget", tokenBudget)
	if err != nil {
		return err
	}
	serveE, err := start("stepserve (embeddings)", []string{*bin, "--server.addr", "ADDR", "--server.grpc_addr=", "--model_repository", embedNB, "--log.level", "warn"}, nil, "/v2/health/ready")
	if err != nil {
		return err
	}
	serveTB, err := start("stepserve (token budget)", []string{*bin, "--server.addr", "ADDR", "--server.grpc_addr=", "--model_repository", embedTB, "--log.level", "warn"}, nil, "/v2/health/ready")
	if err != nil {
		return err
	}
	base, err := start("baseline", []string{*baseline, "-addr", "ADDR"}, nil, "/")
	if err != nil {
		return err
	}
	peer, err := start("FastAPI peer", []string{*python, "-m", "uvicorn", "--app-dir", "bench/peers", "fastapi_digits:app", "--workers", "2", "--log-level", "warning", "--host", "HOST", "--port", "PORT"}, nil, "/docs")
	if err != nil {
		return err
	}

	var r report
	r.line("# stepserve benchmark report")
	r.line("")
	r.line("Generated by `make bench` on %s: %d CPUs, %s, wrk `-t1`, %d interleaved rounds of %v per figure (the median shown), loopback. Every ratio compares figures taken in this one run.", time.Now().UTC().Format("2006-01-02 15:04 UTC"), runtime.NumCPU(), buildOf(serve), max(*rounds, 1), max((*duration/time.Duration(max(*rounds, 1))).Round(time.Second), time.Second))
	r.line("")

	// 1. HTTP serving.
	r.line("## 1. HTTP serving: digits, single-row requests")
	r.line("")
	r.line("| concurrency | stepserve JSON | stepserve binary | plain net/http baseline (JSON) | FastAPI + PyTorch peer (JSON) | JSON / baseline | binary / baseline | JSON / peer |")
	r.line("|---|---|---|---|---|---|---|---|")
	digits := "/v2/models/digits/infer"
	for _, c := range []int{1, 16, 64} {
		fmt.Fprintf(os.Stderr, "HTTP c=%d\n", c)
		rs := interleaved(c, target{url: serve + digits, script: bodies["json"]}, target{url: serve + digits, script: bodies["binary"]},
			target{url: base + digits, script: bodies["json"]}, target{url: peer + digits, script: bodies["json"]})
		sj, sb, bj, pj := rs[0], rs[1], rs[2], rs[3]
		r.line("| %d | %s | %s | %s | %s | %.2fx | %.2fx | %.1fx |", c, sj, sb, bj, pj, sj.rps/bj.rps, sb.rps/bj.rps, sj.rps/pj.rps)
	}
	r.line("")

	if err := reportGRPC(&r, tmp, serve, grpcAddr, pids["stepserve"], bodies); err != nil {
		return err
	}
	if err := reportLarge(&r, tmp, serve, grpcAddr, pids["stepserve"]); err != nil {
		return err
	}

	// 2. Dynamic batching.
	fmt.Fprintln(os.Stderr, "batching")
	r.line("## 2. Dynamic batching at 64 connections")
	r.line("")
	r.line("| model | batching (buckets as shipped, max_queue_delay 0: batches grow while a step runs) | batch 1 (bucket [1], max_queue_delay 0) | throughput gain | p99 ratio |")
	r.line("|---|---|---|---|---|")
	for _, m := range []struct{ name, path, body string }{{"digits (JSON)", digits, "json"}, {"tiny-encoder (text)", "/v2/models/tiny-encoder/infer", "text"}} {
		rs := interleaved(64, target{url: serve + m.path, script: bodies[m.body]}, target{url: serveNB + m.path, script: bodies[m.body]})
		b, n := rs[0], rs[1]
		r.line("| %s | %s | %s | %.2fx | %.2fx lower |", m.name, b, n, b.rps/n.rps, float64(n.p99)/float64(max(b.p99, 1)))
	}
	r.line("")
	r.line("The encoder request is one short sentence (13 tokens with [CLS] and [SEP], bucket s32); in both modes the CPU engine computes its real tokens only. A request that finds its model idle runs at once on its own goroutine; batches form from what arrives while a step runs.")
	r.line("")

	// 2b. Embeddings through the OpenAI API, with and without a token budget.
	fmt.Fprintln(os.Stderr, "embeddings")
	r.line("## 2b. Embeddings: OpenAI `/v1/embeddings` on the tiny-xlmr demo at 64 connections, mixed lengths")
	r.line("")
	r.line("Seven short queries (5-15 tokens) for every passage of about 100 tokens, one text per request, through `POST /v1/embeddings` on the XLM-R-layout demo (Unigram tokenizer.json, CPU engine, buckets batch [1, 4, 16, 64] x seq [32, 64, 128], each server serving it alone); the same server binary with and without `batching.max_batch_tokens: %d` on the model, interleaved.", tokenBudget)
	r.line("")
	r.line("| | no token budget | max_batch_tokens %d | throughput ratio | p99 ratio | mean padding per step (no budget / budget) |", tokenBudget)
	r.line("|---|---|---|---|---|---|")
	{
		rs := interleaved(64, target{url: serveE + "/v1/embeddings", script: bodies["embed-mixed"]}, target{url: serveTB + "/v1/embeddings", script: bodies["embed-mixed"]})
		n, b := rs[0], rs[1]
		r.line("| tiny-xlmr | %s | %s | %.2fx | %.2fx lower | %.0f%% / %.0f%% |", n, b, b.rps/n.rps, float64(n.p99)/float64(max(b.p99, 1)),
			100*meanPadding(serveE, "tiny-xlmr"), 100*meanPadding(serveTB, "tiny-xlmr"))
	}
	r.line("")
	r.line("Without a budget a passage pads every short query that shares its step to its 128-token bucket (the CPU engine computes real tokens only, so on it the cost is mostly attention over the longer bucket and the copies; on an NPU every padded token is device work). With the budget a step holds at most %d padded tokens: the passage rides with at most 15 others.", tokenBudget)
	r.line("")

	// 3. Engine steps against OpenBLAS.
	r.line("## 3. Engine steps: GFLOP/s of the step's matrix products")
	r.line("")
	r.line("stepserve's CPU engine runs the whole step (products, bias, activations, layer norm, softmax, attention, pooling; %s) on sequences that fill the bucket, every token real; OpenBLAS (numpy) runs only the same chain of matrix products.", buildOf(serve))
	r.line("")
	r.line("| model | bucket | stepserve step | allocs/step | OpenBLAS products | ratio |")
	r.line("|---|---|---|---|---|---|")
	for _, k := range goBench.order {
		g := goBench.rows[k]
		np, ok := numpy[k]
		ratio := "n/a"
		if ok && np > 0 {
			ratio = fmt.Sprintf("%.2fx", g.gflops/np)
		}
		r.line("| %s | %s | %.2f GFLOP/s | %d | %.2f GFLOP/s | %s |", g.model, g.bucket, g.gflops, g.allocs, np, ratio)
	}
	r.line("")

	// 4. Allocations on the handler path.
	r.line("## 4. Worker step round trip")
	r.line("")
	r.line("One step of a 64 -> 64 linear layer (one row) through the torch engine's worker (Go -> step doorbell -> Python worker on torch's CPU -> shared memory -> Go), with the torch.rbln.explain test double on (every step measured and clean), beside the same step on the CPU engine, in one run. Host overhead is the round trip less the time the worker spent inside the step body (copy in, graph, copy out): what stepserve adds to every step on an NPU.")
	r.line("")
	r.line("| path | per step |")
	r.line("|---|---|")
	r.line("| worker round trip (mean) | %.1f µs |", trip.roundTripUS)
	r.line("| worker host overhead (median / p90) | %.1f / %.1f µs |", trip.hostUS, trip.hostP90US)
	r.line("| the same step as a JSON control message (median round trip; how every step went before the doorbell) | %.1f µs |", trip.messageUS)
	r.line("| CPU engine step, same model | %.2f µs |", trip.cpuUS)
	r.line("")
	r.line("A language model's decode step through the same worker (a 2-layer Llama, hidden 128, on torch's CPU; the step's rows packed into the bucket's one input buffer, keys and values written into the device-resident cache in the graph, sampling in the graph, the sampled rows read back; BenchmarkWorkerDecodeStep):")
	r.line("")
	r.line("| decode step | round trip (mean) | host overhead (median / p90) | waiting on the eventfd alone (median / p90) |")
	r.line("|---|---|---|---|")
	for _, t := range decodeTrips {
		r.line("| %d sequence(s) | %.0f µs | %.0f / %.0f µs | %.0f / %.0f µs |", t.seqs, t.roundTripUS, t.hostUS, t.hostP90US, t.eventfdUS, t.eventfdP90US)
	}
	r.line("")

	r.line("## 5. Allocations")
	r.line("")
	r.line("| path | allocs/op | bytes/op |")
	r.line("|---|---|---|")
	r.line("| HTTP handler, single-row JSON inference (decode, validate, batcher, step on a fake engine, encode) | %d | %d |", alloc.allocs, alloc.bytes)
	r.line("| CPU engine step (every bucket above) | 0 | 0 |")
	r.line("")
	r.line("Reproduce: `make bench` (installs wrk, python3-fastapi, python3-uvicorn, python3-numpy, libopenblas0 where missing).")

	if err := os.WriteFile(*out, r.Bytes(), 0o644); err != nil {
		return err
	}
	os.Stdout.Write(r.Bytes())
	return nil
}

// buildOf says which BLAS and which element-wise kernels the server's CPU
// engine uses, from its stepserve_build_info labels.
func buildOf(base string) string {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return "?"
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	label := func(name string) string {
		if m := regexp.MustCompile(`stepserve_build_info\{[^}]*\b` + name + `="([^"]+)"`).FindSubmatch(b); m != nil {
			return string(m[1])
		}
		return "?"
	}
	return fmt.Sprintf("%s BLAS, %s kernels", label("blas"), label("kernels"))
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// writeBodies writes the wrk Lua scripts: a single-row digits request as
// JSON and as binary tensors, and a text request for the encoder.
func writeBodies(dir string) (map[string]string, error) {
	row := []float32{0, 0, 2, 13, 16, 14, 1, 0, 0, 0, 11, 12, 7, 16, 3, 0, 0, 0, 9, 3, 2, 16, 3, 0, 0, 0, 0, 0, 9, 11, 0, 0, 0, 0, 2, 11, 15, 13, 3, 0, 0, 0, 4, 15, 16, 13, 3, 0, 0, 0, 0, 14, 8, 0, 0, 0, 0, 0, 5, 15, 4, 0, 0, 0}
	js, _ := json.Marshal(map[string]any{"inputs": []map[string]any{{"name": "pixels", "datatype": "FP32", "shape": []int{1, 64}, "data": row}}})
	hdr := `{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,64],"parameters":{"binary_data_size":256}}],"outputs":[{"name":"probabilities","parameters":{"binary_data":true}}]}`
	bin := []byte(hdr)
	for _, v := range row {
		bin = binary.LittleEndian.AppendUint32(bin, math.Float32bits(v))
	}
	text := []byte(`{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":["the water is warm and the children play near the river"]}]}`)
	scripts := map[string]string{}
	for name, b := range map[string]struct {
		body    []byte
		headers map[string]string
	}{
		"json":   {js, map[string]string{"Content-Type": "application/json"}},
		"binary": {bin, map[string]string{"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": strconv.Itoa(len(hdr))}},
		"text":   {text, map[string]string{"Content-Type": "application/json"}},
	} {
		bodyPath := filepath.Join(dir, name+".body")
		if err := os.WriteFile(bodyPath, b.body, 0o644); err != nil {
			return nil, err
		}
		var lua strings.Builder
		fmt.Fprintf(&lua, "wrk.method = \"POST\"\nlocal f = io.open(%q, \"rb\")\nwrk.body = f:read(\"*all\")\nf:close()\n", bodyPath)
		for k, v := range b.headers {
			fmt.Fprintf(&lua, "wrk.headers[%q] = %q\n", k, v)
		}
		script := filepath.Join(dir, name+".lua")
		if err := os.WriteFile(script, []byte(lua.String()), 0o644); err != nil {
			return nil, err
		}
		scripts[name] = script
	}
	mixed, err := writeMixedEmbeddings(dir)
	if err != nil {
		return nil, err
	}
	scripts["embed-mixed"] = mixed
	return scripts, nil
}

// writeMixedEmbeddings writes a wrk script that cycles through OpenAI
// embeddings requests for the tiny-xlmr demo of mixed lengths, as a search
// service sees them: seven short queries (5 to 15 tokens) for every long
// passage (about 100 tokens).
func writeMixedEmbeddings(dir string) (string, error) {
	short := []string{"what is a bucket", "how do steps batch requests", "the fox jumps", "search embeddings for similar text",
		"a server answers requests", "rerank the passages", "tokenizers split words into pieces"}
	long := strings.Repeat("An inference server answers requests; it batches them, pads them to a compiled shape, and runs the model once per step. ", 6)
	var lua strings.Builder
	lua.WriteString("wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nlocal bodies = {\n")
	for i := range 16 {
		text := short[i%len(short)]
		if i%8 == 7 {
			text = long
		}
		b, err := json.Marshal(map[string]any{"model": "tiny-xlmr", "input": text})
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&lua, "  %q,\n", b)
	}
	lua.WriteString("}\nlocal i = 0\nrequest = function()\n  i = i %% #bodies + 1\n  return wrk.format(nil, nil, nil, bodies[i])\nend\n")
	script := filepath.Join(dir, "embed-mixed.lua")
	return script, os.WriteFile(script, []byte(strings.ReplaceAll(lua.String(), "%%", "%")), 0o644)
}

// meanPadding is the mean padding ratio of a model's steps so far on the
// server at base (stepserve_padding_ratio's sum over its count, every
// bucket), or NaN when it cannot be read.
func meanPadding(base, model string) float64 {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return math.NaN()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var sum, count float64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || !strings.Contains(f[0], `model="`+model+`"`) {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch {
		case strings.HasPrefix(f[0], "stepserve_padding_ratio_sum{"):
			sum += v
		case strings.HasPrefix(f[0], "stepserve_padding_ratio_count{"):
			count += v
		}
	}
	return sum / count
}

// embedRepository is a repository of the tiny-xlmr demo alone, with the
// batch buckets a serving deployment would have ([1, 4, 16, 64]: the
// shipped demo keeps its buffers small) and, when budget is not 0,
// batching.max_batch_tokens.
func embedRepository(dir, name string, budget int) (string, error) {
	root := filepath.Join(dir, name)
	if err := os.CopyFS(filepath.Join(root, "tiny-xlmr"), os.DirFS("model_repository/tiny-xlmr")); err != nil {
		return "", err
	}
	p := filepath.Join(root, "tiny-xlmr", "model.yaml")
	b, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	b = regexp.MustCompile(`(?m)^(\s*)batch: \[[^\]]*\]`).ReplaceAll(b, []byte("${1}batch: [1, 4, 16, 64]"))
	if budget > 0 {
		b = fmt.Appendf(b, "batching:\n  max_batch_tokens: %d\n", budget)
	}
	return root, os.WriteFile(p, b, 0o644)
}

// noBatchRepository copies the shipped models with batch bucket [1].
func noBatchRepository(dir string) (string, error) {
	root := filepath.Join(dir, "nobatch")
	if err := os.CopyFS(root, os.DirFS("model_repository")); err != nil {
		return "", err
	}
	re := regexp.MustCompile(`(?m)^(\s*)batch: \[[^\]]*\]`)
	for _, m := range []string{"digits", "tiny-encoder"} {
		p := filepath.Join(root, m, "model.yaml")
		b, err := os.ReadFile(p)
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(p, re.ReplaceAll(b, []byte("${1}batch: [1]")), 0o644); err != nil {
			return "", err
		}
	}
	return root, nil
}

var (
	rpsRE     = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	countRE   = regexp.MustCompile(`(\d+) requests in`)
	latencyRE = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([0-9.]+)(us|ms|s)`)
	non2xxRE  = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
)

// target is one server's URL and the wrk script of its request, or, for
// gRPC, its gRPC address and whether requests carry typed contents.
type target struct {
	url, script string
	grpc        string
	typed       bool
	request     string // bench/grpcload's -request file; empty: single-row digits
	h2          string // a gRPC-framed request file: load with h2load, not bench/grpcload
	metrics     string // the server's HTTP base URL, whose gRPC successes count h2load's answers
	pid         int    // the server's process, to measure its CPU time per request; 0: not measured
}

// interleaved loads each target in turn, *rounds times, for duration /
// rounds each, and returns each target's median round by throughput (with
// that round's latencies). Alternating spreads a passing disturbance of
// the machine over every target rather than onto one, and the median
// drops it.
func interleaved(conns int, targets ...target) []result {
	n := max(*rounds, 1)
	d := max((*duration / time.Duration(n)).Round(time.Second), time.Second)
	runs := make([][]result, len(targets))
	for range n {
		for i, t := range targets {
			cpu0 := processCPU(t.pid)
			var res result
			if t.h2 != "" {
				res = h2Load(t, conns, d)
			} else if t.grpc != "" {
				res = grpcLoad(t.grpc, t.typed, t.request, conns, d)
			} else {
				res = wrk(t.url, t.script, conns, d)
			}
			if t.pid != 0 && res.requests > 0 {
				// Requests the client gave up on at the end still run:
				// their CPU is this round's, and not the next one's.
				waitIdle(t.pid)
				res.serverCPU = (processCPU(t.pid) - cpu0).Seconds() * 1e6 / float64(res.requests)
			}
			runs[i] = append(runs[i], res)
		}
	}
	out := make([]result, len(targets))
	for i, rs := range runs {
		sort.Slice(rs, func(a, b int) bool { return rs[a].rps < rs[b].rps })
		out[i] = rs[len(rs)/2]
	}
	return out
}

func wrk(url, script string, conns int, d time.Duration) result {
	out, err := exec.Command("wrk", "-t1", fmt.Sprintf("-c%d", conns), "-d"+d.String(), "--latency", "-s", script, url).CombinedOutput()
	var r result
	if err != nil {
		fmt.Fprintf(os.Stderr, "wrk %s: %v\n%s", url, err, out)
		return r
	}
	if m := rpsRE.FindSubmatch(out); m != nil {
		r.rps, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	if m := countRE.FindSubmatch(out); m != nil {
		r.requests, _ = strconv.Atoi(string(m[1]))
	}
	for _, m := range latencyRE.FindAllSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(string(m[2]), 64)
		unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second}[string(m[3])]
		d := time.Duration(v * float64(unit)).Round(time.Microsecond)
		if string(m[1]) == "50" {
			r.p50 = d
		} else {
			r.p99 = d
		}
	}
	if m := non2xxRE.FindSubmatch(out); m != nil {
		r.non2xx, _ = strconv.Atoi(string(m[1]))
		fmt.Fprintf(os.Stderr, "warning: %s answered %d non-2xx\n", url, r.non2xx)
	}
	return r
}

// waitIdle waits, up to 10 s, until process pid has used at most one
// clock tick (10 ms) of CPU in 200 ms.
func waitIdle(pid int) {
	for range 50 {
		c := processCPU(pid)
		time.Sleep(200 * time.Millisecond)
		if processCPU(pid)-c <= 10*time.Millisecond {
			return
		}
	}
}

// processCPU is a process's user and system CPU time so far (0 for pid 0
// or a process it cannot read), from /proc at the kernel's clock tick
// (10 ms).
func processCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses:
	// utime and stime are the 12th and 13th.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100) // USER_HZ is 100 on Linux
}

var (
	h2RateRE     = regexp.MustCompile(`finished in [0-9.]+m?s, ([0-9.]+) req/s`)
	h2DoneRE     = regexp.MustCompile(`requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded`)
	h2MeanRE     = regexp.MustCompile(`time for request:\s+\S+\s+\S+\s+(\S+)`)
	grpcOKMetric = regexp.MustCompile(`(?m)^stepserve_requests_total\{[^}]*outcome="success"[^}]*protocol="grpc"[^}]*\} ([0-9.e+]+)$`)
)

// h2Load loads t's gRPC address with h2load (nghttp2), a C HTTP/2 load
// generator as wrk is an HTTP/1.1 one: streams calls in flight on one
// connection, on one thread, each posting t.h2 (a gRPC-framed
// ModelInferRequest). h2load judges a response by its HTTP status, and
// gRPC answers errors with status 200 and a grpc-status trailer, so the
// calls answered are counted by the server's own metric of gRPC
// successes (read once the server is idle again): a shortfall against
// h2load's count is reported as errors and left out of the figures.
func h2Load(t target, streams int, d time.Duration) result {
	var r result
	before, err := grpcSuccesses(t.metrics)
	if err != nil {
		fmt.Fprintf(os.Stderr, "h2load %s: %v\n", t.grpc, err)
		return r
	}
	cmd := exec.Command("h2load", "-D", strconv.Itoa(max(int(d.Seconds()), 1)), "-c1", "-t1", "-m"+strconv.Itoa(streams), "-d", t.h2,
		"-H", "content-type: application/grpc", "-H", "te: trailers", "http://"+t.grpc+"/inference.GRPCInferenceService/ModelInfer")
	out, err := cmd.CombinedOutput()
	rate, done := h2RateRE.FindSubmatch(out), h2DoneRE.FindSubmatch(out)
	if err != nil || rate == nil || done == nil {
		fmt.Fprintf(os.Stderr, "h2load %s: %v\n%s", t.grpc, err, out)
		return r
	}
	r.rps, _ = strconv.ParseFloat(string(rate[1]), 64)
	r.requests, _ = strconv.Atoi(string(done[2]))
	if m := h2MeanRE.FindSubmatch(out); m != nil {
		r.mean, _ = time.ParseDuration(string(m[1]))
	}
	if st := cmd.ProcessState; st != nil {
		r.clientCPU = (st.UserTime() + st.SystemTime()).Seconds() / d.Seconds()
	}
	waitIdle(t.pid)
	after, err := grpcSuccesses(t.metrics)
	if err != nil {
		fmt.Fprintf(os.Stderr, "h2load %s: %v\n", t.grpc, err)
		return result{}
	}
	// Only the calls the server answered with success count, in the
	// throughput and in the CPU per request: gRPC answers errors with
	// status 200, which h2load counts. Calls h2load gave up on at its
	// deadline may still succeed on the server: successes beyond
	// h2load's count are not counted.
	if ok := int(after - before); ok < r.requests {
		r.non2xx = r.requests - ok
		fmt.Fprintf(os.Stderr, "warning: gRPC %s answered %d calls without success\n", t.grpc, r.non2xx)
		r.rps *= float64(ok) / float64(r.requests)
		r.requests = ok
	}
	return r
}

// grpcSuccesses is the server's count of gRPC requests answered with
// success, over every model, from its metrics at base.
func grpcSuccesses(base string) (float64, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	var n float64
	for _, m := range grpcOKMetric.FindAllSubmatch(b, -1) {
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		n += v
	}
	return n, nil
}

var grpcloadRE = regexp.MustCompile(`requests (\d+) errors (\d+) rps ([0-9.]+) p50 (\S+) p99 (\S+) cpu ([0-9.]+)`)

// grpcLoad loads a gRPC address with bench/grpcload: streams calls in
// flight on one connection, on one thread.
func grpcLoad(addr string, typed bool, request string, streams int, d time.Duration) result {
	cmd := exec.Command(*grpcload, "-addr", addr, "-c", strconv.Itoa(streams), "-d", d.String(), "-typed="+strconv.FormatBool(typed), "-request", request)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	out, err := cmd.CombinedOutput()
	var r result
	m := grpcloadRE.FindSubmatch(out)
	if err != nil || m == nil {
		fmt.Fprintf(os.Stderr, "grpcload %s: %v\n%s", addr, err, out)
		return r
	}
	r.requests, _ = strconv.Atoi(string(m[1]))
	r.rps, _ = strconv.ParseFloat(string(m[3]), 64)
	r.p50, _ = time.ParseDuration(string(m[4]))
	r.p99, _ = time.ParseDuration(string(m[5]))
	r.clientCPU, _ = strconv.ParseFloat(string(m[6]), 64)
	if errs, _ := strconv.Atoi(string(m[2])); errs > 0 {
		r.non2xx = errs
		fmt.Fprintf(os.Stderr, "warning: gRPC %s answered %d errors\n", addr, errs)
	}
	return r
}

// reportGRPC is section 1b: single-row gRPC beside HTTP on the server at
// serve (HTTP) and grpcAddr, whose process is pid; dir holds the request
// files.
func reportGRPC(r *report, dir, serve, grpcAddr string, pid int, bodies map[string]string) error {
	digits := "/v2/models/digits/infer"
	raw, typed := filepath.Join(dir, "digits-raw.grpc"), filepath.Join(dir, "digits-typed.grpc")
	for _, f := range []struct {
		path  string
		typed bool
	}{{raw, false}, {typed, true}} {
		if out, err := exec.Command(*grpcload, "-typed="+strconv.FormatBool(f.typed), "-frame", f.path).CombinedOutput(); err != nil {
			return fmt.Errorf("grpcload -frame: %v\n%s", err, out)
		}
	}
	fmt.Fprintln(os.Stderr, "gRPC c=64")
	r.line("## 1b. gRPC serving: digits, single-row requests, 64 concurrent streams")
	r.line("")
	r.line("stepserve's gRPC API (inference.GRPCInferenceService ModelInfer) with 64 calls in flight on one connection, interleaved round by round with wrk on the same server's HTTP API at 64 connections. Two gRPC clients: h2load (nghttp2's C HTTP/2 load generator, one thread, posting the gRPC-framed request; the calls answered are the server's own count of gRPC successes), the counterpart of wrk, so the throughput ratio compares the servers; and `bench/grpcload`, a Go grpc-go client on one thread (GOMAXPROCS=1), what a Go user's client costs. Client and server share the 2 CPUs, so throughput carries each client's cost: server CPU per request (the server process's CPU time over the requests it answered in the round) is the server's own cost. Client CPU is the load generator's CPU time over wall time (1.00: its one thread saturated).")
	r.line("")
	r.line("| | client | throughput, latency | server CPU per request | client CPU | throughput / HTTP JSON | throughput / HTTP binary | server CPU / HTTP binary |")
	r.line("|---|---|---|---|---|---|---|---|")
	rs := interleaved(64,
		target{grpc: grpcAddr, h2: raw, metrics: serve, pid: pid},
		target{grpc: grpcAddr, h2: typed, metrics: serve, pid: pid},
		target{grpc: grpcAddr, pid: pid},
		target{grpc: grpcAddr, typed: true, pid: pid},
		target{url: serve + digits, script: bodies["binary"], pid: pid},
		target{url: serve + digits, script: bodies["json"], pid: pid})
	hb, hj := rs[4], rs[5]
	for i, row := range []struct{ name, client string }{
		{"gRPC, raw_input_contents", "h2load"}, {"gRPC, typed fp32_contents", "h2load"},
		{"gRPC, raw_input_contents", "grpcload (Go)"}, {"gRPC, typed fp32_contents", "grpcload (Go)"},
		{"HTTP binary tensors", "wrk"}, {"HTTP JSON", "wrk"},
	} {
		client := "-"
		if i < 4 {
			client = fmt.Sprintf("%.2f", rs[i].clientCPU)
		}
		r.line("| %s | %s | %s | %.1f µs | %s | %.2fx | %.2fx | %.2fx |", row.name, row.client, rs[i], rs[i].serverCPU, client, rs[i].rps/hj.rps, rs[i].rps/hb.rps, rs[i].serverCPU/hb.serverCPU)
	}
	r.line("")
	return nil
}

type stepRow struct {
	model, bucket string
	gflops        float64
	allocs        int
}

type stepRows struct {
	order []string
	rows  map[string]stepRow
}

func goBenchmarks() (stepRows, error) {
	tags := os.Getenv("GOTAGS")
	out, err := exec.Command("go", "test", "-timeout", "10m", "-tags", tags, "./engine/cpufallback", "-run", "^$", "-bench", "^(BenchmarkDigitsStep|BenchmarkEncoderStep)$", "-benchmem", "-benchtime", "1s").CombinedOutput()
	if err != nil {
		return stepRows{}, fmt.Errorf("go test -bench: %v\n%s", err, out)
	}
	rows := stepRows{rows: map[string]stepRow{}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		m := regexp.MustCompile(`^Benchmark(DigitsStep|EncoderStep)/(\S+?)-\d+\s.*?([0-9.]+) GFLOP/s.*?(\d+) allocs/op`).FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		model := map[string]string{"DigitsStep": "digits", "EncoderStep": "tiny-encoder"}[m[1]]
		g, _ := strconv.ParseFloat(m[3], 64)
		a, _ := strconv.Atoi(m[4])
		key := model + "/" + m[2]
		rows.order = append(rows.order, key)
		rows.rows[key] = stepRow{model, m[2], g, a}
	}
	return rows, nil
}

func numpyBenchmarks() (map[string]float64, error) {
	out, err := exec.Command(*python, "bench/encoder_numpy.py").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("numpy: %v\n%s", err, out)
	}
	res := map[string]float64{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 4 {
			if g, err := strconv.ParseFloat(f[3], 64); err == nil {
				res[f[0]+"/"+f[1]] = g
			}
		}
	}
	return res, nil
}

// roundTrip is BenchmarkStepRoundTrip's figures.
type roundTrip struct{ roundTripUS, hostUS, hostP90US, cpuUS, messageUS float64 }

func workerRoundTrip() (roundTrip, error) {
	out, err := exec.Command("go", "test", "-timeout", "10m", "./engine/rbln", "-run", "^$", "-bench", "^BenchmarkStepRoundTrip$", "-benchtime", "5000x").CombinedOutput()
	if err != nil {
		return roundTrip{}, fmt.Errorf("go test -bench: %v\n%s", err, out)
	}
	var t roundTrip
	torch := regexp.MustCompile(`BenchmarkStepRoundTrip/torch-\d+\s+\d+\s+([0-9.]+) ns/op\s+([0-9.]+) host-p90-µs/step\s+([0-9.]+) host-µs/step`).FindSubmatch(out)
	cpu := regexp.MustCompile(`BenchmarkStepRoundTrip/cpu-\d+\s+\d+\s+([0-9.]+) ns/op`).FindSubmatch(out)
	message := regexp.MustCompile(`BenchmarkStepRoundTrip/torch-message-\d+\s+\d+\s+[0-9.]+ ns/op\s+([0-9.]+) round-trip-µs`).FindSubmatch(out)
	if torch == nil || cpu == nil || message == nil {
		return roundTrip{}, fmt.Errorf("no round-trip figures in:\n%s", out)
	}
	f := func(b []byte) float64 { v, _ := strconv.ParseFloat(string(b), 64); return v }
	t.roundTripUS, t.hostP90US, t.hostUS, t.cpuUS = f(torch[1])/1e3, f(torch[2]), f(torch[3]), f(cpu[1])/1e3
	t.messageUS = f(message[1])
	return t, nil
}

// decodeTrip is one row of BenchmarkWorkerDecodeStep.
type decodeTrip struct {
	seqs                           int
	roundTripUS, hostUS, hostP90US float64
	eventfdUS, eventfdP90US        float64 // the supervisor waiting on the eventfd alone, no nap-then-poll
}

func workerDecodeTrips() ([]decodeTrip, error) {
	out, err := exec.Command("go", "test", "-timeout", "10m", "./engine/rbln", "-run", "^$", "-bench", "^BenchmarkWorkerDecodeStep$", "-benchtime", "300x").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("go test -bench: %v\n%s", err, out)
	}
	var trips []decodeTrip
	f := func(b []byte) float64 { v, _ := strconv.ParseFloat(string(b), 64); return v }
	row := regexp.MustCompile(`BenchmarkWorkerDecodeStep/seqs=(\d+)/nap=(true|false)-\d+\s+\d+\s+([0-9.]+) ns/op\s+([0-9.]+) host-p90-µs/step\s+([0-9.]+) host-µs/step`)
	for _, m := range row.FindAllSubmatch(out, -1) {
		seqs := int(f(m[1]))
		if string(m[2]) == "true" {
			trips = append(trips, decodeTrip{seqs: seqs, roundTripUS: f(m[3]) / 1e3, hostP90US: f(m[4]), hostUS: f(m[5])})
			continue
		}
		for i := range trips {
			if trips[i].seqs == seqs {
				trips[i].eventfdUS, trips[i].eventfdP90US = f(m[5]), f(m[4])
			}
		}
	}
	if len(trips) == 0 {
		return nil, fmt.Errorf("no decode step figures in:\n%s", out)
	}
	return trips, nil
}

type allocs struct{ allocs, bytes int }

func handlerAllocs() (allocs, error) {
	out, err := exec.Command("go", "test", "-timeout", "10m", "./server", "-run", "^$", "-bench", "^BenchmarkInferJSON$", "-benchmem").CombinedOutput()
	if err != nil {
		return allocs{}, fmt.Errorf("go test -bench: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`(\d+) B/op\s+(\d+) allocs/op`).FindSubmatch(out)
	if m == nil {
		return allocs{}, fmt.Errorf("no allocation figures in:\n%s", out)
	}
	a := allocs{}
	a.bytes, _ = strconv.Atoi(string(m[1]))
	a.allocs, _ = strconv.Atoi(string(m[2]))
	return a, nil
}
