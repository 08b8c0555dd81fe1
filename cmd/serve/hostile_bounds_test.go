package main

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The requests in this file cost the server far more than they cost the
// client: a few bytes a row that become kilobytes of output, bodies declared
// but never sent, element counts found out only after they were built.
// Each runs against the real binary under the hostile address-space cap, so
// a bound that was missed shows as a crash.

// boundsReply is one answer read off a raw connection.
type boundsReply struct {
	status int
	header http.Header
	msg    string // the error message of a JSON error body
	body   []byte
	took   time.Duration
}

// rssSampler records the server's peak RSS while a request runs.
type rssSampler struct {
	pid  int
	stop chan struct{}
	done chan int64
}

func sampleRSS(p *process) *rssSampler {
	s := &rssSampler{pid: p.cmd.Process.Pid, stop: make(chan struct{}), done: make(chan int64, 1)}
	go func() {
		var peak int64
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if r := readRSS(s.pid); r > peak {
				peak = r
			}
			select {
			case <-s.stop:
				s.done <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *rssSampler) peak() int64 { close(s.stop); return <-s.done }

// readRSS is VmRSS in bytes, 0 once the process is gone.
func readRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// exchange writes a request on its own connection while reading the
// answer, so that an answer sent before the body was read still arrives.
func exchange(t *testing.T, p *process, path string, headers map[string]string, body []byte) (boundsReply, error) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(p.base, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(60 * time.Second))
	var head strings.Builder
	fmt.Fprintf(&head, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n", path, len(body))
	for k, v := range headers {
		fmt.Fprintf(&head, "%s: %s\r\n", k, v)
	}
	head.WriteString("\r\n")
	start := time.Now()
	go func() {
		conn.Write([]byte(head.String()))
		conn.Write(body) // may fail once the server has answered
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return boundsReply{took: time.Since(start)}, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	r := boundsReply{status: resp.StatusCode, header: resp.Header, body: out, took: time.Since(start)}
	var e struct{ Error string }
	if json.Unmarshal(out, &e) == nil {
		r.msg = e.Error
	}
	return r, err
}

// stillServing asserts that the server is alive and answers normal requests
// correctly.
func stillServing(t *testing.T, p *process) {
	t.Helper()
	require.True(t, p.alive(), "the server died; log:\n%s", p.logs)
	d := heldout(t)[0]
	assert.Equal(t, d.label, classifyOne(t, p.base, d))
	rows := embed(t, p.base, "The water is warm.", "")
	assert.Len(t, rows, 2)
}

// emptyTexts is a JSON request of n empty texts, shape [rows].
func emptyTexts(rows, n int) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"inputs":[{"name":"text","datatype":"BYTES","shape":[%d],"data":[`, rows)
	b.Grow(3 * n)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`""`)
	}
	b.WriteString(`]}]}`)
	return b.Bytes()
}

// TestHostileAmplification: requests of a few bytes a row that ask for far
// larger outputs, and requests whose element or tensor counts would be
// built before being checked. Each is refused at once, with a message that
// names the figure and the key; the server's memory stays bounded and it
// serves normally afterwards.
func TestHostileAmplification(t *testing.T) {
	repo := hostileRepo(t)
	args := []string{"--model_repository", repo, "--server.max_body_bytes", "64MiB"}
	p := startCapped(t, hostileMemoryCap, args...)
	baseline := p.rss(t)

	const emptyRows = 1_000_000 // 3 MB of "" texts
	var binTexts []byte         // 8M empty texts in binary form: 32 MiB
	const binRows = 8_000_000
	binHeader := fmt.Sprintf(`{"inputs":[{"name":"text","datatype":"BYTES","shape":[%d],"parameters":{"binary_data_size":%d}}]}`, binRows, 4*binRows)
	binTexts = append([]byte(binHeader), make([]byte, 4*binRows)...)
	// Token ids of one token a row, for the ids model's 64-wide output.
	const idRows = 2_000_000
	ones := "[" + strings.TrimSuffix(strings.Repeat("1,", idRows), ",") + "]"
	idsBody := fmt.Sprintf(`{"inputs":[{"name":"input_ids","datatype":"INT64","shape":[%d,1],"data":%s},{"name":"attention_mask","datatype":"INT64","shape":[%d,1],"data":%s}]}`, idRows, ones, idRows, ones)
	const dupInputs = 800_000
	dups := `{"inputs":[` + strings.TrimSuffix(strings.Repeat(`{"name":"pixels","datatype":"FP32","shape":[1,64]},`, dupInputs), ",") + `]}`
	const manyOutputs = 300_000
	row := "[" + strings.TrimSuffix(strings.Repeat("1,", 64), ",") + "]"
	outputs := `{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,64],"data":` + row + `}],"outputs":[` +
		strings.TrimSuffix(strings.Repeat(`{"name":"probabilities"},`, manyOutputs), ",") + `]}`

	cases := []struct {
		name     string
		path     string
		headers  map[string]string
		body     []byte
		parallel int
		status   int
		want     string
		busyOK   bool // parallel requests may find the budget spent (503)
	}{
		{name: "3 MB of empty texts", path: "/v2/models/tiny-encoder/infer", body: emptyTexts(emptyRows, emptyRows),
			status: 413, want: "server.max_response_bytes"},
		{name: "32 MiB of empty texts in binary", path: "/v2/models/tiny-encoder/infer", body: binTexts,
			headers: map[string]string{"Inference-Header-Content-Length": strconv.Itoa(len(binHeader))},
			status:  413, want: "server.max_response_bytes"},
		{name: "one-token rows of a 64-wide output", path: "/v2/models/ids/infer", body: []byte(idsBody),
			status: 413, want: "server.max_response_bytes"},
		{name: "16M empty texts for a shape of 1, four at once", path: "/v2/models/tiny-encoder/infer", body: emptyTexts(1, 16_000_000),
			parallel: 4, status: 400, want: "more strings than the shape holds (1)", busyOK: true},
		{name: "800k duplicate inputs", path: "/v2/models/digits/infer", body: []byte(dups),
			status: 400, want: `input "pixels" appears more than once`},
		{name: "300k outputs", path: "/v2/models/digits/infer", body: []byte(outputs),
			status: 400, want: `output "probabilities" is requested more than once`},
	}
	for _, tc := range cases {
		ok := t.Run(tc.name, func(t *testing.T) {
			n := max(tc.parallel, 1)
			before := p.rss(t)
			rss := sampleRSS(p)
			replies := make([]boundsReply, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { replies[i], errs[i] = exchange(t, p, tc.path, tc.headers, tc.body) })
			}
			wg.Wait()
			peak := rss.peak()
			t.Logf("%d x %.1f MiB body: status %d in %v, peak RSS %.0f MiB (%.0f MiB before it): %s",
				n, float64(len(tc.body))/(1<<20), replies[0].status, replies[0].took.Round(time.Millisecond),
				float64(peak)/(1<<20), float64(before)/(1<<20), clipMsg(replies[0].msg))
			require.True(t, p.alive(), "the server died; log:\n%s", p.logs)
			answered := 0
			for i := range n {
				require.NoError(t, errs[i])
				if tc.busyOK && replies[i].status == 503 {
					assertBusy(t, replies[i])
					continue
				}
				answered++
				assert.Equal(t, tc.status, replies[i].status, replies[i].msg)
				assert.Contains(t, replies[i].msg, tc.want)
			}
			assert.Positive(t, answered, "at least one request gets its answer")
			assert.Less(t, peak, baseline+384<<20, "peak RSS")
			stillServing(t, p)
		})
		if !ok {
			// Give each case a live server: one that failed may be dying.
			select {
			case err := <-p.done:
				p.done <- err
			case <-time.After(5 * time.Second):
			}
			if !p.alive() {
				p = startCapped(t, hostileMemoryCap, args...)
			}
		}
	}
	assert.Less(t, p.rss(t), baseline+320<<20, "RSS afterwards")
}

// assertBusy asserts a 503 for a spent in-flight budget.
func assertBusy(t *testing.T, r boundsReply) {
	t.Helper()
	assert.Equal(t, 503, r.status)
	assert.Contains(t, r.msg, "server.max_inflight_bytes")
	assert.Equal(t, "1", r.header.Get("Retry-After"))
}

func clipMsg(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

// holdBodies opens n connections that each declare a body of declared
// bytes and send only its first byte, and returns them open.
func holdBodies(t *testing.T, p *process, n int, declared int64) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	for i := range conns {
		conn, err := net.Dial("tcp", strings.TrimPrefix(p.base, "http://"))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		_, err = fmt.Fprintf(conn, "POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{", declared)
		require.NoError(t, err)
		conns[i] = conn
	}
	return conns
}

// TestHostileBodiesHeldOpen: connections that declare the largest body
// allowed and send one byte of it cost the server what arrived (its first
// buffer, 64 KiB), not what they declared.
func TestHostileBodiesHeldOpen(t *testing.T) {
	p := startCapped(t, hostileMemoryCap, "--model_repository", hostileRepo(t), "--server.max_body_bytes", "64MiB")
	inflight := func() float64 { return metricSum(t, scrape(t, p.base), "stepserve_inflight_bytes") }
	baseline := p.rss(t)
	rss := sampleRSS(p)
	const n = 130
	conns := holdBodies(t, p, n, 64<<20)
	require.Eventually(t, func() bool { return !p.alive() || inflight() == n*64<<10 }, 10*time.Second, 20*time.Millisecond,
		"every connection holds its first 64 KiB")
	stillServing(t, p)
	assert.Equal(t, float64(n*64<<10), inflight(), "and no more while they send nothing")
	peak := rss.peak()
	t.Logf("%d bodies of 64 MiB declared, 1 byte sent: %.1f MiB of the budget held, peak RSS %.0f MiB (baseline %.0f MiB)",
		n, float64(n*64<<10)/(1<<20), float64(peak)/(1<<20), float64(baseline)/(1<<20))
	assert.Less(t, peak, baseline+128<<20)

	for _, c := range conns {
		c.Close()
	}
	require.Eventually(t, func() bool { return inflight() == 0 }, 10*time.Second, 20*time.Millisecond,
		"a body cut short gives back what it held")
}

// streamChunked sends a chunked body of 64 KiB chunks until the server
// answers, and returns the answer.
func streamChunked(t *testing.T, p *process) (boundsReply, error) {
	conn, err := net.Dial("tcp", strings.TrimPrefix(p.base, "http://"))
	if err != nil {
		return boundsReply{}, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(60 * time.Second))
	go func() {
		if _, err := io.WriteString(conn, "POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"); err != nil {
			return
		}
		chunk := append([]byte(fmt.Sprintf("%x\r\n", 64<<10)), bytes.Repeat([]byte(" "), 64<<10)...)
		chunk = append(chunk, "\r\n"...)
		for range 4096 { // 256 MiB at most: the server answers long before
			if _, err := conn.Write(chunk); err != nil {
				return
			}
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return boundsReply{}, err
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	r := boundsReply{status: resp.StatusCode, header: resp.Header, body: out}
	var e struct{ Error string }
	if json.Unmarshal(out, &e) == nil {
		r.msg = e.Error
	}
	return r, nil
}

// TestHostileParallelChunkedBodies: bodies of unknown length that never
// end, many at once, are each cut at server.max_body_bytes (413), and
// together they cannot take more than the in-flight budget (503 for the
// ones that find it spent).
func TestHostileParallelChunkedBodies(t *testing.T) {
	p := startCapped(t, hostileMemoryCap, "--model_repository", hostileRepo(t), "--server.max_body_bytes", "64MiB")
	baseline := p.rss(t)
	rss := sampleRSS(p)
	const n = 24
	replies := make([]boundsReply, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { replies[i], errs[i] = streamChunked(t, p) })
	}
	wg.Wait()
	peak := rss.peak()
	byStatus := map[int]int{}
	for i := range n {
		byStatus[replies[i].status]++
	}
	t.Logf("%d endless chunked bodies: answers by status %v, peak RSS %.0f MiB (baseline %.0f MiB)", n, byStatus, float64(peak)/(1<<20), float64(baseline)/(1<<20))
	require.True(t, p.alive(), "the server died; log:\n%s", p.logs)
	for i := range n {
		require.NoError(t, errs[i])
		switch replies[i].status {
		case 413: // past server.max_body_bytes, or its buffers past the whole budget
			assert.Regexp(t, `server\.max_(body|inflight)_bytes`, replies[i].msg)
		case 503:
			assertBusy(t, replies[i])
		default:
			t.Errorf("status %d: %s", replies[i].status, replies[i].msg)
		}
	}
	stillServing(t, p)
}

// digitsRows is a JSON request of n rows of digits.
func digitsRows(n int) []byte {
	row := "[" + strings.TrimSuffix(strings.Repeat("1,", 64), ",") + "]"
	return []byte(`{"inputs":[{"name":"pixels","datatype":"FP32","shape":[` + strconv.Itoa(n) + `,64],"data":[` +
		strings.TrimSuffix(strings.Repeat(row+",", n), ",") + `]}]}`)
}

// TestSlowReaderHoldsItsBudget: a response stays charged to the in-flight
// budget until it is written, so a client that does not read its answer
// holds its share and no more: the next request that needs more than is
// left waits briefly, then gets 503 with Retry-After; once the slow reader
// reads, the budget is free again.
func TestSlowReaderHoldsItsBudget(t *testing.T) {
	p := startCapped(t, hostileMemoryCap, "--model_repository", hostileRepo(t), "--server.max_inflight_bytes", "80MiB")
	inflight := func() float64 { return metricSum(t, scrape(t, p.base), "stepserve_inflight_bytes") }
	require.Equal(t, float64(80<<20), metricSum(t, scrape(t, p.base), "stepserve_inflight_bytes_limit"))
	require.Zero(t, inflight())

	// 80k rows: about 9 MB of JSON, far more than the sockets buffer
	// when the client's receive buffer is small.
	const rows = 80_000
	body := digitsRows(rows)
	dialer := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	slow, err := dialer.Dial("tcp", strings.TrimPrefix(p.base, "http://"))
	require.NoError(t, err)
	defer slow.Close()
	_, err = fmt.Fprintf(slow, "POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return inflight() > 50<<20 }, 30*time.Second, 20*time.Millisecond,
		"the slow reader's request takes its share of the budget")
	held := inflight()

	r, err := exchange(t, p, "/v2/models/digits/infer", nil, body)
	require.NoError(t, err)
	assertBusy(t, r)
	t.Logf("slow reader holds %.0f MiB of 80 MiB; the next request: %d %s", held/(1<<20), r.status, r.msg)
	assert.Equal(t, held, inflight(), "the slow reader still holds its share, and only that")

	// The slow reader reads its answer: all of it, correct, and the
	// budget is free again.
	slow.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(slow), nil)
	require.NoError(t, err)
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode, string(out[:min(len(out), 300)]))
	var got inferResponse
	require.NoError(t, json.Unmarshal(out, &got))
	assert.Equal(t, []int{rows, 10}, got.Outputs[0].Shape)
	require.Eventually(t, func() bool { return inflight() == 0 }, 10*time.Second, 20*time.Millisecond)

	r, err = exchange(t, p, "/v2/models/digits/infer", nil, body)
	require.NoError(t, err)
	assert.Equal(t, 200, r.status, r.msg)
	stillServing(t, p)
}

// TestHostileCompressionBombs: gzip and deflate bodies that inflate 64
// times past server.max_body_bytes are refused with 413 once the limit is
// reached, several at once, with the server's memory bounded by the limit
// and not by what the bodies would inflate to.
func TestHostileCompressionBombs(t *testing.T) {
	p := startCapped(t, hostileMemoryCap, "--model_repository", hostileRepo(t), "--server.max_body_bytes", "4MiB")
	// 256 MiB of zeros each, about 256 KiB compressed: under the limit as
	// sent.
	gz, zl := zeroBomb(t, "gzip", 256), zeroBomb(t, "deflate", 256)
	require.Less(t, gz.Len(), 4<<20)
	baseline := p.rss(t)
	rss := sampleRSS(p)
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			body, enc := gz.Bytes(), "gzip"
			if i%2 == 1 {
				body, enc = zl.Bytes(), "deflate"
			}
			resp, out := post(t, p.base+"/v2/models/digits/infer", body, "Content-Encoding", enc)
			assert.Equal(t, 413, resp.StatusCode, string(out))
			assert.Contains(t, string(out), "decompresses to more than the 4194304-byte limit")
		})
	}
	wg.Wait()
	stillServing(t, p)
	peak := rss.peak()
	t.Logf("6 compression bombs of %d KiB inflating to 256 MiB each, limit 4 MiB: peak RSS %.0f MiB (baseline %.0f MiB)",
		gz.Len()>>10, float64(peak)/(1<<20), float64(baseline)/(1<<20))
	assert.Less(t, peak, baseline+128<<20)
}

// zeroBomb is a gzip or zlib ("deflate") stream of mib MiB of zeros, made
// without compressing them all (256 MiB take 40 s under the race
// detector): the compressor's output for one MiB of zeros after a window of
// zeros, cut at a sync flush, decodes to one MiB of zeros after any window
// of zeros, so it is repeated, then closed with an empty final block and
// the format's checksum. A small bomb is decoded here to hold the
// construction to the standard library's readers.
func zeroBomb(t *testing.T, encoding string, mib int) *bytes.Buffer {
	t.Helper()
	build := func(mib int) *bytes.Buffer {
		var deflated bytes.Buffer
		fw, err := flate.NewWriter(&deflated, flate.BestCompression)
		require.NoError(t, err)
		zeros := make([]byte, 1<<20)
		fw.Write(zeros)
		fw.Flush()
		first := deflated.Len()
		fw.Write(zeros)
		fw.Flush()
		chunk := bytes.Clone(deflated.Bytes()[first:])
		stream := bytes.Clone(deflated.Bytes()[:first])
		for range mib - 1 {
			stream = append(stream, chunk...)
		}
		stream = append(stream, 0x03, 0x00) // an empty final block (fixed Huffman codes, end of block)

		n := uint64(mib) << 20
		var out bytes.Buffer
		if encoding == "gzip" {
			out.Write([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff})
			out.Write(stream)
			crc := crc32.Update(0, crc32.IEEETable, nil)
			for range mib {
				crc = crc32.Update(crc, crc32.IEEETable, zeros)
			}
			out.Write(binary.LittleEndian.AppendUint32(nil, crc))
			out.Write(binary.LittleEndian.AppendUint32(nil, uint32(n)))
		} else {
			out.Write([]byte{0x78, 0xda})
			out.Write(stream)
			// Adler-32 of n zero bytes: a stays 1, b adds a once a byte.
			out.Write(binary.BigEndian.AppendUint32(nil, uint32(n%65521)<<16|1))
		}
		return &out
	}
	small := build(3)
	var r io.Reader
	var err error
	if encoding == "gzip" {
		r, err = gzip.NewReader(bytes.NewReader(small.Bytes()))
	} else {
		r, err = zlib.NewReader(bytes.NewReader(small.Bytes()))
	}
	require.NoError(t, err)
	got, err := io.ReadAll(r)
	require.NoError(t, err, "a 3 MiB %s bomb decodes, checksum and all", encoding)
	require.Equal(t, make([]byte, 3<<20), got)
	return build(mib)
}
