package server

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOnlyServerErrorsAreLogged: what a client causes (a bad request, its
// own deadline) and overload are counted but leave no line at
// the info level; a failure of the server's own is an error line.
func TestOnlyServerErrorsAreLogged(t *testing.T) {
	// A summax whose steps wait while gate is set, so that a request can
	// be made to wait in the queue past its deadline.
	set, eng, gate := gatedSumMax(t)

	var mu sync.Mutex
	var log bytes.Buffer
	s, err := New(Options{Models: set, Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &log}, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	require.NoError(t, err)
	const row = `"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]}`
	infer := func(body string) int { return do(t, s, "POST", "/v2/models/summax/infer", []byte(body)).Code }

	assert.Equal(t, 400, infer(`{"inputs":[`))
	assert.Equal(t, 400, infer(`{"parameters":{"priority":-1},`+row))

	// 504: a step holds the model while a request with a 1µs deadline
	// waits in the queue.
	g := make(chan struct{})
	gate.Store(&g)
	held := make(chan int)
	go func() { held <- infer(`{` + row) }()
	require.Eventually(t, func() bool { return eng.Last().Steps() > 4 }, 5*time.Second, time.Millisecond, "the held step started")
	assert.Equal(t, 504, infer(`{"parameters":{"timeout":1},`+row))
	gate.Store(nil)
	close(g)
	assert.Equal(t, 200, <-held)

	mu.Lock()
	quiet := log.String()
	mu.Unlock()
	assert.NotContains(t, quiet, "inference failed", "client-caused outcomes are not logged at info")
	assert.Equal(t, 1.0, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", "timeout", "http")), "but counted")
	assert.Equal(t, 2.0, testutil.ToFloat64(s.c.Metrics.Requests.WithLabelValues("summax", "invalid", "http")))

	eng.Last().Fail(errors.New("device on fire"))
	assert.Equal(t, 500, infer(`{`+row))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 1, strings.Count(log.String(), "level=ERROR msg=\"inference failed\" protocol=http model=summax status=500"), log.String())
}
