package server

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/models"
)

func TestBudgetWaitsForBytesGivenBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBudget(100)
		require.True(t, b.tryTake(60))
		require.False(t, b.tryTake(50), "60 + 50 is over 100")

		got := make(chan error, 1)
		go func() { got <- b.wait(context.Background(), 50, time.Second) }()
		synctest.Wait()
		select {
		case err := <-got:
			t.Fatalf("took 50 of the 40 free: %v", err)
		default:
		}
		b.give(60)
		require.NoError(t, <-got, "the waiter takes what was given back")
		assert.Equal(t, int64(50), b.used.Load())

		start := time.Now()
		assert.ErrorIs(t, b.wait(context.Background(), 60, time.Second), errBudgetBusy)
		assert.Equal(t, time.Second, time.Since(start), "a waiter gives up after its wait")
		assert.Equal(t, int64(50), b.used.Load(), "a waiter that gave up holds nothing")

		ctx, cancel := context.WithCancel(context.Background())
		go func() { got <- b.wait(ctx, 60, time.Hour) }()
		synctest.Wait()
		cancel()
		assert.ErrorIs(t, <-got, context.Canceled, "a client that went away stops waiting")
		assert.Zero(t, b.waiting.Load())
	})
}

func TestChargeAnswers413Or503(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBudget(10 << 20)
		c := charge{b: b, wait: time.Second}
		require.NoError(t, c.take(context.Background(), 4<<20, "the request"))
		require.NoError(t, c.take(context.Background(), 0, "the request"))

		err := c.take(context.Background(), 7<<20, "the request")
		assert.Equal(t, http.StatusRequestEntityTooLarge, statusOf(err))
		assert.EqualError(t, err, "the request would take about 11 MiB of memory, more than the server's whole in-flight budget of 10 MiB (server.max_inflight_bytes); send a smaller request")

		other := charge{b: b, wait: time.Second}
		require.NoError(t, other.take(context.Background(), 5<<20, "the request"))
		err = c.take(context.Background(), 2<<20, "the request body")
		assert.Equal(t, http.StatusServiceUnavailable, statusOf(err))
		assert.EqualError(t, err, "the server is busy: requests in flight hold 9 MiB of its 10 MiB in-flight budget (server.max_inflight_bytes), and the request body needs 2 MiB more; retry")

		other.release()
		c.release()
		c.release()
		assert.Zero(t, b.used.Load())
	})
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1 KiB", 1536: "1.5 KiB", 64 << 20: "64 MiB", 3 << 29: "1.5 GiB"} {
		assert.Equal(t, want, formatBytes(n), n)
	}
}

// jsonValueBytes bounds what appendJSONData writes for any value.
func TestJSONValueBytesBoundsAppendJSONData(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	longest := func(dt models.Datatype, bits func(i int) uint64) int {
		n := 0
		v := make([]byte, dt.Size())
		for i := range 100000 {
			x := bits(i)
			for k := range v {
				v[k] = byte(x >> (8 * k))
			}
			out, err := appendJSONData(nil, v, dt)
			if err == nil {
				n = max(n, len(out)-2+1) // less the brackets, plus a comma
			}
		}
		return n
	}
	edges := []uint64{0, 1, 0x80000001, 0x00800000, 0x80800001, 0x7f7fffff, 0xff7fffff, 0x8000000000000001, 0x0010000000000000, 0x8010000000000001, 0xffefffffffffffff, 1 << 63, 1<<63 - 1, 1 << 31, 1<<31 - 1}
	for _, dt := range []models.Datatype{models.FP32, models.FP64, models.INT32, models.INT64, models.BOOL} {
		got := longest(dt, func(i int) uint64 {
			if i < len(edges) {
				return edges[i]
			}
			return rng.Uint64()
		})
		assert.LessOrEqual(t, got, jsonValueBytes(dt), dt)
		assert.Greater(t, got, jsonValueBytes(dt)-3, "%s: the bound is close", dt)
	}
}

// textModel serves one BYTES input, text, as tiny-encoder does.
func textModel(t *testing.T) *models.Model {
	m, err := models.Load("../model_repository/tiny-encoder")
	require.NoError(t, err)
	return m
}

func TestFootprintFromDeclaredShapes(t *testing.T) {
	m := newSumMax(t).program().Model
	req, err := parseRequest([]byte(`{"id":"a<b","inputs":[{"name":"x","datatype":"FP32","shape":[5,3],"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}]}`), -1, m, 1<<20)
	require.NoError(t, err)
	f := footprintOf(m, req)
	assert.Equal(t, footprint{rows: 5, inputs: 5 * 3 * 4, outputs: 5 * 2 * 4,
		json: 64 + int64(len("summax")+len("1")+6*3) + 112 + int64(len("y")+21*2) + 5*2*16}, f)

	// Text: every row may take the longest seq bucket.
	tm := textModel(t)
	req, err = parseRequest([]byte(`{"inputs":[{"name":"text","datatype":"BYTES","shape":[2],"data":["a",""]}]}`), -1, tm, 1<<20)
	require.NoError(t, err)
	f = footprintOf(tm, req)
	assert.Equal(t, int64(2*16+len(`["a",""]`)), f.inputs, "string headers and the text")
	assert.Equal(t, tm.StepBytes(2, 128), f.step)
	assert.Equal(t, int64(2*128*4), f.outputs)
	assert.Zero(t, f.binary)

	hdr := `{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":7}}],"outputs":[{"name":"embedding","parameters":{"binary_data":true}}]}`
	req, err = parseRequest([]byte(hdr+"\x03\x00\x00\x00abc"), len(hdr), tm, 1<<20)
	require.NoError(t, err)
	f = footprintOf(tm, req)
	assert.Equal(t, int64(16+7), f.inputs)
	assert.Equal(t, int64(128*4), f.binary, "binary outputs are the output buffers, sent as they are")
	assert.Less(t, f.json, int64(512))
}

// The response never outgrows the JSON bound its buffer is sized to.
func TestResponseFitsItsFootprint(t *testing.T) {
	f := newSumMax(t)
	s, _ := newTestServer(t, f)
	body := []byte(`{"id":"\u003c<>&","inputs":[{"name":"x","datatype":"FP32","shape":[4,3],"data":[-1.1754944e-38,2,3,4,5,6,7,8,9,10,11,-3.4028235e38]}]}`)
	req, err := parseRequest(body, -1, f.program().Model, 1<<20)
	require.NoError(t, err)
	w := do(t, s, "POST", "/v2/models/summax/infer", body)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	assert.LessOrEqual(t, int64(w.Body.Len()), footprintOf(f.program().Model, req).json)
}

// boundedServer serves summax with the given response and in-flight
// limits, and a short wait for the budget.
func boundedServer(t *testing.T, maxResponse, maxInflight int64) (*Server, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	s, err := New(Options{Models: newSumMax(t).set, MaxBodyBytes: 1 << 20, MaxResponseBytes: maxResponse,
		MaxInflightBytes: maxInflight, Registerer: reg, Gatherer: reg})
	require.NoError(t, err)
	s.budgetWait = 10 * time.Millisecond
	return s, reg
}

// rowsOf is a summax request of n rows of JSON.
func rowsOf(n int, outputs string) []byte {
	return []byte(`{"inputs":[{"name":"x","datatype":"FP32","shape":[` + strconv.Itoa(n) + `,3],"data":[` +
		strings.TrimSuffix(strings.Repeat("1,2,3,", n), ",") + `]}]` + outputs + `}`)
}

func TestResponseOverTheLimitIs413(t *testing.T) {
	s, _ := boundedServer(t, 4096, 0)
	w := do(t, s, "POST", "/v2/models/summax/infer", rowsOf(200, ""))
	assert.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
	assert.Equal(t, "the response would be about 6.5 KiB (200 rows x 33 B of JSON), above server.max_response_bytes (4 KiB); send fewer rows or ask for binary outputs", errorOf(t, w))

	w = do(t, s, "POST", "/v2/models/summax/infer", rowsOf(1000, `,"outputs":[{"name":"y","parameters":{"binary_data":true}}]`))
	assert.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
	assert.Equal(t, "the response would be about 8 KiB (1000 rows x 8 B), above server.max_response_bytes (4 KiB); send fewer rows", errorOf(t, w))

	w = do(t, s, "POST", "/v2/models/summax/infer", rowsOf(200, `,"outputs":[{"name":"y","parameters":{"binary_data":true}}]`))
	assert.Equal(t, http.StatusOK, w.Code, "binary outputs of the same rows fit")
}

func TestSpentBudgetIs503(t *testing.T) {
	s, reg := boundedServer(t, 0, 1<<20)
	require.True(t, s.budget.tryTake(1<<20), "other requests hold the whole budget")
	assert.Equal(t, float64(1<<20), gauge(t, reg, "stepserve_inflight_bytes"))
	assert.Equal(t, float64(1<<20), gauge(t, reg, "stepserve_inflight_bytes_limit"))

	w := do(t, s, "POST", "/v2/models/summax/infer", rowsOf(1, ""))
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Equal(t, "1", w.Header().Get("Retry-After"))
	assert.Contains(t, errorOf(t, w), "the server is busy: requests in flight hold 1 MiB of its 1 MiB in-flight budget (server.max_inflight_bytes)")
	assert.Equal(t, 1.0, testutil.ToFloat64(s.metrics.requests.WithLabelValues("summax", "rejected")))

	s.budget.give(1 << 20)
	w = do(t, s, "POST", "/v2/models/summax/infer", rowsOf(1, ""))
	assert.Equal(t, http.StatusOK, w.Code, w.Body.String())
	assert.Zero(t, gauge(t, reg, "stepserve_inflight_bytes"), "a request gives back all it took once answered")
}

func TestRequestOverTheWholeBudgetIs413(t *testing.T) {
	s, _ := boundedServer(t, 0, 1<<20)
	w := do(t, s, "POST", "/v2/models/summax/infer", rowsOf(60000, ""))
	assert.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
	assert.Regexp(t, `^the request would take about \d\.\d MiB of memory, more than the server's whole in-flight budget of 1 MiB \(server\.max_inflight_bytes\); send a smaller request$`, errorOf(t, w))
	assert.Zero(t, s.budget.used.Load())
}

// gauge is a gauge's value as /metrics would show it.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// trickle is a body that sends one byte, then reports what the server
// holds of its budget when asked for more, and ends.
type trickle struct {
	s    *Server
	sent bool
	held int64
}

func (b *trickle) Read(p []byte) (int, error) {
	if !b.sent {
		b.sent = true
		p[0] = '{'
		return 1, nil
	}
	b.held = b.s.budget.used.Load()
	return 0, io.ErrUnexpectedEOF
}

// A body's buffer grows with what arrives, not with what it declares.
func TestBodyBufferGrowsWithWhatArrives(t *testing.T) {
	s, _ := boundedServer(t, 0, 256<<20)
	s.opts.MaxBodyBytes = 64 << 20
	body := &trickle{s: s}
	r := httptest.NewRequest("POST", "/v2/models/summax/infer", body)
	r.ContentLength = 64 << 20
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	assert.Equal(t, http.StatusBadRequest, w.Code)
	assert.Contains(t, errorOf(t, w), "reading the request body: unexpected EOF")
	assert.Equal(t, int64(bodyStart), body.held, "64 MiB declared, one byte sent: 64 KiB held")
	assert.Zero(t, s.budget.used.Load())
}

func TestScanStringsCountsAsItGoes(t *testing.T) {
	cases := []struct {
		data string
		rank int
		n    int
		want []string
		err  string
	}{
		{data: `["a","b"]`, rank: 1, n: 2, want: []string{"a", "b"}},
		{data: ` [ ["a"] , ["\u00e9\n"] ] `, rank: 2, n: 2, want: []string{"a", "é\n"}},
		{data: `[]`, rank: 1, n: 0, want: []string{}},
		{data: `["a","b","c"]`, rank: 1, n: 2, err: "more strings than the shape holds"},
		{data: `[["a"]]`, rank: 1, n: 1, err: "data is nested deeper than its shape's 1 dimensions"},
		{data: `["a",42]`, rank: 1, n: 2, err: "element 1 is 42; want a string"},
		{data: `["a",{"b":1}]`, rank: 1, n: 2, err: `element 1 is {"b":1}; want a string`},
		{data: `"a"`, rank: 1, n: 1, err: "data must be an array of strings"},
	}
	for _, c := range cases {
		got, err := scanStrings([]byte(c.data), c.rank, make([]string, 0, c.n))
		if c.err != "" {
			assert.ErrorContains(t, err, c.err, c.data)
			continue
		}
		require.NoError(t, err, c.data)
		assert.Equal(t, c.want, got, c.data)
	}
}

// Sixteen million strings for a shape of one are refused at the second.
func TestManyStringsForAShapeOfOne(t *testing.T) {
	m := stringsModel()
	body := `{"inputs":[{"name":"s","datatype":"BYTES","shape":[1],"data":[` + strings.Repeat(`"",`, 1<<20) + `""]}]}`
	allocs := testing.AllocsPerRun(1, func() {
		_, err := decodeRequest([]byte(body), -1, m, 1<<30)
		assert.ErrorContains(t, err, `input "s": more strings than the shape holds (1)`)
	})
	assert.Less(t, allocs, 20.0, "nothing is built past the first string")

	var blob []byte
	for range 3 {
		blob = binary.LittleEndian.AppendUint32(blob, 0)
	}
	hdr := `{"inputs":[{"name":"s","datatype":"BYTES","shape":[2],"parameters":{"binary_data_size":12}}]}`
	_, err := decodeRequest([]byte(hdr+string(blob)), len(hdr), m, 1<<20)
	assert.ErrorContains(t, err, `input "s": more strings than the shape holds (2)`)
}

func TestCheckLimits(t *testing.T) {
	m := newSumMax(t).program().Model
	lim := limitsOf(m.Config)
	in := `{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}`
	params := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"k` + strconv.Itoa(i) + `":1`)
		}
		return "{" + b.String() + "}"
	}
	cases := []struct {
		body, err string
	}{
		{`{"inputs":[` + in + `]}`, ""},
		{`{"inputs":[` + in + `,` + in + `]}`, `input "x" appears more than once`},
		{`{"INPUTS":[` + in + `,{"name":"z"}]}`, `the request names more than 1 input; model summax takes "x" (FP32 [-1 3])`},
		{`{"\u0069nputs":[` + in + `,{"n\u0061me":"x"}]}`, `input "x" appears more than once`},
		{`{"inputs":null,"inputs":[` + in + `,{}]}`, "more than 1 input"},
		{`{"inputs":[` + in + `],"outputs":[{"name":"y"},{"name":"y"}]}`, `output "y" is requested more than once`},
		{`{"inputs":[` + in + `],"Outputs":[{"name":"y"},{"name":"w"}]}`, `the request names more than 1 output; model summax gives "y" (FP32 [-1 2])`},
		{`{"inputs":[{"name":"x","shape":[` + strings.Repeat("1,", 16) + `1]}]}`, "an input's shape has more than 16 dimensions"},
		{`{"inputs":[{"name":"x","shape":[` + strings.Repeat("1,", 15) + `1]}]}`, ""},
		{`{"parameters":` + params(65) + `,"inputs":[` + in + `]}`, "a parameters object has more than 64 entries"},
		{`{"parameters":` + params(64) + `,"inputs":[` + in + `]}`, ""},
		{`{"inputs":[{"name":"x","parameters":` + params(65) + `}]}`, "more than 64 entries"},
		{`{"x":` + deepArray(200) + `,"inputs":[` + in + `,` + in + `]}`, "appears more than once"},
		{`{"inputs":[` + in + `,` + in, "appears more than once"},
		{`{"inputs":[1}`, ""},                     // malformed: encoding/json says so
		{`{"inputs":[1,2]}`, "more than 1 input"}, // not objects, but two of them
	}
	for _, c := range cases {
		err := checkLimits([]byte(c.body), m, lim)
		var wr wireRequest
		fast := parseWire([]byte(c.body), &wr, lim)
		if c.err == "" {
			assert.NoError(t, err, c.body)
			continue
		}
		assert.ErrorContains(t, err, c.err, c.body)
		assert.Equal(t, http.StatusBadRequest, statusOf(err))
		assert.False(t, fast, "parseWire stops at the limit too: %s", c.body)
	}
}

// FuzzCheckLimits: whatever checkLimits lets through, encoding/json
// decodes into no more inputs, outputs, dimensions or parameters than the
// limits.
func FuzzCheckLimits(f *testing.F) {
	for _, c := range wireCases {
		f.Add([]byte(c.body))
	}
	f.Add([]byte(`{"inputs":[{"name":"x"},{"NAME":"x"}],"outputs":[{},{}]}`))
	m := &models.Model{Name: "m", Config: &models.Config{
		Inputs:  []models.TensorSpec{{Name: "x", Datatype: models.FP32, Shape: []int{-1, 3}}},
		Outputs: []models.TensorSpec{{Name: "y", Datatype: models.FP32, Shape: []int{-1, 2}}},
	}}
	lim := limitsOf(m.Config)
	f.Fuzz(func(t *testing.T, body []byte) {
		if checkLimits(body, m, lim) != nil {
			return
		}
		var wr wireRequest
		if json.Unmarshal(body, &wr) != nil {
			return
		}
		if len(wr.Inputs) > lim.inputs || len(wr.Outputs) > lim.outputs || len(wr.Parameters) > maxParameters {
			t.Fatalf("let through %d inputs, %d outputs, %d parameters: %q", len(wr.Inputs), len(wr.Outputs), len(wr.Parameters), body)
		}
		for _, in := range wr.Inputs {
			if len(in.Shape) > maxRank || len(in.Parameters) > maxParameters {
				t.Fatalf("let through a shape of %d, %d parameters: %q", len(in.Shape), len(in.Parameters), body)
			}
		}
		for _, o := range wr.Outputs {
			if len(o.Parameters) > maxParameters {
				t.Fatalf("let through %d output parameters: %q", len(o.Parameters), body)
			}
		}
	})
}
