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
	"bytes"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
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

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
