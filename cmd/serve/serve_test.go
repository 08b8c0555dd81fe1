package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/config"
)

// binPath is the server binary, built once for every test in this file.
var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "stepserve-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "stepserve")
	// Every server a test starts serves gRPC on a free loopback port, not
	// on the default :8001 that servers started side by side would share.
	os.Setenv("STEPSERVE_SERVER_GRPC_ADDR", "127.0.0.1:0")
	// The server under test is built without build tags, whatever CPU
	// runs the tests (it was built with OpenBLAS only where the native
	// kernels were missing, so which build was tested depended on the
	// CPU). On every CPU with AVX2 the products run on the native kernels
	// in both builds; the OpenBLAS build adds about 100 MiB of address
	// space at start, which the hostile tests' address-space caps are not
	// sized for.
	args := []string{"build", "-o", binPath}
	build := exec.Command("go", append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the server:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// process is a running server.
type process struct {
	cmd  *exec.Cmd
	base string
	// grpc is the gRPC API's address (host:port), when the server serves
	// it.
	grpc string
	logs *logBuffer
	done chan error
}

// logBuffer is the server's log, written by the reader goroutine and read
// by the test.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) WriteString(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.WriteString(s)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var (
	addrRE      = regexp.MustCompile(`msg=serving addr=(\S+)`)
	grpcAddrRE  = regexp.MustCompile(`msg="serving grpc" addr=(\S+)`)
	metricsAddr = regexp.MustCompile(`msg="serving metrics" addr=(\S+)`)
)

// runBinary runs the server to completion (for start-up failures) and
// returns its output.
func runBinary(args ...string) (string, error) {
	out, err := exec.Command(binPath, args...).CombinedOutput()
	return string(out), err
}

// start runs the real binary on a free loopback port and waits until it
// reports ready.
func start(t *testing.T, args ...string) *process {
	t.Helper()
	return startCmd(t, exec.Command(binPath, append([]string{"--server.addr", "127.0.0.1:0", "--model_repository", "../../model_repository"}, args...)...))
}

// hostileMemoryCap is the address space the hostile tests give the server:
// an allocation the request bounds missed then kills it (Go's "fatal error:
// out of memory") instead of slowing the machine.
const hostileMemoryCap = 2 << 30

// startCapped is start under an address-space cap of capBytes
// (prlimit --as): the process is the server itself, exec'd by prlimit.
func startCapped(t *testing.T, capBytes int64, args ...string) *process {
	t.Helper()
	return startCmd(t, cappedCmd([]string{"--as=" + strconv.FormatInt(capBytes, 10)}, args))
}

// cappedCmd runs the server under prlimit with limits, as the image runs
// it: glibc reserves 64 MiB of address space per thread arena, which under
// a cap is memory the heap (and the memory budgets read from the cap)
// cannot have, so arenas are limited to two (Containerfile).
func cappedCmd(limits, args []string) *exec.Cmd {
	argv := append(append(limits, "--", binPath, "--server.addr", "127.0.0.1:0", "--model_repository", "../../model_repository"), args...)
	cmd := exec.Command("prlimit", argv...)
	cmd.Env = append(os.Environ(), "MALLOC_ARENA_MAX=2")
	return cmd
}

// rss is the server's resident set size now.
func (p *process) rss(t *testing.T) int64 { return p.status(t, "VmRSS") }

// peakRSS is the server's peak resident set size so far (VmHWM).
func (p *process) peakRSS(t *testing.T) int64 { return p.status(t, "VmHWM") }

// status reads a size in kB from the server's /proc status, in bytes.
func (p *process) status(t *testing.T, key string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	require.NoError(t, err, "the server is gone")
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc status", key)
	return 0
}

// alive reports whether the server process is still running.
func (p *process) alive() bool {
	select {
	case err := <-p.done:
		p.done <- err
		return false
	default:
		return true
	}
}

func startCmd(t *testing.T, cmd *exec.Cmd) *process {
	t.Helper()
	return startCmdWithin(t, cmd, 30*time.Second)
}

// startCmdWithin is startCmd for a server whose models take up to ready
// to load (compiled ones).
func startCmdWithin(t *testing.T, cmd *exec.Cmd, ready time.Duration) *process {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &process{cmd: cmd, logs: &logBuffer{}, done: make(chan error, 1)}
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("server log:\n%s", p.logs)
		}
	})

	addr, grpcAddr := make(chan string, 1), make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.logs.WriteString(line + "\n")
			if m := addrRE.FindStringSubmatch(line); m != nil {
				addr <- m[1]
			}
			if m := grpcAddrRE.FindStringSubmatch(line); m != nil {
				grpcAddr <- m[1] // logged before addr, when served
			}
		}
		p.done <- cmd.Wait()
	}()
	select {
	case a := <-addr:
		p.base = "http://" + a
		select {
		case p.grpc = <-grpcAddr:
		default:
		}
	case err := <-p.done:
		p.done <- err
		t.Fatalf("server exited before serving (%v); log:\n%s", err, p.logs)
	case <-time.After(ready):
		t.Fatalf("server did not report its address; log:\n%s", p.logs)
	}
	deadline := time.Now().Add(ready)
	for {
		resp, err := http.Get(p.base + "/v2/health/ready")
		if err == nil {
			resp.Body.Close()
			// Ready, and said so: the announcement is in the log, so a
			// test counting log lines from here counts its own.
			if logs := p.logs.String(); resp.StatusCode == 200 && (strings.Contains(logs, "msg=ready") || strings.Contains(logs, `"msg":"ready"`)) {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not ready after %s; log:\n%s", ready, p.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type digit struct {
	pixels []float32
	label  int
	want   int // the class the model answers alone, where a test needs it
}

func heldout(t *testing.T) []digit {
	f, err := os.Open("testdata/digits-heldout.csv")
	require.NoError(t, err)
	defer f.Close()
	r := csv.NewReader(f)
	r.Comment = '#'
	recs, err := r.ReadAll()
	require.NoError(t, err)
	out := make([]digit, len(recs))
	for i, rec := range recs {
		require.Len(t, rec, 65)
		for _, s := range rec[:64] {
			v, err := strconv.Atoi(s)
			require.NoError(t, err)
			out[i].pixels = append(out[i].pixels, float32(v))
		}
		out[i].label, err = strconv.Atoi(rec[64])
		require.NoError(t, err)
	}
	return out
}

type inferResponse struct {
	ID      string `json:"id"`
	Outputs []struct {
		Name       string
		Shape      []int
		Data       []float32
		Parameters map[string]int
	}
}

func argmax(p []float32) int {
	best := 0
	for i := range p {
		if p[i] > p[best] {
			best = i
		}
	}
	return best
}

func post(t *testing.T, url string, body []byte, headers ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest("POST", url, bytes.NewReader(body))
	require.NoError(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

func jsonRequest(id string, rows []digit) []byte {
	var data []float32
	for _, d := range rows {
		data = append(data, d.pixels...)
	}
	b, _ := json.Marshal(map[string]any{
		"id": id,
		"inputs": []map[string]any{{
			"name": "pixels", "datatype": "FP32", "shape": []int{len(rows), 64}, "data": data,
		}},
	})
	return b
}

// classifyJSON sends each digit as its own single-row JSON request.
func classifyJSON(t *testing.T, base string, digits []digit) float64 {
	correct := 0
	for i, d := range digits {
		resp, body := post(t, base+"/v2/models/digits/infer", jsonRequest(strconv.Itoa(i), []digit{d}))
		require.Equal(t, 200, resp.StatusCode, string(body))
		var r inferResponse
		require.NoError(t, json.Unmarshal(body, &r))
		require.Equal(t, strconv.Itoa(i), r.ID)
		require.Equal(t, []int{1, 10}, r.Outputs[0].Shape)
		var sum float64
		for _, p := range r.Outputs[0].Data {
			sum += float64(p)
		}
		require.InDelta(t, 1, sum, 1e-4, "probabilities sum to 1")
		if argmax(r.Outputs[0].Data) == d.label {
			correct++
		}
	}
	return float64(correct) / float64(len(digits))
}

// classifyBinary sends the digits in binary requests of 50 rows, larger than
// the largest bucket (32), so that requests are split across steps.
func classifyBinary(t *testing.T, base string, digits []digit) float64 {
	correct := 0
	for start := 0; start < len(digits); start += 50 {
		rows := digits[start:min(start+50, len(digits))]
		header := fmt.Sprintf(`{"inputs":[{"name":"pixels","datatype":"FP32","shape":[%d,64],"parameters":{"binary_data_size":%d}}],"outputs":[{"name":"probabilities","parameters":{"binary_data":true}}]}`, len(rows), len(rows)*64*4)
		body := []byte(header)
		for _, d := range rows {
			for _, v := range d.pixels {
				body = binary.LittleEndian.AppendUint32(body, math.Float32bits(v))
			}
		}
		resp, out := post(t, base+"/v2/models/digits/infer", body,
			"Inference-Header-Content-Length", strconv.Itoa(len(header)), "Content-Type", "application/octet-stream")
		require.Equal(t, 200, resp.StatusCode, string(out))
		n, err := strconv.Atoi(resp.Header.Get("Inference-Header-Content-Length"))
		require.NoError(t, err)
		var r inferResponse
		require.NoError(t, json.Unmarshal(out[:n], &r))
		require.Equal(t, len(rows)*40, r.Outputs[0].Parameters["binary_data_size"])
		probs := out[n:]
		require.Len(t, probs, len(rows)*40)
		for i, d := range rows {
			p := make([]float32, 10)
			for k := range p {
				p[k] = math.Float32frombits(binary.LittleEndian.Uint32(probs[(i*10+k)*4:]))
			}
			if argmax(p) == d.label {
				correct++
			}
		}
	}
	return float64(correct) / float64(len(digits))
}

func TestServeDigitsEndToEnd(t *testing.T) {
	p := start(t, "--server.max_body_bytes", "64KiB")
	digits := heldout(t)
	require.GreaterOrEqual(t, len(digits), 350, "at least 20% of 1797 rows are held out")

	accJSON := classifyJSON(t, p.base, digits)
	accBinary := classifyBinary(t, p.base, digits)
	t.Logf("held-out accuracy over HTTP: JSON %.4f, binary %.4f (%d digits)", accJSON, accBinary, len(digits))
	assert.GreaterOrEqual(t, accJSON, 0.96)
	assert.Equal(t, accJSON, accBinary, "JSON and binary requests give the same classifications")

	infer := p.base + "/v2/models/digits/infer"
	pixels := func(shape string, data string) string {
		return `{"inputs":[{"name":"pixels","datatype":"FP32","shape":` + shape + `,"data":` + data + `}]}`
	}
	const lyingHeader = `{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,64],"parameters":{"binary_data_size":100}}]}`
	zeros := func(n int) string { return "[" + strings.TrimSuffix(strings.Repeat("0,", n), ",") + "]" }
	bad := []struct {
		name    string
		url     string
		body    string
		headers []string
		status  int
		want    string
	}{
		{"malformed JSON", infer, `{"inputs": [`, nil, 400, "malformed JSON"},
		{"unknown model", p.base + "/v2/models/mnist/infer", pixels("[1,64]", zeros(64)), nil, 404, `Request for unknown model: 'mnist' is not found`},
		{"unknown version", p.base + "/v2/models/digits/versions/9/infer", pixels("[1,64]", zeros(64)), nil, 404, `Request for unknown model: 'digits' version 9 is not found`},
		{"unknown input", infer, `{"inputs":[{"name":"image","datatype":"FP32","shape":[1,64],"data":` + zeros(64) + `}]}`, nil, 400, `unknown input "image"; model digits takes "pixels" (FP32 [-1 64])`},
		{"missing input", infer, `{"inputs":[]}`, nil, 400, `request has no inputs`},
		{"wrong datatype", infer, `{"inputs":[{"name":"pixels","datatype":"INT32","shape":[1,64],"data":` + zeros(64) + `}]}`, nil, 400, `input "pixels": datatype INT32, want FP32`},
		{"wrong shape", infer, pixels("[1,63]", zeros(63)), nil, 400, `input "pixels": shape [1 63], want [-1 64]`},
		{"wrong rank", infer, pixels("[64]", zeros(64)), nil, 400, `shape [64] has 1 dimensions, want 2`},
		{"data shorter than shape", infer, pixels("[2,64]", zeros(64)), nil, 400, `shape [2 64] needs 128 values, data has 64`},
		{"data longer than shape", infer, pixels("[1,64]", zeros(65)), nil, 400, `more values than the shape holds (64)`},
		{"NaN", infer, pixels("[1,64]", "[NaN,"+zeros(63)[1:]), nil, 400, `NaN is not a JSON number; values must be finite`},
		{"Inf", infer, pixels("[1,64]", "[1e40,"+zeros(63)[1:]), nil, 400, `1e40 is not a finite FP32 value`},
		{"string value", infer, pixels("[1,64]", `["7",`+zeros(63)[1:]), nil, 400, `element 0 is a string`},
		{"body over the limit", infer, pixels("[1,64]", zeros(64)) + strings.Repeat(" ", 70<<10), nil, 413, `exceeds the 65536-byte limit (server.max_body_bytes)`},
		{"binary header length past body", infer, `{"inputs":[]}`, []string{"Inference-Header-Content-Length", "4096"}, 400, `Inference-Header-Content-Length 4096 exceeds`},
		{"binary size that lies", infer, lyingHeader + strings.Repeat("\x00", 100), []string{"Inference-Header-Content-Length", strconv.Itoa(len(lyingHeader))}, 400, `binary_data_size is 100 bytes, but FP32 [1 64] needs 256`},
		{"huge declared shape", infer, pixels("[1000000000,64]", zeros(64)), nil, 400, `above the limit of 16777216 (server.max_request_elements)`},
		{"unknown output", infer, `{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,64],"data":` + zeros(64) + `}],"outputs":[{"name":"logits"}]}`, nil, 400, `unknown output "logits"; model digits gives "probabilities"`},
		{"wrong method", p.base + "/v2/health/live", `{}`, nil, 405, `method POST is not allowed`},
	}
	for _, tt := range bad {
		resp, body := post(t, tt.url, []byte(tt.body), tt.headers...)
		assert.Equal(t, tt.status, resp.StatusCode, "%s: %s", tt.name, body)
		var e struct{ Error string }
		require.NoError(t, json.Unmarshal(body, &e), "%s: body %q", tt.name, body)
		assert.Contains(t, e.Error, tt.want, tt.name)
	}

	// The server still answers correctly after the bad requests.
	assert.GreaterOrEqual(t, classifyJSON(t, p.base, digits[:20]), 0.9)

	resp, err := http.Get(p.base + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantSuccess := len(digits) + (len(digits)+49)/50 + 20
	assert.Contains(t, string(metrics), fmt.Sprintf(`stepserve_requests_total{model="digits",outcome="success",protocol="http"} %d`, wantSuccess))
	assert.Contains(t, string(metrics), `stepserve_requests_total{model="digits",outcome="invalid",protocol="http"} 16`)
	assert.Regexp(t, `stepserve_build_info\{blas="(native|gonum|openblas)",go_version="[^"]+",kernels="(avx512|avx2|go)"`, string(metrics))

	// SIGTERM: stop accepting, finish, exit 0.
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		assert.NoError(t, err, "exit status after SIGTERM")
	case <-time.After(15 * time.Second):
		t.Fatal("server did not exit within 15s of SIGTERM")
	}
	assert.Contains(t, p.logs.String(), "shutting down")
}

func TestStartupErrors(t *testing.T) {
	out, err := exec.Command(binPath, "--log.format", "yaml", "--model_repository", "../../model_repository").CombinedOutput()
	require.Error(t, err)
	assert.Equal(t, 2, err.(*exec.ExitError).ExitCode())
	assert.Contains(t, string(out), `log.format: "yaml"; want text or json`)

	repo := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(repo, "broken"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(repo, "broken", "model.yaml"), []byte("architecture: mlp\n"), 0o644))
	out, err = exec.Command(binPath, "--model_repository", repo, "--server.addr", "127.0.0.1:0").CombinedOutput()
	require.Error(t, err)
	assert.Equal(t, 1, err.(*exec.ExitError).ExitCode())
	assert.Contains(t, string(out), "broken/model.yaml")
	assert.Contains(t, string(out), "inputs: at least one is required")
}

func TestVersionFlag(t *testing.T) {
	out, err := exec.Command(binPath, "--version").Output()
	require.NoError(t, err)
	assert.Regexp(t, `^stepserve \S+ \(go1\.\d+.*, blas \w+, kernels \w+\)\n$`, string(out))
}

// TestStartupAnnouncement: once ready, the server says where, whether its
// APIs ask for tokens, what it serves, and a first request to try.
func TestStartupAnnouncement(t *testing.T) {
	p := start(t)
	require.Eventually(t, func() bool { return strings.Contains(p.logs.String(), "try: curl") }, 10*time.Second, 10*time.Millisecond)
	logs := p.logs.String()
	assert.Contains(t, logs, "stepserve is ready on "+p.base+"  (inference: open; repository API: off (server.enable_model_control))")
	assert.Regexp(t, `digits\s+cpu\s+1/1\s+\[1 4 16 32\]\s+pixels FP32\[-1 64\] -> probabilities FP32\[-1 10\]\s+\d+\.\ds`, logs)
	assert.Contains(t, logs, "try: curl -s "+p.base+"/v2/models/digits\n")
}

// TestJSONLogDurations: durations in JSON logs read as Go writes them
// ("30s"), not as nanoseconds.
func TestJSONLogDurations(t *testing.T) {
	var buf bytes.Buffer
	logger, _ := newLogger(config.Log{Format: "json", Level: slog.LevelInfo}, &buf)
	logger.Info("x", "grace", 30*time.Second)
	assert.Contains(t, buf.String(), `"grace":"30s"`)
}

// get GETs url and returns the response and its body.
func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}
