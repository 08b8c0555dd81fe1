package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// badModelsRepo is digits beside two models whose model.yaml no loader
// takes.
func badModelsRepo(t *testing.T) string {
	repo := t.TempDir()
	copyDigits(t, repo, "digits", "")
	for _, name := range []string{"broken", "broken2"} {
		require.NoError(t, os.MkdirAll(filepath.Join(repo, name), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(repo, name, "model.yaml"), []byte("architecture: mlp\n"), 0o644))
	}
	return repo
}

// TestBadModelsAtStart: by default (models.exit_on_error, as Triton) the
// server stops at start naming every model that failed, not only the
// first. With models.exit_on_error false it serves the models that
// loaded and lists the others UNAVAILABLE with their reasons; readiness
// then waits for them (server.strict_readiness, the default) or not.
func TestBadModelsAtStart(t *testing.T) {
	repo := badModelsRepo(t)
	out, err := runBinary("--server.addr", "127.0.0.1:0", "--model_repository", repo)
	require.Error(t, err, "the server stops")
	assert.Contains(t, out, "2 of 3 models failed to load")
	assert.Contains(t, out, "model broken:")
	assert.Contains(t, out, "model broken2:", "every failed model is named")

	// Not strict: ready with the models it has.
	p := start(t, "--model_repository", repo, "--models.exit_on_error=false", "--server.strict_readiness=false")
	assert.Equal(t, 200, status(t, "GET", p.base+"/v2/health/ready"))
	resp, body := post(t, p.base+"/v2/models/digits/infer", jsonRequest("a", heldout(t)[:1]))
	assert.Equal(t, 200, resp.StatusCode, string(body))
	resp, body = post(t, p.base+"/v2/repository/index", nil)
	require.Equal(t, 200, resp.StatusCode, string(body))
	var index []struct{ Name, State, Reason string }
	require.NoError(t, json.Unmarshal(body, &index))
	require.Len(t, index, 3)
	for _, e := range index[:2] {
		if e.Name == "digits" {
			continue
		}
		assert.Equal(t, "UNAVAILABLE", e.State, e.Name)
		assert.Contains(t, e.Reason, "model.yaml", "%s: the reason is listed", e.Name)
	}
	assert.Contains(t, p.logs.String(), "model failed at start; serving the others")

	// Strict: live and serving digits, never ready while broken is
	// missing.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(binPath, "--server.addr", addr, "--model_repository", repo, "--models.exit_on_error=false")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	base := "http://" + addr
	require.Eventually(t, func() bool {
		resp, err := http.Post(base+"/v2/models/digits/infer", "application/json", bytes.NewReader(jsonRequest("a", heldout(t)[:1])))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, 30*time.Second, 50*time.Millisecond, "digits is served")
	resp, err = http.Get(base + "/v2/health/ready")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 503, resp.StatusCode, "strict readiness: a model failed at start")
	assert.Contains(t, string(b), "broken", fmt.Sprintf("names the model: %s", b))
	assert.Equal(t, 200, status(t, "GET", base+"/v2/health/live"), "live all the same")
}
