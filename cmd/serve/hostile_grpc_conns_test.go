package main

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pb "github.com/stepserve/stepserve/server/inferencepb"
)

// http2Preface is what a gRPC client sends first on a connection: the
// HTTP/2 client preface and an empty SETTINGS frame.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + "\x00\x00\x00\x04\x00\x00\x00\x00\x00"

// silentGRPCConns opens n connections to addr at once that send the HTTP/2
// preface and SETTINGS and then nothing, and reads them in the background
// so that the server's frames never block on them. It returns those it
// opened; they are closed when the test ends.
func silentGRPCConns(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", addr, 3*time.Second)
			if err != nil {
				return
			}
			c.SetWriteDeadline(time.Now().Add(3 * time.Second))
			if _, err := io.WriteString(c, http2Preface); err != nil {
				c.Close()
				return
			}
			conns[i] = c
			go io.Copy(io.Discard, c)
		})
	}
	wg.Wait()
	var open []net.Conn
	for _, c := range conns {
		if c != nil {
			open = append(open, c)
		}
	}
	t.Cleanup(func() { closeAll(open) })
	return open
}

// TestIdleGRPCConnectionsLeaveHTTPServing (issue 28, item 3): with 1,024
// descriptors, 1,100 gRPC connections that send the preface and SETTINGS
// and then go silent take no more than server.max_connections' share:
// HTTP health, inference and repository load answer on the API listener,
// the metrics listener's probes answer, a real gRPC client gets its call
// through (a silent connection closed to make room), the accept loop never
// runs out of descriptors, and the server answers afterwards.
func TestIdleGRPCConnectionsLeaveHTTPServing(t *testing.T) {
	p := startCappedFiles(t, 1024, "--model_repository", hostileRepo(t), "--server.metrics_addr", "127.0.0.1:0",
		"--server.enable_model_control", "--auth.repository.allow_anonymous")
	require.NotEmpty(t, p.grpc)
	mbase := p.metricsBase(t)
	rss0 := p.rss(t)

	begin := time.Now()
	conns := silentGRPCConns(t, p.grpc, 1100)
	t.Logf("opened %d silent gRPC connections in %v", len(conns), time.Since(begin).Round(time.Millisecond))
	require.True(t, p.alive())

	for _, path := range []string{"/v2/health/live", "/v2/health/ready"} {
		st, took := probe(mbase + path)
		t.Logf("metrics listener %s: %d after %v", path, st, took.Round(time.Millisecond))
		assert.Equal(t, 200, st, path)
		st, took = probe(p.base + path)
		t.Logf("API listener %s: %d after %v", path, st, took.Round(time.Millisecond))
		assert.Equal(t, 200, st, path)
	}
	d := heldout(t)[0]
	st, took := inferStatus(p.base, jsonRequest("x", []digit{d}))
	t.Logf("HTTP inference beside them: %d after %v", st, took.Round(time.Millisecond))
	assert.Equal(t, 200, st)
	assert.Equal(t, 200, do(t, "POST", p.base+"/v2/repository/models/digits/load", "", ""), "repository load")

	c, _ := dialGRPC(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	begin = time.Now()
	resp, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "digits", Inputs: []*pb.ModelInferRequest_InferInputTensor{
		{Name: "pixels", Datatype: "FP32", Shape: []int64{1, 64}, Contents: &pb.InferTensorContents{Fp32Contents: d.pixels}}}})
	t.Logf("gRPC inference beside them: err %v after %v", err, time.Since(begin).Round(time.Millisecond))
	require.NoError(t, err)
	require.Len(t, resp.RawOutputContents, 1)
	assert.Equal(t, d.label, argmax(rawFP32(resp.RawOutputContents[0])))

	m := scrape(t, mbase)
	open := metricSum(t, m, "stepserve_connections_open", `listener="api"`)
	max := metricSum(t, m, "stepserve_connections_max", `listener="api"`)
	closed := metricSum(t, m, "stepserve_connections_closed_idle_total", `listener="api"`)
	t.Logf("API connections open %v of %v; closed idle %v", open, max, closed)
	assert.LessOrEqual(t, open, max)
	assert.Less(t, max, 1024.0, "the cap leaves descriptors for the rest")
	assert.Positive(t, closed, "silent connections made room")
	assert.NotContains(t, p.logs.String(), "too many open files")

	closeAll(conns)
	assert.Equal(t, d.label, classifyOne(t, p.base, d))
	assert.True(t, p.alive())
	rss := p.rss(t)
	t.Logf("rss %.1f MiB -> %.1f MiB", float64(rss0)/(1<<20), float64(rss)/(1<<20))
	assert.Less(t, rss, rss0+128<<20)
	assert.False(t, strings.Contains(p.logs.String(), "level=ERROR"), "no errors logged")
}
