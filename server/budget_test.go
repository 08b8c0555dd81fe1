package server

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stepserve/stepserve/server/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The response never outgrows the JSON bound its buffer is sized to.
func TestResponseFitsItsFootprint(t *testing.T) {
	f := newSumMax(t)
	s, _ := newTestServer(t, f)
	body := []byte(`{"id":"\u003c<>&","inputs":[{"name":"x","datatype":"FP32","shape":[4,3],"data":[-1.1754944e-38,2,3,4,5,6,7,8,9,10,11,-3.4028235e38]}]}`)
	_, fp, err := wire.ParseRequest(body, -1, f.program().Model, 1<<20)
	require.NoError(t, err)
	w := do(t, s, "POST", "/v2/models/summax/infer", body)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	assert.LessOrEqual(t, int64(w.Body.Len()), fp.JSON)
}

// boundedServer serves summax with the given response and in-flight
// limits, and a short wait for the budget.
func boundedServer(t *testing.T, maxResponse, maxInflight int64) (*Server, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	s, err := New(Options{Models: newSumMax(t).set, MaxBodyBytes: 1 << 20, MaxResponseBytes: maxResponse,
		MaxInflightBytes: maxInflight, Registerer: reg, Gatherer: reg})
	require.NoError(t, err)
	s.c.BudgetWait = 10 * time.Millisecond
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
	require.True(t, s.c.Budget.TryTake(1<<20), "other requests hold the whole budget")
	assert.Equal(t, float64(1<<20), gauge(t, reg, "stepserve_inflight_bytes"))
	assert.Equal(t, float64(1<<20), gauge(t, reg, "stepserve_inflight_bytes_limit"))

	w := do(t, s, "POST", "/v2/models/summax/infer", rowsOf(1, ""))
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Equal(t, "1", w.Header().Get("Retry-After"))
	assert.Contains(t, errorOf(t, w), "the server is busy: requests in flight hold 1 MiB of its 1 MiB in-flight budget (server.max_inflight_bytes)")
	assert.Equal(t, 1.0, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", "rejected", "http")))

	s.c.Budget.Give(1 << 20)
	w = do(t, s, "POST", "/v2/models/summax/infer", rowsOf(1, ""))
	assert.Equal(t, http.StatusOK, w.Code, w.Body.String())
	assert.Zero(t, gauge(t, reg, "stepserve_inflight_bytes"), "a request gives back all it took once answered")
}

func TestRequestOverTheWholeBudgetIs413(t *testing.T) {
	s, _ := boundedServer(t, 0, 1<<20)
	w := do(t, s, "POST", "/v2/models/summax/infer", rowsOf(60000, ""))
	assert.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
	assert.Regexp(t, `^the request would take about \d\.\d MiB of memory, more than the server's whole in-flight budget of 1 MiB \(server\.max_inflight_bytes\); send a smaller request$`, errorOf(t, w))
	assert.Zero(t, s.c.Budget.InUse())
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
	b.held = b.s.c.Budget.InUse()
	return 0, io.ErrUnexpectedEOF
}

// A body's buffer grows with what arrives, not with what it declares.
func TestBodyBufferGrowsWithWhatArrives(t *testing.T) {
	s, _ := boundedServer(t, 0, 256<<20)
	s.c.Opts.MaxBodyBytes = 64 << 20
	body := &trickle{s: s}
	r := httptest.NewRequest("POST", "/v2/models/summax/infer", body)
	r.ContentLength = 64 << 20
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	assert.Equal(t, http.StatusBadRequest, w.Code)
	assert.Contains(t, errorOf(t, w), "reading the request body: unexpected EOF")
	assert.Equal(t, int64(64<<10 /* the body buffer's first size (core.bodyStart) */), body.held, "64 MiB declared, one byte sent: 64 KiB held")
	assert.Zero(t, s.c.Budget.InUse())
}
