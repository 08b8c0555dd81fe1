package server

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func controlServer(t *testing.T, f *fixture) (*Server, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	s, err := New(Options{Models: f.set, ModelControl: true, MaxBodyBytes: 4096, Version: "test", Registerer: reg, Gatherer: reg})
	require.NoError(t, err)
	return s, reg
}

func modelSeries(t *testing.T, g prometheus.Gatherer, model string) []string {
	mfs, err := g.Gather()
	require.NoError(t, err)
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "model" && l.GetValue() == model {
					out = append(out, mf.GetName())
				}
			}
		}
	}
	return out
}

// Loads cancelled because the server is stopping, one running and one
// waiting behind it, are answered 503 with a message, never 200 or 400.
func TestLoadsCancelledByShutdownAre503(t *testing.T) {
	f := newSumMax(t)
	s, _ := controlServer(t, f)
	f.eng.CompileGate = make(chan struct{})
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- do(t, s, "POST", "/v2/repository/models/summax/load", nil) }()
	require.Eventually(t, func() bool { return f.eng.Loads() == 2 }, 5*time.Second, time.Millisecond)
	second := make(chan *httptest.ResponseRecorder, 1)
	go func() { second <- do(t, s, "POST", "/v2/repository/models/summax/load", nil) }()
	require.Eventually(t, func() bool { return f.set.Waiting() == 1 }, 5*time.Second, time.Millisecond, "the second waits for the first's lock")
	f.set.Drain(context.Background())
	w1, w2 := <-first, <-second
	for _, w := range []*httptest.ResponseRecorder{w1, w2} {
		assert.Equal(t, http.StatusServiceUnavailable, w.Code, "a load cancelled by shutdown is not the client's fault")
		assert.Contains(t, w.Body.String(), "shutting down")
	}
}

// A request whose body was still arriving when its model was reloaded is
// served by the new version; one whose model was unloaded meanwhile does
// not bring the deleted series back.
func TestInflightRequestAcrossReloadAndUnload(t *testing.T) {
	for _, op := range []string{"load", "unload"} {
		t.Run(op, func(t *testing.T) {
			f := newSumMax(t)
			s, reg := controlServer(t, f)
			pr, pw := io.Pipe()
			reading := make(chan struct{})
			req := httptest.NewRequest("POST", "/v2/models/summax/infer", &firstRead{r: pr, first: reading})
			req.ContentLength = -1
			rec := httptest.NewRecorder()
			done := make(chan struct{})
			go func() { s.ServeHTTP(rec, req); close(done) }()
			<-reading // looked up (the handler reads the body after the lookup), reading the body
			w := do(t, s, "POST", "/v2/repository/models/summax/"+op, nil)
			require.Equal(t, http.StatusOK, w.Code, w.Body.String())
			io.WriteString(pw, `{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`)
			pw.Close()
			<-done
			if op == "load" {
				assert.Equal(t, http.StatusOK, rec.Code, "the model is served throughout a reload")
			} else {
				assert.Empty(t, modelSeries(t, reg, "summax"), "series of an unloaded model")
			}
		})
	}
}

// firstRead closes first when its reader is first read.
type firstRead struct {
	r     io.Reader
	first chan struct{}
	once  sync.Once
}

func (f *firstRead) Read(p []byte) (int, error) {
	f.once.Do(func() { close(f.first) })
	return f.r.Read(p)
}
