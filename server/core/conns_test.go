package core

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/internal/tlsfiles"
	"github.com/stepserve/stepserve/internal/tlsfiles/tlstest"
)

// limited serves h on a loopback listener within a limit of max
// connections.
func limited(t *testing.T, max int, h http.Handler) (*ConnLimit, string) {
	t.Helper()
	l, err := NewConnLimit(ConnLimitOptions{Max: max, Listener: "api", Key: "server.max_connections", Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{Handler: h}
	go l.Serve(hs, ln)
	t.Cleanup(func() { hs.Close() })
	return l, ln.Addr().String()
}

func (l *ConnLimit) openNow() int { l.mu.Lock(); defer l.mu.Unlock(); return l.open }

// idleNow counts the connections without a request in progress, as the
// server has seen them go idle (it marks one idle just after writing its
// response, so a client may read the answer first).
func (l *ConnLimit) idleNow() int { l.mu.Lock(); defer l.mu.Unlock(); return l.waiting.n }

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip sends a GET on c and reads the answer.
func roundTrip(t *testing.T, c net.Conn, path string) (*http.Response, string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	_, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// closedByServer reports whether the server closes c within wait.
func closedByServer(c net.Conn, wait time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(wait))
	defer c.SetReadDeadline(time.Time{})
	_, err := c.Read(make([]byte, 1))
	return err != nil && !isTimeout(err)
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

var ok200 = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })

// TestConnLimitClosesTheLongestIdle: at the limit, a new connection takes
// the place of the one idle longest, whether it sent nothing yet or is a
// keep-alive connection between requests.
func TestConnLimitClosesTheLongestIdle(t *testing.T) {
	l, addr := limited(t, 2, ok200)
	silent := dial(t, addr)
	require.Eventually(t, func() bool { return l.openNow() == 1 }, 5*time.Second, time.Millisecond)
	keepAlive := dial(t, addr)
	resp, _ := roundTrip(t, keepAlive, "/")
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, 2, l.openNow())
	require.Eventually(t, func() bool { return l.idleNow() == 2 }, 5*time.Second, time.Millisecond)

	third := dial(t, addr)
	resp, body := roundTrip(t, third, "/")
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "ok", body)
	require.Eventually(t, func() bool { return l.idleNow() == 2 }, 5*time.Second, time.Millisecond)
	assert.True(t, closedByServer(silent, 5*time.Second), "the longest idle, which never sent a request, made room")
	assert.False(t, closedByServer(keepAlive, 200*time.Millisecond))

	fourth := dial(t, addr)
	resp, _ = roundTrip(t, fourth, "/")
	assert.Equal(t, 200, resp.StatusCode)
	assert.True(t, closedByServer(keepAlive, 5*time.Second), "then the keep-alive connection idle longest")
	resp, _ = roundTrip(t, third, "/")
	assert.Equal(t, 200, resp.StatusCode, "the others keep serving")

	assert.Equal(t, 2, l.openNow())
	assert.Equal(t, 2.0, testutil.ToFloat64(l.closedIdle))
	assert.Zero(t, testutil.ToFloat64(l.refused))
}

// TestConnLimitRefusesWhenAllAreBusy: busy connections are never closed
// for a newcomer; with every one busy the newcomer gets 503 at once, and
// a slot freed is taken again.
func TestConnLimitRefusesWhenAllAreBusy(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 2)
	l, addr := limited(t, 2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			entered <- struct{}{}
			<-release
		}
		io.WriteString(w, "ok")
	}))
	busy := make([]chan *http.Response, 2)
	for i := range busy {
		busy[i] = make(chan *http.Response, 1)
		c := dial(t, addr)
		go func() {
			io.WriteString(c, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				resp = &http.Response{StatusCode: 0}
			}
			busy[i] <- resp
		}()
		<-entered
	}

	c := dial(t, addr)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err, "the refusal is an answer, not a hang")
	body, _ := io.ReadAll(resp.Body)
	assert.Equal(t, 503, resp.StatusCode)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	assert.Equal(t, `{"error":"the server has 2 connections open, every one busy with a request (server.max_connections); retry shortly"}`+"\n", string(body))
	assert.True(t, closedByServer(c, 5*time.Second))
	assert.Equal(t, 1.0, testutil.ToFloat64(l.refused))

	close(release)
	for _, b := range busy {
		assert.Equal(t, 200, (<-b).StatusCode, "busy connections are never closed to make room")
	}
	// The server marks a connection idle just after it writes the
	// response the client has read: a newcomer may find it busy a moment.
	assert.Eventually(t, func() bool {
		resp, _ := roundTrip(t, dial(t, addr), "/")
		return resp.StatusCode == 200
	}, 5*time.Second, 10*time.Millisecond, "a keep-alive connection, idle now, made room")
}

// TestConnLimitCountsEveryClose: the open count returns to zero however
// connections end.
func TestConnLimitCountsEveryClose(t *testing.T) {
	l, addr := limited(t, 8, ok200)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	for range 20 {
		resp, err := client.Get("http://" + addr + "/")
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	var conns []net.Conn
	for range 12 {
		conns = append(conns, dial(t, addr))
	}
	for _, c := range conns {
		c.Close()
	}
	client.CloseIdleConnections()
	assert.Eventually(t, func() bool { return l.openNow() == 0 }, 5*time.Second, 5*time.Millisecond)
	assert.Zero(t, l.waiting.n)
}

func TestConnectionCap(t *testing.T) {
	var rl syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl))
	files := int(min(rl.Cur, 1<<24))
	var log bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&log, nil))

	assert.Equal(t, min(max(files-connReserve, files/2), maxDefaultConns), ConnectionCap(0, logger), "from RLIMIT_NOFILE %d", files)
	assert.Equal(t, 50, ConnectionCap(50, logger))
	assert.Empty(t, log.String())
	assert.Equal(t, files+1, ConnectionCap(files+1, logger), "kept as configured")
	assert.Contains(t, log.String(), "server.max_connections is above what the descriptor limit leaves")

	_, err := NewConnLimit(ConnLimitOptions{})
	assert.ErrorContains(t, err, "ConnLimitOptions.Max is 0; want at least 1")
}

// TestConnStateChangesDoNotAllocate: a connection goes in and out of the
// idle list with every request it serves; that costs no allocation.
func TestConnStateChangesDoNotAllocate(t *testing.T) {
	l, err := NewConnLimit(ConnLimitOptions{Max: 4, Listener: "api"})
	require.NoError(t, err)
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	lc := l.admit(a, false)
	require.NotNil(t, lc)
	allocs := testing.AllocsPerRun(100, func() {
		l.track(lc, http.StateActive)
		l.track(lc, http.StateIdle)
	})
	assert.Zero(t, allocs)
	assert.Equal(t, 1, l.idleNow())
	l.track(lc, http.StateActive)
	assert.Zero(t, l.idleNow())
}

// TestConnLimitOverTLS: over TLS the limit still tells busy connections
// from idle ones (the server sees *tls.Conn, not the limit's), so a
// request in progress is never closed to make room, and a newcomer with
// every connection busy is closed, not sent a plaintext 503 it could not
// read.
func TestConnLimitOverTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, roots := tlstest.WritePair(t, dir, "localhost")
	pair, err := tlsfiles.Load(certFile, keyFile, nil)
	require.NoError(t, err)
	release := make(chan struct{})
	l, err := NewConnLimit(ConnLimitOptions{Max: 1, Listener: "api", Key: "server.max_connections", Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := &http.Server{TLSConfig: pair.Config("http/1.1"), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		io.WriteString(w, "ok")
	})}
	go l.Serve(hs, ln)
	t.Cleanup(func() { hs.Close() })
	addr := ln.Addr().String()

	busy, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "localhost"})
	require.NoError(t, err)
	defer busy.Close()
	_, err = io.WriteString(busy, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return l.idleNow() == 0 && l.openNow() == 1 }, 5*time.Second, time.Millisecond, "the request in progress makes its connection busy")

	newcomer := dial(t, addr)
	assert.True(t, closedByServer(newcomer, 5*time.Second), "with every connection busy, the newcomer is closed")
	close(release)
	busy.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(busy), nil)
	require.NoError(t, err, "the busy connection was not closed for the newcomer")
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, 1.0, testutil.ToFloat64(l.refused))
}
