package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

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
