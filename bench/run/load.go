package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

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
