package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func do(t *testing.T, method, url, token, body string) int {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	if resp.StatusCode == 401 {
		assert.Equal(t, `Bearer realm="stepserve"`, resp.Header.Get("WWW-Authenticate"))
	}
	return resp.StatusCode
}

// TestBearerTokens: inference and the repository API each require their own
// token (from a file, with rotation, or from the environment); health stays
// open for probes; /metrics moves to its own listener when configured.
func TestBearerTokens(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "inference-tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("# rotated weekly\nold-token-0123456789\nnew-token-0123456789\n"), 0o600))
	repo := t.TempDir()
	copyDigits(t, repo, "digits", "")
	t.Setenv("STEPSERVE_AUTH_REPOSITORY_TOKEN", "repository-token-abcdef")
	p := start(t, "--model_repository", repo, "--auth.inference.token_file", tokens,
		"--server.enable_model_control", "--server.metrics_addr", "127.0.0.1:0")
	infer := p.base + "/v2/models/digits/infer"
	body := string(jsonRequest("a", heldout(t)[:1]))

	assert.Equal(t, 401, do(t, "POST", infer, "", body), "no token")
	assert.Equal(t, 401, do(t, "POST", infer, "old-token-012345678", body), "a prefix of a token")
	assert.Equal(t, 401, do(t, "POST", infer, "repository-token-abcdef", body), "the other scope's token")
	assert.Equal(t, 200, do(t, "POST", infer, "old-token-0123456789", body))
	assert.Equal(t, 200, do(t, "POST", infer, "new-token-0123456789", body))
	assert.Equal(t, 401, do(t, "GET", p.base+"/v2/models/digits", "", ""), "metadata needs the token too")
	assert.Equal(t, 401, do(t, "GET", p.base+"/v2/models/nope/ready", "", ""), "no token: nothing about which models exist")
	assert.Equal(t, 200, do(t, "GET", p.base+"/v2/health/ready", "", ""), "health stays open for probes")
	assert.Equal(t, 200, do(t, "GET", p.base+"/v2/health/live", "", ""))

	assert.Equal(t, 401, do(t, "POST", p.base+"/v2/repository/index", "new-token-0123456789", ""), "inference token on the repository API")
	assert.Equal(t, 200, do(t, "POST", p.base+"/v2/repository/index", "repository-token-abcdef", ""))

	// /metrics lives on its own listener.
	assert.Equal(t, 404, do(t, "GET", p.base+"/metrics", "", ""))
	m := metricsAddr.FindStringSubmatch(p.logs.String())
	require.NotNil(t, m, "the metrics listener is logged")
	assert.Equal(t, 200, do(t, "GET", "http://"+m[1]+"/metrics", "", ""))
	assert.Equal(t, 200, do(t, "GET", "http://"+m[1]+"/v2/health/ready", "", ""))
	assert.Equal(t, 404, do(t, "POST", "http://"+m[1]+"/v2/models/digits/infer", "new-token-0123456789", body), "no inference on the metrics listener")
}

func TestWeakTokensAreRefused(t *testing.T) {
	for _, tc := range []struct{ args []string }{
		{[]string{"--auth.inference.token", "short"}},
		{[]string{"--auth.repository.token", "has a space in it!!"}},
		{[]string{"--auth.inference.token_file", "/nonexistent/tokens"}},
	} {
		out, err := runBinary(append(tc.args, "--model_repository", "../../model_repository")...)
		require.Error(t, err)
		assert.Contains(t, out, "auth.")
		assert.NotContains(t, out, "has a space", "a token is never echoed")
	}
}

// TestAdminEndpointsClosedWithOnlyAnInferenceToken: a server started with
// an inference token and no repository token (model control off, so it
// starts) keeps the administrator's endpoints closed, with or without the
// inference token: nobody turns its logging off, sets tracing or reads the
// trace files, which hold other clients' request ids.
func TestAdminEndpointsClosedWithOnlyAnInferenceToken(t *testing.T) {
	const tok = "infer-token-0123456789"
	p := start(t, "--auth.inference.token", tok, "--trace.dir", t.TempDir())
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v2/logging", ""},
		{"POST", "/v2/logging", `{"log_verbose_level":0,"log_info":false}`},
		{"GET", "/v2/trace/setting", ""},
		{"POST", "/v2/trace/setting", `{"trace_level":["TIMESTAMPS"],"trace_rate":"1","trace_count":"-1"}`},
		{"GET", "/v2/trace/files", ""},
	} {
		for _, token := range []string{"", tok} {
			assert.Equal(t, 403, do(t, c.method, p.base+c.path, token, c.body), "%s %s, token %q", c.method, c.path, token)
		}
	}
	assert.Equal(t, 200, do(t, "POST", p.base+"/v2/models/digits/infer", tok, string(jsonRequest("a", heldout(t)[:1]))), "inference is served")
}
