package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
)

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
