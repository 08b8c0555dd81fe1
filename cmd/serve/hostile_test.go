package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hostileRepo serves digits (FP32), tiny-encoder (text) and an encoder
// that takes token ids (the torch reference model).
func hostileRepo(t *testing.T) string {
	repo := t.TempDir()
	copyDigits(t, repo, "digits", "")
	for name, src := range map[string]string{"tiny-encoder": "../../model_repository/tiny-encoder", "ids": "../../engine/cpufallback/testdata/encoder"} {
		dst := filepath.Join(repo, name)
		require.NoError(t, os.MkdirAll(dst, 0o755))
		for _, f := range []string{"model.yaml", "weights.safetensors", "vocab.txt"} {
			b, err := os.ReadFile(filepath.Join(src, f))
			if os.IsNotExist(err) {
				continue
			}
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(dst, f), b, 0o644))
		}
	}
	return repo
}

type hostileCase struct {
	name    string
	path    string // default: digits' infer
	headers map[string]string
	body    string
	status  int
	want    string
}

func binaryBody(header string, payload []byte) (string, map[string]string) {
	return header + string(payload), map[string]string{"Inference-Header-Content-Length": strconv.Itoa(len(header))}
}

func floatBytes(v ...float32) []byte {
	var b []byte
	for _, f := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return b
}

func hostileCases() []hostileCase {
	pix := func(shape, data string) string {
		return `{"inputs":[{"name":"pixels","datatype":"FP32","shape":` + shape + `,"data":` + data + `}]}`
	}
	n := func(k int, v string) string { return "[" + strings.TrimSuffix(strings.Repeat(v+",", k), ",") + "]" }
	row := n(64, "1")
	withParams := func(params string) string {
		return `{"parameters":` + params + `,"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,64],"data":` + row + `}]}`
	}
	withOutputs := func(outputs string) string {
		return `{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,64],"data":` + row + `}],"outputs":` + outputs + `}`
	}
	binHeader := func(size string) string {
		return `{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,64],"parameters":{"binary_data_size":` + size + `}}]}`
	}
	nan := make([]float32, 64)
	nan[7] = float32(math.NaN())
	inf := make([]float32, 64)
	inf[3] = float32(math.Inf(-1))
	nanBody, nanHdr := binaryBody(binHeader("256"), floatBytes(nan...))
	infBody, infHdr := binaryBody(binHeader("256"), floatBytes(inf...))
	lieBody, lieHdr := binaryBody(binHeader("255"), make([]byte, 255))
	shortBody, shortHdr := binaryBody(binHeader("256"), make([]byte, 100))
	longBody, longHdr := binaryBody(binHeader("256"), make([]byte, 300))
	bothBody, bothHdr := binaryBody(`{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,64],"data":`+row+`,"parameters":{"binary_data_size":256}}]}`, make([]byte, 256))
	text := func(data string) string {
		return `{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":` + data + `}]}`
	}
	var lyingText []byte
	lyingText = binary.LittleEndian.AppendUint32(lyingText, 1000)
	lyingText = append(lyingText, "short"...)
	textLieBody, textLieHdr := binaryBody(`{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":9}}]}`, lyingText)
	var badUTF8 []byte
	badUTF8 = binary.LittleEndian.AppendUint32(badUTF8, 3)
	badUTF8 = append(badUTF8, 0xff, 0xfe, 'a')
	textUTF8Body, textUTF8Hdr := binaryBody(`{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":7}}]}`, badUTF8)
	ids := func(shape, idv, mask string) string {
		return `{"inputs":[{"name":"input_ids","datatype":"INT64","shape":` + shape + `,"data":` + idv + `},{"name":"attention_mask","datatype":"INT64","shape":` + shape + `,"data":` + mask + `}]}`
	}
	const textPath, idsPath = "/v2/models/tiny-encoder/infer", "/v2/models/ids/infer"
	return []hostileCase{
		// The body as a whole.
		{name: "empty body", status: 400, want: "empty request body"},
		{name: "truncated JSON", body: `{"inputs":[{"name":"pix`, status: 400, want: "malformed JSON"},
		{name: "JSON null", body: `null`, status: 400, want: "request has no inputs"},
		{name: "JSON array", body: `[1,2]`, status: 400, want: "malformed request: request must be an object"},
		{name: "JSON string", body: `"infer please"`, status: 400, want: "malformed request"},
		{name: "trailing garbage", body: pix("[1,64]", row) + `}`, status: 400, want: "malformed JSON"},
		{name: "deep nesting of the document", body: `{"inputs":` + strings.Repeat("[", 11000) + strings.Repeat("]", 11000) + "}", status: 400, want: "exceeded max depth"},
		{name: "deep nesting of data", body: pix("[1,64]", strings.Repeat("[", 5000)+strings.Repeat("1,", 63)+"1"+strings.Repeat("]", 5000)), status: 400, want: "nested deeper than its shape's 2 dimensions"},
		{name: "inputs not an array", body: `{"inputs":{"pixels":[1]}}`, status: 400, want: "inputs must be an array"},
		{name: "input not an object", body: `{"inputs":[1]}`, status: 400, want: "malformed request"},
		{name: "name not a string", body: `{"inputs":[{"name":5}]}`, status: 400, want: "inputs.name must be a string"},
		{name: "id not a string", body: `{"id":7,"inputs":[]}`, status: 400, want: "id must be a string"},
		// Models and routes.
		{name: "unknown model", path: "/v2/models/mnist/infer", body: pix("[1,64]", row), status: 404, want: `Request for unknown model: 'mnist' is not found`},
		{name: "path traversal in the model name", path: "/v2/models/..%2F..%2Fetc%2Fpasswd/infer", body: pix("[1,64]", row), status: 404, want: "unknown model; model names are"},
		{name: "a 2000-character model name", path: "/v2/models/" + strings.Repeat("m", 2000) + "/infer", body: pix("[1,64]", row), status: 404, want: "unknown model; model names are"},
		{name: "unknown version", path: "/v2/models/digits/versions/2/infer", body: pix("[1,64]", row), status: 404, want: `Request for unknown model: 'digits' version 2 is not found`},
		{name: "unknown route", path: "/v2/modelz", body: "{}", status: 404, want: "no endpoint POST /v2/modelz"},
		// Inputs.
		{name: "no inputs", body: `{"inputs":[]}`, status: 400, want: "request has no inputs"},
		{name: "unknown input", body: `{"inputs":[{"name":"image","datatype":"FP32","shape":[1,64],"data":` + row + `}]}`, status: 400, want: `unknown input "image"`},
		{name: "duplicate input", body: `{"inputs":[` + strings.Repeat(`{"name":"pixels","datatype":"FP32","shape":[1,64],"data":`+row+`},`, 1) + `{"name":"pixels","datatype":"FP32","shape":[1,64],"data":` + row + `}]}`, status: 400, want: `input "pixels" appears more than once`},
		{name: "wrong datatype", body: `{"inputs":[{"name":"pixels","datatype":"FP64","shape":[1,64],"data":` + row + `}]}`, status: 400, want: "datatype FP64, want FP32"},
		{name: "unknown datatype", body: `{"inputs":[{"name":"pixels","datatype":"FLOAT32","shape":[1,64],"data":` + row + `}]}`, status: 400, want: `unknown datatype "FLOAT32"`},
		{name: "lowercase datatype", body: `{"inputs":[{"name":"pixels","datatype":"fp32","shape":[1,64],"data":` + row + `}]}`, status: 400, want: `unknown datatype "fp32"`},
		{name: "missing datatype", body: `{"inputs":[{"name":"pixels","shape":[1,64],"data":` + row + `}]}`, status: 400, want: `unknown datatype ""`},
		// Shapes.
		{name: "wrong rank", body: pix("[64]", row), status: 400, want: "has 1 dimensions, want 2"},
		{name: "rank 3", body: pix("[1,1,64]", row), status: 400, want: "has 3 dimensions, want 2"},
		{name: "wrong width", body: pix("[1,63]", n(63, "1")), status: 400, want: "dimension 1 must be 64"},
		{name: "negative dimension", body: pix("[-1,64]", row), status: 400, want: "dimension 0 is negative"},
		{name: "zero rows", body: pix("[0,64]", "[]"), status: 400, want: "the batch dimension must be at least 1"},
		{name: "dimension 1e30", body: pix("[1e30,64]", row), status: 400, want: "inputs.shape must be an integer"},
		{name: "fractional dimension", body: pix("[1.5,64]", row), status: 400, want: "inputs.shape must be an integer"},
		{name: "dimension as a string", body: pix(`["1",64]`, row), status: 400, want: "inputs.shape must be an integer"},
		{name: "overflowing shape product", body: pix("[4294967296,4294967296]", row), status: 400, want: "holds too many elements"},
		{name: "shape over the element limit", body: pix("[100000,64]", row), status: 400, want: "above the limit of 100000 (server.max_request_elements)"},
		{name: "shape larger than the body", body: pix("[1000,64]", row), status: 400, want: "more than a"},
		{name: "shape missing", body: `{"inputs":[{"name":"pixels","datatype":"FP32","data":` + row + `}]}`, status: 400, want: "shape [] has 0 dimensions, want 2"},
		// Data.
		{name: "too few values", body: pix("[2,64]", row), status: 400, want: "needs 128 values, data has 64"},
		{name: "too many values", body: pix("[1,64]", n(65, "1")), status: 400, want: "more values than the shape holds (64)"},
		{name: "string value", body: pix("[1,64]", `["1",`+n(63, "1")[1:]), status: 400, want: "element 0 is a string"},
		{name: "boolean value", body: pix("[1,64]", `[true,`+n(63, "1")[1:]), status: 400, want: "true is a boolean"},
		{name: "null value", body: pix("[1,64]", `[null,`+n(63, "1")[1:]), status: 400, want: "element 0 is null"},
		{name: "object value", body: pix("[1,64]", `[{},`+n(63, "1")[1:]), status: 400, want: "element 0 is an object"},
		{name: "NaN literal", body: pix("[1,64]", `[NaN,`+n(63, "1")[1:]), status: 400, want: "NaN is not a JSON number"},
		{name: "Infinity literal", body: pix("[1,64]", `[Infinity,`+n(63, "1")[1:]), status: 400, want: "Infinity is not a JSON number"},
		{name: "-Infinity literal", body: pix("[1,64]", `[-Infinity,`+n(63, "1")[1:]), status: 400, want: "Infinity is not a JSON number"},
		{name: "FP32 overflow", body: pix("[1,64]", `[3.5e38,`+n(63, "1")[1:]), status: 400, want: "3.5e38 is not a finite FP32 value"},
		{name: "data not an array", body: pix("[1,64]", `5`), status: 400, want: "data must be an array of FP32 values"},
		{name: "data missing", body: `{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,64]}]}`, status: 400, want: "has no data"},
		// Binary tensors.
		{name: "NaN in binary data", body: nanBody, headers: nanHdr, status: 400, want: "element 7 is NaN"},
		{name: "-Inf in binary data", body: infBody, headers: infHdr, status: 400, want: "element 3 is -Inf"},
		{name: "binary size that lies", body: lieBody, headers: lieHdr, status: 400, want: "binary_data_size is 255 bytes, but FP32 [1 64] needs 256"},
		{name: "binary shorter than declared", body: shortBody, headers: shortHdr, status: 400, want: "only 100 bytes of binary data remain"},
		{name: "binary data left over", body: longBody, headers: longHdr, status: 400, want: "44 bytes of binary data follow"},
		{name: "data and binary both", body: bothBody, headers: bothHdr, status: 400, want: "has both data and binary_data_size"},
		{name: "negative binary size", body: binHeader("-4"), headers: map[string]string{"Inference-Header-Content-Length": strconv.Itoa(len(binHeader("-4")))}, status: 400, want: "binary_data_size must be a non-negative integer"},
		{name: "binary size as a string", body: binHeader(`"256"`), headers: map[string]string{"Inference-Header-Content-Length": strconv.Itoa(len(binHeader(`"256"`)))}, status: 400, want: "binary_data_size must be a non-negative integer"},
		{name: "header length past the body", body: "{}", headers: map[string]string{"Inference-Header-Content-Length": "99"}, status: 400, want: "Inference-Header-Content-Length 99 exceeds the 2-byte body"},
		{name: "header length not a number", body: "{}", headers: map[string]string{"Inference-Header-Content-Length": "0x10"}, status: 400, want: `"0x10" is not a non-negative integer`},
		{name: "negative header length", body: "{}", headers: map[string]string{"Inference-Header-Content-Length": "-1"}, status: 400, want: "is not a non-negative integer"},
		// Size.
		{name: "body over the limit", body: pix("[1,64]", row) + strings.Repeat(" ", 70<<10), status: 413, want: "exceeds the 65536-byte limit (server.max_body_bytes)"},
		// Outputs and parameters.
		{name: "unknown output", body: withOutputs(`[{"name":"logits"}]`), status: 400, want: `unknown output "logits"`},
		{name: "output twice", body: withOutputs(`[{"name":"probabilities"},{"name":"probabilities"}]`), status: 400, want: "requested more than once"},
		{name: "classification wider than the output", body: withOutputs(`[{"name":"probabilities","parameters":{"classification":11}}]`), status: 400, want: "classification 11 asks for more classes than the output's 10 elements per row"},
		{name: "binary_data not a boolean", body: withOutputs(`[{"name":"probabilities","parameters":{"binary_data":1}}]`), status: 400, want: "binary_data must be true or false"},
		{name: "binary_data_output not a boolean", body: withParams(`{"binary_data_output":"yes"}`), status: 400, want: "binary_data_output must be true or false"},
		{name: "negative priority", body: withParams(`{"priority":-1}`), status: 400, want: "priority must be a non-negative integer"},
		{name: "negative timeout", body: withParams(`{"timeout":-5}`), status: 400, want: "timeout must be a non-negative integer"},
		{name: "timeout as a string", body: withParams(`{"timeout":"1s"}`), status: 400, want: "timeout must be a non-negative integer"},
		{name: "parameters not an object", body: withParams(`[1]`), status: 400, want: "parameters must be an object"},
		// Text.
		{name: "invalid UTF-8 in JSON text", path: textPath, body: text("[\"caf\xe9\"]"), status: 400, want: "data is not valid UTF-8"},
		{name: "invalid UTF-8 in binary text", path: textPath, body: textUTF8Body, headers: textUTF8Hdr, status: 400, want: "element 0 is not valid UTF-8"},
		{name: "text length that lies", path: textPath, body: textLieBody, headers: textLieHdr, status: 400, want: "length 1000 runs past the 5 bytes"},
		{name: "number as text", path: textPath, body: text(`[42]`), status: 400, want: "element 0 is 42; want a string"},
		{name: "text count differs from shape", path: textPath, body: `{"inputs":[{"name":"text","datatype":"BYTES","shape":[3],"data":["a"]}]}`, status: 400, want: "needs 3 strings, data has 1"},
		{name: "text nested too deep", path: textPath, body: text(`[["a"]]`), status: 400, want: "nested deeper than its shape"},
		// Token ids.
		{name: "token id past the vocabulary", path: idsPath, body: ids("[1,3]", "[1,2,100]", "[1,1,1]"), status: 400, want: "element 2 is 100; token ids must be in 0..99"},
		{name: "negative token id", path: idsPath, body: ids("[1,3]", "[1,-2,3]", "[1,1,1]"), status: 400, want: "element 1 is -2"},
		{name: "attention mask of 2", path: idsPath, body: ids("[1,3]", "[1,2,3]", "[1,2,1]"), status: 400, want: "want 0 or 1"},
		{name: "sequence past the largest bucket", path: idsPath, body: ids("[1,65]", n(65, "1"), n(65, "1")), status: 400, want: "sequence length 65 exceeds the largest seq bucket 64"},
		{name: "INT64 overflow", path: idsPath, body: ids("[1,2]", "[1,9223372036854775808]", "[1,1]"), status: 400, want: "not an integer in the INT64 range"},
		{name: "mask shape differs", path: idsPath, body: `{"inputs":[{"name":"input_ids","datatype":"INT64","shape":[1,2],"data":[1,2]},{"name":"attention_mask","datatype":"INT64","shape":[1,3],"data":[1,1,1]}]}`, status: 400, want: "must have the same shape"},
		{name: "empty sequence", path: idsPath, body: ids("[1,0]", "[]", "[]"), status: 400, want: "(the sequence) must be at least 1"},
	}
}

// serverStats are a server's own figures: its goroutines, its heap now
// (garbage included), the heap goal its last GC set (twice the heap that
// GC found live, at GOGC 100: it follows live memory, not garbage), and
// its failed requests.
type serverStats struct{ goroutines, heap, live, nextGC, gcs, errors, invalid float64 }

func stats(t *testing.T, base string) serverStats {
	m := scrape(t, base)
	return serverStats{
		goroutines: metricSum(t, m, "go_goroutines"),
		heap:       metricSum(t, m, "go_memstats_heap_alloc_bytes"),
		live:       metricSum(t, m, "go_gc_heap_live_bytes"),
		nextGC:     metricSum(t, m, "go_memstats_next_gc_bytes"),
		gcs:        metricSum(t, m, "go_gc_duration_seconds_count"),
		errors:     metricSum(t, m, "stepserve_requests_total", `outcome="error"`),
		invalid:    metricSum(t, m, "stepserve_requests_total", `outcome="invalid"`),
	}
}

// TestHostileRequests sends a battery of malformed and hostile requests to
// the real server: each gets the right 4xx and a message naming the
// problem; none gets a 5xx; the server leaves no goroutine behind and its
// heap stays bounded; and it still answers correctly afterwards.
func TestHostileRequests(t *testing.T) {
	p := start(t, "--model_repository", hostileRepo(t), "--server.max_body_bytes", "64KiB",
		"--server.max_request_elements", "100000", "--server.read_timeout", "1s", "--server.max_header_bytes", "8KiB")
	// Keep-alive, as real clients do: a response sent before the body was
	// read (413 on Content-Length) reaches the client while it is still
	// writing, because the server then drains the body instead of closing.
	transport := &http.Transport{}
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}
	http.DefaultClient.CloseIdleConnections() // counted as at the end
	before := stats(t, p.base)

	cases := hostileCases()
	for _, tc := range cases {
		path := tc.path
		if path == "" {
			path = "/v2/models/digits/infer"
		}
		req, err := http.NewRequest("POST", p.base+path, strings.NewReader(tc.body))
		require.NoError(t, err)
		for k, v := range tc.headers {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		require.NoError(t, err, tc.name)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, tc.status, resp.StatusCode, "%s: %s", tc.name, body)
		var e struct{ Error string }
		if assert.NoError(t, json.Unmarshal(body, &e), "%s: %q", tc.name, body) {
			assert.Contains(t, e.Error, tc.want, tc.name)
		}
	}

	// Below HTTP: oversize headers, a body that never finishes, a body cut
	// short, conflicting framing, broken chunking.
	addr := strings.TrimPrefix(p.base, "http://")
	raw := []struct {
		name, request string
		wait          bool // keep the connection open until the server answers
		status        int
		want          string
	}{
		{"oversize headers", "POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 16<<10) + "\r\nContent-Length: 2\r\n\r\n{}", false, 431, "Request Header Fields Too Large"},
		{"slow body", "POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"inputs\":", true, 408, "did not arrive within server.read_timeout"},
		{"body cut short", "POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"inputs\":[", false, 400, "reading the request body: unexpected EOF"},
		{"content length and chunked", "POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", false, 400, "empty request body"},
		{"broken chunking", "POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n", false, 400, "reading the request body"},
	}
	for _, tc := range raw {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		conn.SetDeadline(time.Now().Add(30 * time.Second))
		_, err = conn.Write([]byte(tc.request))
		require.NoError(t, err, tc.name)
		if !tc.wait {
			conn.(*net.TCPConn).CloseWrite()
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err, tc.name)
		body, _ := io.ReadAll(resp.Body)
		conn.Close()
		assert.Equal(t, tc.status, resp.StatusCode, "%s: %s", tc.name, body)
		assert.Contains(t, string(body), tc.want, tc.name)
	}
	total := len(cases) + len(raw)
	t.Logf("%d hostile requests (%d through HTTP, %d below it)", total, len(cases), len(raw))
	assert.GreaterOrEqual(t, total, 60)

	// No 5xx, no goroutine left, the heap bounded, and still correct.
	// A keep-alive connection a client still holds is a goroutine of the
	// server's that is no leak: every client lets go of its idle ones
	// before each count.
	assert.Eventually(t, func() bool {
		transport.CloseIdleConnections()
		http.DefaultClient.CloseIdleConnections()
		return stats(t, p.base).goroutines <= before.goroutines
	}, 10*time.Second, 50*time.Millisecond, "goroutines did not return to %v", before.goroutines)
	after := stats(t, p.base)
	t.Logf("goroutines %v -> %v, heap %.1f MiB -> %.1f MiB", before.goroutines, after.goroutines, before.heap/(1<<20), after.heap/(1<<20))
	assert.Equal(t, before.errors, after.errors, "no request is a server error")
	assert.Less(t, after.heap, before.heap+64<<20, "the heap stays within the body limits")
	assert.Equal(t, heldout(t)[0].label, classifyOne(t, p.base, heldout(t)[0]))
}

// TestServesUnderTheHostileMemoryCap: the shipped models serve within the
// address-space cap the hostile tests run the server under.
func TestServesUnderTheHostileMemoryCap(t *testing.T) {
	p := startCapped(t, hostileMemoryCap, "--model_repository", hostileRepo(t))
	d := heldout(t)[0]
	assert.Equal(t, d.label, classifyOne(t, p.base, d))
	embed(t, p.base, "The water is warm.")
	assert.True(t, p.alive())
	rss := p.rss(t)
	t.Logf("rss %.1f MiB under a %d MiB address-space cap", float64(rss)/(1<<20), hostileMemoryCap>>20)
	assert.Less(t, rss, int64(hostileMemoryCap))
}
