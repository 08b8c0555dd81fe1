package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/stepserve/stepserve/internal/tlsfiles/tlstest"
	pb "github.com/stepserve/stepserve/server/inferencepb"
)

// TestTLS: with server.tls_cert_file and server.tls_key_file, the API
// answers HTTPS (HTTP/2 by ALPN, and HTTP/1.1), gRPC over TLS, a plain
// request is refused, /metrics on its own listener stays plain, and a
// certificate replaced on disk is presented from the next handshake on,
// as KServe's and cert-manager's rotations need.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, roots := tlstest.WritePair(t, dir, "first")
	cmd := exec.Command(binPath, "--server.addr", "127.0.0.1:0", "--server.grpc_addr", "127.0.0.1:0", "--server.metrics_addr", "127.0.0.1:0",
		"--model_repository", "../../model_repository", "--server.tls_cert_file", certFile, "--server.tls_key_file", keyFile)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	logs := &logBuffer{}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("server log:\n%s", logs)
		}
	})
	addrs := make(chan [3]string, 1)
	go func() {
		var a [3]string
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			logs.WriteString(line + "\n")
			if m := grpcAddrRE.FindStringSubmatch(line); m != nil {
				a[1] = m[1]
			}
			if m := metricsAddr.FindStringSubmatch(line); m != nil {
				a[2] = m[1]
			}
			if m := addrRE.FindStringSubmatch(line); m != nil {
				a[0] = m[1]
				addrs <- a
			}
		}
	}()
	var a [3]string
	select {
	case a = <-addrs:
	case <-time.After(60 * time.Second):
		t.Fatalf("server did not report its addresses:\n%s", logs)
	}
	base := "https://" + a[0]

	h2 := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}}
	require.Eventually(t, func() bool {
		resp, err := h2.Get(base + "/v2/health/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, 60*time.Second, 50*time.Millisecond, "never ready over HTTPS")
	resp, err := h2.Get(base + "/v2/models/digits")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "HTTP/2.0", resp.Proto, "HTTP/2 by ALPN")
	require.NotNil(t, resp.TLS)
	assert.Equal(t, "first", resp.TLS.PeerCertificates[0].Subject.CommonName)

	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}}
	resp, err = h1.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"model":"tiny-llama","prompt":"hello","max_tokens":4}`))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode, "%s", body)
	assert.Equal(t, "HTTP/1.1", resp.Proto)

	// Plain HTTP to the TLS port: Go's TLS server answers 400 and says
	// why.
	resp, err = http.Get("http://" + a[0] + "/v2/health/ready")
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, 400, resp.StatusCode)
		assert.Contains(t, string(b), "HTTPS")
	}

	// /metrics on its own listener stays plain: probes and Prometheus.
	resp, err = http.Get("http://" + a[2] + "/metrics")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)

	// gRPC over TLS.
	conn, err := grpc.NewClient(a[1], grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots})))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	live, err := pb.NewGRPCInferenceServiceClient(conn).ServerLive(ctx, &pb.ServerLiveRequest{})
	require.NoError(t, err)
	assert.True(t, live.Live)

	// A rotation: the new pair is presented from a handshake after the
	// files change (looked at once a second at most).
	_, _, roots2 := tlstest.WritePair(t, dir, "second")
	fresh := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots2}, DisableKeepAlives: true}}
	require.Eventually(t, func() bool {
		resp, err := fresh.Get(base + "/v2/health/live")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.TLS.PeerCertificates[0].Subject.CommonName == "second"
	}, 30*time.Second, 100*time.Millisecond, "the replaced certificate is never presented")
	assert.Contains(t, logs.String(), "TLS certificate reloaded")
}

// TestTLSNeedsBothFiles: one of the pair alone is refused at start, by
// name; a file that is not a certificate is refused before models load.
func TestTLSNeedsBothFiles(t *testing.T) {
	out, err := runBinary("--server.addr", "127.0.0.1:0", "--model_repository", t.TempDir(), "--server.tls_cert_file", "/nonexistent.crt")
	require.Error(t, err)
	assert.Contains(t, out, "server.tls_cert_file and server.tls_key_file go together")

	dir := t.TempDir()
	certFile, _, _ := tlstest.WritePair(t, dir, "x")
	out, err = runBinary("--server.addr", "127.0.0.1:0", "--model_repository", t.TempDir(), "--server.tls_cert_file", certFile, "--server.tls_key_file", certFile)
	require.Error(t, err)
	assert.Contains(t, out, "server.tls_key_file")
	assert.Contains(t, out, "tls.crt")
}
