package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// patient answers or gives up: a check that would hang on a server that
// stopped accepting fails instead.
var patient = &http.Client{Timeout: 10 * time.Second}

// startCappedFiles is startCapped with the descriptor table capped too
// (prlimit --nofile sets the soft and hard limits to files).
func startCappedFiles(t *testing.T, files int, args ...string) *process {
	t.Helper()
	return startCmd(t, cappedCmd([]string{"--as=" + strconv.FormatInt(hostileMemoryCap, 10), "--nofile=" + strconv.Itoa(files)}, args))
}

// metricsBase is the address of the server's separate metrics listener.
func (p *process) metricsBase(t *testing.T) string {
	t.Helper()
	m := metricsAddr.FindStringSubmatch(p.logs.String())
	require.NotNil(t, m, "the metrics listener is logged")
	return "http://" + m[1]
}

// probe is GET url's status and how long it took; 0 if no answer came.
func probe(url string) (int, time.Duration) {
	start := time.Now()
	resp, err := patient.Get(url)
	if err != nil {
		return 0, time.Since(start)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, time.Since(start)
}

// withAuthorization is do with the Authorization header as given.
func withAuthorization(t *testing.T, url, authorization, body string) int {
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", authorization)
	resp, err := patient.Do(req)
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestRepositoryAPINeedsItsOwnToken: with model control on and a token on
// inference, a repository API without a token is a mistake the server
// refuses to start with, unless anonymous access is chosen explicitly.
func TestRepositoryAPINeedsItsOwnToken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	begin := time.Now()
	out, err := exec.CommandContext(ctx, binPath, "--server.addr", "127.0.0.1:0", "--model_repository", "../../model_repository",
		"--server.enable_model_control", "--auth.inference.token", "inference-token-0123456789").CombinedOutput()
	t.Logf("start with model control and an inference token only: %v after %v", err, time.Since(begin).Round(time.Millisecond))
	require.Error(t, err)
	require.NotErrorIs(t, ctx.Err(), context.DeadlineExceeded, "the server started and served; log:\n%s", out)
	assert.Equal(t, 2, err.(*exec.ExitError).ExitCode())
	for _, key := range []string{"auth.repository.token", "auth.repository.token_file", "auth.repository.allow_anonymous", "server.enable_model_control"} {
		assert.Contains(t, string(out), key)
	}
	assert.NotContains(t, string(out), "inference-token-0123456789", "a token is never echoed")

	// Chosen explicitly: the repository API is open, inference is not.
	p := startCapped(t, hostileMemoryCap, "--model_repository", hostileRepo(t), "--server.enable_model_control", "--auth.inference.token", "inference-token-0123456789",
		"--auth.repository.allow_anonymous")
	assert.Equal(t, 200, do(t, "POST", p.base+"/v2/repository/index", "", ""))
	assert.Equal(t, 401, do(t, "GET", p.base+"/v2/models/digits", "", ""))
	assert.Equal(t, 200, do(t, "GET", p.base+"/v2/models/digits", "inference-token-0123456789", ""))
	assert.Contains(t, p.logs.String(), "level=WARN", "anonymous model control is logged at start")
	assert.True(t, p.alive())
}

// TestSIGHUPReloadsTokenFiles: SIGHUP re-reads the token files without a
// restart; a bad file keeps the old tokens; the server keeps serving; the
// scheme is matched whatever its case; no token reaches the log.
func TestSIGHUPReloadsTokenFiles(t *testing.T) {
	const oldToken, newToken = "old-token-0123456789", "new-token-0123456789"
	file := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(file, []byte(oldToken+"\n"), 0o600))
	p := startCapped(t, hostileMemoryCap, "--model_repository", hostileRepo(t), "--auth.inference.token_file", file)
	infer := p.base + "/v2/models/digits/infer"
	body := string(jsonRequest("a", heldout(t)[:1]))
	rss0 := p.rss(t)

	for _, scheme := range []string{"Bearer", "bearer", "BEARER", "bEaReR"} {
		assert.Equal(t, 200, withAuthorization(t, infer, scheme+" "+oldToken, body), scheme)
	}
	assert.Equal(t, 401, withAuthorization(t, infer, "Basic "+oldToken, body))
	assert.Equal(t, 401, do(t, "POST", infer, newToken, body))

	require.NoError(t, os.WriteFile(file, []byte("# rotated\n"+newToken+"\n"), 0o600))
	begin := time.Now()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
	assert.Eventually(t, func() bool { return p.alive() && do(t, "POST", infer, newToken, body) == 200 }, 10*time.Second, 20*time.Millisecond,
		"the new token is accepted after SIGHUP")
	t.Logf("SIGHUP: alive %v, new token accepted after %v", p.alive(), time.Since(begin).Round(time.Millisecond))
	require.True(t, p.alive(), "SIGHUP must not stop the server")
	assert.Equal(t, 401, do(t, "POST", infer, oldToken, body), "the old token is gone")

	// A bad file on reload: an error in the log, the tokens in force stay.
	require.NoError(t, os.WriteFile(file, []byte("short\n"), 0o600))
	logLen := len(p.logs.String())
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
	assert.Eventually(t, func() bool { return strings.Contains(p.logs.String()[logLen:], "level=ERROR") }, 10*time.Second, 20*time.Millisecond,
		"a bad token file is logged")
	require.True(t, p.alive())
	assert.Equal(t, 200, do(t, "POST", infer, newToken, body), "the tokens in force stay")
	assert.Equal(t, 401, do(t, "POST", infer, "short", body))

	logs := p.logs.String()
	for _, tok := range []string{oldToken, newToken, "short\""} {
		assert.NotContains(t, logs, tok, "a token is never logged")
	}
	assert.Contains(t, logs, "auth.inference", "the reload says which scope changed")
	assert.Equal(t, heldout(t)[0].label, classifyWith(t, p.base, newToken, heldout(t)[0]))
	assert.Less(t, p.rss(t), rss0+64<<20)
}

// classifyWith is classifyOne with a bearer token.
func classifyWith(t *testing.T, base, token string, d digit) int {
	t.Helper()
	resp, body := post(t, base+"/v2/models/digits/infer", jsonRequest("x", []digit{d}), "Authorization", "Bearer "+token)
	require.Equal(t, 200, resp.StatusCode, string(body))
	var r inferResponse
	require.NoError(t, json.Unmarshal(body, &r))
	return argmax(r.Outputs[0].Data)
}

// idleConns opens n connections to addr at once that then sit idle: half
// send nothing at all, half make one keep-alive request first. It returns
// the connections and how many of those requests were answered within 3s.
func idleConns(t *testing.T, addr string, n int) ([]net.Conn, int) {
	t.Helper()
	conns := make([]net.Conn, n)
	answered := make([]bool, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", addr, 3*time.Second)
			if err != nil {
				return
			}
			conns[i] = c
			if i%2 == 1 {
				return
			}
			c.SetDeadline(time.Now().Add(3 * time.Second))
			defer c.SetDeadline(time.Time{})
			if _, err := io.WriteString(c, "GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				return
			}
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				answered[i] = true
			}
		})
	}
	wg.Wait()
	var open []net.Conn
	ok := 0
	for i, c := range conns {
		if c != nil {
			open = append(open, c)
		}
		if answered[i] {
			ok++
		}
	}
	t.Cleanup(func() { closeAll(open) })
	return open, ok
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// TestConnectionCap: with server.max_connections 50, 200 idle connections
// neither stop the server nor its probes on the metrics listener, and
// inference still gets through (the longest-idle connection makes room).
func TestConnectionCap(t *testing.T) {
	p := startCapped(t, hostileMemoryCap, "--model_repository", hostileRepo(t),
		"--server.max_connections", "50", "--server.metrics_addr", "127.0.0.1:0")
	mbase := p.metricsBase(t)
	rss0 := p.rss(t)

	conns := idleAndProbed(t, p, mbase, 200)
	m := scrape(t, mbase)
	open := metricSum(t, m, "stepserve_connections_open", `listener="api"`)
	t.Logf("open API connections %v (cap 50); closed idle %v; refused %v", open,
		metricSum(t, m, "stepserve_connections_closed_idle_total", `listener="api"`), metricSum(t, m, "stepserve_connections_refused_total", `listener="api"`))
	assert.LessOrEqual(t, open, 50.0)
	assert.Positive(t, metricSum(t, m, "stepserve_connections_closed_idle_total", `listener="api"`), "idle connections made room")

	servesBesideThenClose(t, p, conns)
	rss := p.rss(t)
	t.Logf("rss %.1f MiB -> %.1f MiB", float64(rss0)/(1<<20), float64(rss)/(1<<20))
	assert.Less(t, rss, rss0+64<<20)
}

// TestDescriptorExhaustion: under a small descriptor limit and the
// default server.max_connections, more idle connections than descriptors
// leave the health endpoints on the metrics listener answering.
func TestDescriptorExhaustion(t *testing.T) {
	p := startCappedFiles(t, 400, "--model_repository", hostileRepo(t), "--server.metrics_addr", "127.0.0.1:0")
	mbase := p.metricsBase(t)
	rss0 := p.rss(t)

	conns := idleAndProbed(t, p, mbase, 600)
	servesBesideThenClose(t, p, conns)
	assert.Less(t, p.rss(t), rss0+64<<20)
}

// idleAndProbed opens n idle connections to the API and checks that the
// server lives and its metrics listener answers the health probes.
func idleAndProbed(t *testing.T, p *process, mbase string, n int) []net.Conn {
	t.Helper()
	conns, answered := idleConns(t, strings.TrimPrefix(p.base, "http://"), n)
	t.Logf("opened %d idle connections; %d of %d keep-alive requests answered", len(conns), answered, (len(conns)+1)/2)
	require.True(t, p.alive())
	for _, path := range []string{"/v2/health/live", "/v2/health/ready"} {
		st, took := probe(mbase + path)
		t.Logf("metrics listener %s: %d after %v", path, st, took.Round(time.Millisecond))
		assert.Equal(t, 200, st, path)
	}
	return conns
}

// servesBesideThenClose checks that an inference gets through while conns
// are open, closes them, and checks the server still answers correctly.
func servesBesideThenClose(t *testing.T, p *process, conns []net.Conn) {
	t.Helper()
	d := heldout(t)[0]
	st, took := inferStatus(p.base, jsonRequest("x", []digit{d}))
	t.Logf("inference with %d idle connections open: %d after %v", len(conns), st, took.Round(time.Millisecond))
	assert.Equal(t, 200, st)
	closeAll(conns)
	assert.Equal(t, d.label, classifyOne(t, p.base, d))
	assert.True(t, p.alive())
}

// inferStatus posts one inference request and returns its status (0: no
// answer) and how long it took.
func inferStatus(base string, body []byte) (int, time.Duration) {
	start := time.Now()
	resp, err := patient.Post(base+"/v2/models/digits/infer", "application/json", strings.NewReader(string(body)))
	if err != nil {
		return 0, time.Since(start)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, time.Since(start)
}

// TestClientTimeoutsAreQuiet: 2,000 requests that each ask for a deadline
// of 1µs are answered (most of them 504) and counted, and leave at most a
// handful of lines in the log at the default level.
func TestClientTimeoutsAreQuiet(t *testing.T) {
	p := startCapped(t, hostileMemoryCap, "--model_repository", hostileRepo(t))
	rss0 := p.rss(t)
	before := strings.Count(p.logs.String(), "\n")
	body := `{"parameters":{"timeout":1},"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":["the water is warm and the children play near the river"]}]}`
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}, Timeout: 30 * time.Second}

	const total, clients = 2000, 32
	var mu sync.Mutex
	codes := map[int]int{}
	next := make(chan struct{}, total)
	for range total {
		next <- struct{}{}
	}
	close(next)
	begin := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for range next {
				st := 0
				resp, err := client.Post(p.base+"/v2/models/tiny-encoder/infer", "application/json", strings.NewReader(body))
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					st = resp.StatusCode
				}
				mu.Lock()
				codes[st]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	time.Sleep(200 * time.Millisecond) // the log reader catches up
	lines := strings.Count(p.logs.String(), "\n") - before
	t.Logf("%d requests in %v: %v; %d log lines", total, time.Since(begin).Round(time.Millisecond), codes, lines)
	assert.Zero(t, codes[0], "every request is answered")
	assert.Positive(t, codes[504], "a deadline of 1µs expires in the queue")
	assert.Equal(t, total, codes[200]+codes[504])
	assert.LessOrEqual(t, lines, 5, "client-caused outcomes are not logged at the default level:\n%s", lastLines(p.logs.String(), 5))

	m := scrape(t, p.base)
	assert.Equal(t, float64(codes[504]), metricSum(t, m, "stepserve_requests_total", `model="tiny-encoder"`, `outcome="timeout"`), "every timeout is counted")
	assert.True(t, p.alive())
	embed(t, p.base, "The water is warm.")
	assert.Less(t, p.rss(t), rss0+64<<20)
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}
