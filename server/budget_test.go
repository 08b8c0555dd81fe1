package server

import (
	"context"
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
	_, f, err := parseRequest([]byte(`{"id":"a<b","inputs":[{"name":"x","datatype":"FP32","shape":[5,3],"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}]}`), -1, m, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, footprint{rows: 5, inputs: 5 * 3 * 4, outputs: 5 * 2 * 4,
		json: 64 + int64(len("summax")+len("1")+6*3) + 112 + int64(len("y")+21*2) + 5*2*16}, f)

	// Text: every row may take the longest seq bucket.
	tm := textModel(t)
	_, f, err = parseRequest([]byte(`{"inputs":[{"name":"text","datatype":"BYTES","shape":[2],"data":["a",""]}]}`), -1, tm, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, int64(2*16+len(`["a",""]`)), f.inputs, "string headers and the text")
	assert.Equal(t, tm.StepBytes(2, 128), f.step)
	assert.Equal(t, int64(2*128*4), f.outputs)
	assert.Zero(t, f.binary)

	hdr := `{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":7}}],"outputs":[{"name":"embedding","parameters":{"binary_data":true}}]}`
	_, f, err = parseRequest([]byte(hdr+"\x03\x00\x00\x00abc"), len(hdr), tm, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, int64(16+7), f.inputs)
	assert.Equal(t, int64(128*4), f.binary, "binary outputs are the output buffers, sent as they are")
	assert.Less(t, f.json, int64(512))
}

// The response never outgrows the JSON bound its buffer is sized to.
func TestResponseFitsItsFootprint(t *testing.T) {
	f := newSumMax(t)
	s, _ := newTestServer(t, f)
	body := []byte(`{"id":"\u003c<>&","inputs":[{"name":"x","datatype":"FP32","shape":[4,3],"data":[-1.1754944e-38,2,3,4,5,6,7,8,9,10,11,-3.4028235e38]}]}`)
	_, fp, err := parseRequest(body, -1, f.program().Model, 1<<20)
	require.NoError(t, err)
	w := do(t, s, "POST", "/v2/models/summax/infer", body)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	assert.LessOrEqual(t, int64(w.Body.Len()), fp.json)
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
	assert.Equal(t, 1.0, testutil.ToFloat64(s.metrics.requests.WithLabelValues("summax", "rejected", "http")))

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
