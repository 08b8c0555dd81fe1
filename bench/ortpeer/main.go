// Command ortpeer measures the CPU engine's encoder step against ONNX
// Runtime on the same encoder, weights and token ids, in one process run
// with interleaved rounds, and prints the table of issue 20: sequences per
// second on each side, their ratio per round (median and spread), and how
// far each output is from torch's.
//
// The encoder (all-MiniLM-L6-v2's dimensions, random weights) is built by
// bench/onnx/make_encoder.py with Debian's torch from the golden-encoder
// module and exported to ONNX there; ONNX Runtime is onnxruntime-node from
// npm (bench/onnx/package-lock.json), run by bench/onnx/ort.js.
//
//	make bench-onnx
//	go run ./bench/ortpeer -rounds 7 -seconds 0.7 -kernels avx512,avx2,go
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/stepserve/stepserve/bench/internal/benchstat"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/models"
)

var (
	dir     = flag.String("dir", "bench/out/onnx", "where make_encoder.py writes the encoder, the ONNX export and the cases")
	python  = flag.String("python", "/usr/bin/python3", "the Python with Debian's torch")
	nodeBin = flag.String("node", "node", "node, to run bench/onnx/ort.js")
	rounds  = flag.Int("rounds", 5, "interleaved rounds")
	seconds = flag.Float64("seconds", 1, "seconds each side runs each shape each round")
	threads = flag.Int("threads", 0, "threads on each side: engine.cpu_threads and ONNX Runtime's intra-op threads (0: every CPU)")
	only    = flag.String("cases", "", "comma-separated case names to run (all when empty)")
	profile = flag.String("cpuprofile", "", "write a CPU profile of stepserve's side to this file (ONNX Runtime runs in its own process)")
	kernels = flag.String("kernels", "", "comma-separated kernel sets to compare (cpufallback.KernelNames, +bf16 for device_dtype bfloat16: avx512,avx512+bf16,avx2,go), all for every one, the best when empty")
	ortSpin = flag.Bool("ort-spin", true, "ONNX Runtime's intra-op threads spin while they wait (its default)")
	server  = flag.String("server", "", "the stepserve binary, to measure its HTTP binary path too (none when empty)")
)

type caseSpec struct {
	Name   string `json:"name"`
	Batch  int    `json:"batch"`
	Seq    int    `json:"seq"`
	Tokens int    `json:"tokens"`
}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ortpeer:", err)
		os.Exit(1)
	}
}

func run() error {
	if *threads == 0 {
		*threads = runtime.NumCPU()
	}
	if _, err := os.Stat(filepath.Join(*dir, "cases.json")); err != nil {
		cmd := exec.Command(*python, "bench/onnx/make_encoder.py", *dir)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building the encoder with %s bench/onnx/make_encoder.py: %w", *python, err)
		}
	}
	if _, err := os.Stat("bench/onnx/node_modules/onnxruntime-node"); err != nil {
		return fmt.Errorf("onnxruntime-node is not installed: run `npm ci --prefix bench/onnx` (its .npmrc skips the install script, which only fetches GPU extras from nuget.org)")
	}
	var manifest struct {
		Torch string     `json:"torch"`
		Cases []caseSpec `json:"cases"`
	}
	raw, err := os.ReadFile(filepath.Join(*dir, "cases.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &manifest); err != nil {
		return fmt.Errorf("%s/cases.json: %w", *dir, err)
	}
	cases := manifest.Cases
	if *only != "" {
		want := strings.Split(*only, ",")
		cases = slices.DeleteFunc(cases, func(c caseSpec) bool { return !slices.Contains(want, c.Name) })
	}

	// stepserve: the engine step on every case's bucket, one program per
	// kernel set compared (each packs the weights for its kernels).
	loadBefore := loadavg()
	cpufallback.SetThreads(*threads)
	m, err := models.Load(filepath.Join(*dir, "model"))
	if err != nil {
		return err
	}
	shapes := make([]bucketing.Shape, len(cases))
	for i, c := range cases {
		shapes[i] = bucketing.Shape{Batch: c.Batch, Seq: c.Seq}
	}
	sets := cpufallback.KernelNames()[:1]
	switch *kernels {
	case "":
	case "all":
		// Every set this build and CPU run, and bfloat16 where it has it.
		sets = cpufallback.KernelNames()
		if cpufallback.BFloat16() {
			sets = slices.Insert(sets, 1, sets[0]+"+bf16")
		}
	default:
		sets = strings.Split(*kernels, ",")
	}
	progs := make([]engine.Program, len(sets))
	outs := make([][][]float32, len(sets))
	for s, set := range sets {
		// "avx512+bf16": the same kernels, the model's device_dtype bfloat16.
		kset, bf16 := strings.CutSuffix(set, "+bf16")
		if err := cpufallback.SetKernels(kset); err != nil {
			return err
		}
		mod := m
		if bf16 {
			if mod, err = models.Load(filepath.Join(*dir, "model")); err != nil {
				return err
			}
			mod.Config.DeviceDtype = "bfloat16"
		}
		progs[s], err = cpufallback.Engine{}.Load(context.Background(), mod, shapes)
		if err != nil {
			return err
		}
		if outs[s], err = prepare(progs[s], m, shapes, cases); err != nil {
			return err
		}
	}
	stepRun := func(s, i int, c caseSpec) (float64, error) {
		kset, _ := strings.CutSuffix(sets[s], "+bf16")
		if err := cpufallback.SetKernels(kset); err != nil {
			return 0, err
		}
		prog := progs[s]
		if _, err := prog.Step(context.Background(), i); err != nil { // warm
			return 0, err
		}
		start := time.Now()
		runs := 0
		for runs < 2 || time.Since(start).Seconds() < *seconds {
			if _, err := prog.Step(context.Background(), i); err != nil {
				return 0, err
			}
			runs++
		}
		return float64(runs*c.Batch) / time.Since(start).Seconds(), nil
	}

	// ONNX Runtime: one node process, asked one measurement at a time.
	node := exec.Command(*nodeBin, "bench/onnx/ort.js", filepath.Join(*dir, "encoder.onnx"), fmt.Sprint(*threads))
	node.Stderr = os.Stderr
	node.Env = append(os.Environ(), fmt.Sprintf("ORT_SPIN=%d", map[bool]int{false: 0, true: 1}[*ortSpin]))
	stdin, err := node.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := node.StdoutPipe()
	if err != nil {
		return err
	}
	if err := node.Start(); err != nil {
		return err
	}
	defer node.Process.Kill()
	answers := bufio.NewScanner(stdout)
	var hello struct {
		Version string `json:"version"`
	}
	if !answers.Scan() || json.Unmarshal(answers.Bytes(), &hello) != nil {
		return fmt.Errorf("ort.js did not start")
	}
	ortRun := func(c caseSpec) (float64, error) {
		q, _ := json.Marshal(map[string]any{"dir": *dir, "case": c.Name, "batch": c.Batch, "seq": c.Seq, "seconds": *seconds})
		if _, err := stdin.Write(append(q, '\n')); err != nil {
			return 0, err
		}
		var a struct {
			Runs    int     `json:"runs"`
			Seconds float64 `json:"seconds"`
		}
		if !answers.Scan() {
			return 0, fmt.Errorf("ort.js stopped: %v", answers.Err())
		}
		if err := json.Unmarshal(answers.Bytes(), &a); err != nil {
			return 0, err
		}
		return float64(a.Runs*c.Batch) / a.Seconds, nil
	}
	if *profile != "" {
		f, err := os.Create(*profile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	// The server, when asked: its own process, its best kernels.
	var peer *httpPeer
	var httpOuts [][]float32
	if *server != "" {
		if peer, err = startHTTPPeer(*server, *dir, *threads, cases); err != nil {
			return err
		}
		defer peer.stop()
		for _, c := range cases {
			out, err := peer.infer(c)
			if err != nil {
				return err
			}
			httpOuts = append(httpOuts, out)
		}
	}
	// Side 0 is ONNX Runtime, side 1+s kernel set s, the last the HTTP
	// path when measured; each round starts with another side, so that
	// none always runs on a machine another just warmed (or just left
	// busy).
	sides := 1 + len(sets)
	if peer != nil {
		sides++
	}
	rate := make([][][]float64, len(cases)) // [case][side][round]
	for i := range rate {
		rate[i] = make([][]float64, sides)
	}
	for r := range *rounds {
		for i, c := range cases {
			for o := range sides {
				side := (o + r) % sides
				var v float64
				var err error
				switch {
				case side == 0:
					v, err = ortRun(c)
				case side == 1+len(sets):
					v, err = peer.rate(c, *seconds)
				default:
					v, err = stepRun(side-1, i, c)
				}
				if err != nil {
					return err
				}
				rate[i][side] = append(rate[i][side], v)
			}
		}
		fmt.Fprintf(os.Stderr, "round %d of %d done\n", r+1, *rounds)
	}

	fmt.Printf("ONNX Runtime %s (onnxruntime-node, CPU EP, %d intra-op threads, spinning %v) against stepserve's CPU engine step (engine.cpu_threads %d) with kernels %s, %d interleaved rounds of %gs a side; %s\n",
		hello.Version, *threads, *ortSpin, *threads, strings.Join(sets, ", "), *rounds, *seconds, benchstat.CPULine())
	fmt.Printf("Encoder: all-MiniLM-L6-v2's dimensions (vocab 30522, hidden 384, 6 layers, 12 heads, intermediate 1536), random weights, mean pooling; torch %s reference. Load average before: %s, after: %s\n\n", manifest.Torch, loadBefore, loadavg())
	fmt.Println("| shape | tokens | ONNX Runtime seq/s | kernels | stepserve seq/s | ratio (median) | ratio spread | max abs diff to torch (stepserve, ORT) | min cosine to torch |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for i, c := range cases {
		ref, err := readFloats(filepath.Join(*dir, c.Name+".torch.bin"))
		if err != nil {
			return err
		}
		ortOut, err := readFloats(filepath.Join(*dir, c.Name+".ort.bin"))
		if err != nil {
			return err
		}
		for s, set := range sets {
			ratios := make([]float64, *rounds)
			for r := range ratios {
				ratios[r] = rate[i][1+s][r] / rate[i][0][r]
			}
			fmt.Printf("| %d x %d%s | %d | %.1f | %s | %.1f | **%.2fx** | %.2f-%.2f | %.2g, %.2g | %.6f |\n",
				c.Batch, c.Seq, strings.TrimPrefix(c.Name, fmt.Sprintf("%dx%d", c.Batch, c.Seq)), c.Tokens,
				benchstat.Median(rate[i][0]), set, benchstat.Median(rate[i][1+s]), benchstat.Median(ratios), slices.Min(ratios), slices.Max(ratios),
				maxDiff(outs[s][i], ref), maxDiff(ortOut, ref), minCosine(outs[s][i], ref, c.Batch))
		}
	}
	if peer == nil {
		return nil
	}
	fmt.Printf("\nThe same cases through stepserve's HTTP API (its binary tensor extension: the token tensors as raw bytes after the JSON header, the embeddings back the same way), one client sending back to back, against ONNX Runtime's run call in the same rounds; the server's own kernels (%s), engine.cpu_threads %d, on loopback:\n\n", cpufallback.KernelNames()[0], *threads)
	fmt.Println("| shape | ONNX Runtime seq/s | stepserve HTTP binary seq/s | ratio (median) | ratio spread | max abs diff to torch |")
	fmt.Println("|---|---|---|---|---|---|")
	for i, c := range cases {
		ref, err := readFloats(filepath.Join(*dir, c.Name+".torch.bin"))
		if err != nil {
			return err
		}
		h := sides - 1
		ratios := make([]float64, *rounds)
		for r := range ratios {
			ratios[r] = rate[i][h][r] / rate[i][0][r]
		}
		fmt.Printf("| %d x %d%s | %.1f | %.1f | **%.2fx** | %.2f-%.2f | %.2g |\n",
			c.Batch, c.Seq, strings.TrimPrefix(c.Name, fmt.Sprintf("%dx%d", c.Batch, c.Seq)),
			benchstat.Median(rate[i][0]), benchstat.Median(rate[i][h]), benchstat.Median(ratios), slices.Min(ratios), slices.Max(ratios), maxDiff(httpOuts[i], ref))
	}
	return nil
}

// prepare copies each case's token ids and mask into its bucket's staging,
// steps once, and returns the outputs.
func prepare(prog engine.Program, m *models.Model, shapes []bucketing.Shape, cases []caseSpec) ([][]float32, error) {
	outs := make([][]float32, len(cases))
	for i, c := range cases {
		if err := prog.Compile(context.Background(), i); err != nil {
			return nil, err
		}
		in, out := prog.Staging(i)
		l := engine.NewLayout(m.Config, shapes[i])
		clear(in)
		for _, t := range []struct {
			input int
			kind  string
		}{{models.EncoderInputIDs, "ids"}, {models.EncoderAttentionMask, "mask"}} {
			b, err := os.ReadFile(filepath.Join(*dir, c.Name+"."+t.kind+".bin"))
			if err != nil {
				return nil, err
			}
			tl := l.Inputs[t.input]
			if len(b) != tl.Bytes {
				return nil, fmt.Errorf("case %s: %s holds %d bytes, the bucket's tensor %d", c.Name, t.kind, len(b), tl.Bytes)
			}
			copy(in[tl.Offset:], b)
		}
		if _, err := prog.Step(context.Background(), i); err != nil {
			return nil, err
		}
		outs[i] = slices.Clone(unsafe.Slice((*float32)(unsafe.Pointer(&out[0])), len(out)/4))
	}
	return outs, nil
}

func readFloats(path string) ([]float32, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f := make([]float32, len(b)/4)
	for i := range f {
		f[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return f, nil
}

func maxDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

// minCosine is the smallest cosine between a row of a and the same row of
// b, rows of len(a)/rows floats.
func minCosine(a, b []float32, rows int) float64 {
	if len(a) != len(b) || rows == 0 {
		return math.NaN()
	}
	w, worst := len(a)/rows, 1.0
	for r := range rows {
		var ab, aa, bb float64
		for j := r * w; j < (r+1)*w; j++ {
			x, y := float64(a[j]), float64(b[j])
			ab, aa, bb = ab+x*y, aa+x*x, bb+y*y
		}
		worst = min(worst, ab/math.Sqrt(aa*bb))
	}
	return worst
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
