package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docText is README.md and every docs/*.md, the text whose examples the
// tests run.
func docText(t *testing.T) string {
	files, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	var all strings.Builder
	for _, f := range append([]string{"../../README.md"}, files...) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		all.Write(b)
		all.WriteString("\n")
	}
	return all.String()
}

// readmeBlocks are the fenced blocks of the given language in README.md and
// docs/ that talk to a server (they name localhost:8000).
func readmeBlocks(t *testing.T, lang string) []string {
	var out []string
	for _, m := range regexp.MustCompile("(?s)```"+lang+"\n(.*?)```").FindAllStringSubmatch(docText(t), -1) {
		if strings.Contains(m[1], "localhost:8000") {
			out = append(out, m[1])
		}
	}
	return out
}

// TestREADMEExamples runs every shell and Python example of the README
// that talks to a server against a server started from the shipped model
// repository, as a newcomer would paste them: each must succeed (an HTTP
// error fails it) and answer what it says. The README cannot drift from the
// server without this failing.
func TestREADMEExamples(t *testing.T) {
	p := start(t)
	host := strings.TrimPrefix(p.base, "http://")
	sh := readmeBlocks(t, "sh")
	py := readmeBlocks(t, "python")
	require.GreaterOrEqual(t, len(sh), 3, "the README's curl examples")
	require.NotEmpty(t, py, "the README's Python client example")
	for i, block := range sh {
		script := "set -e -o pipefail\ncurl() { command curl --fail-with-body \"$@\"; }\n" +
			strings.NewReplacer("localhost:8000", host, "./bin/stepserve", binPath).Replace(block)
		out, err := exec.Command("bash", "-c", script).CombinedOutput()
		require.NoError(t, err, "README shell block %d:\n%s\noutput:\n%s", i, block, out)
		switch {
		case strings.Contains(block, "trace/setting"):
			assert.Regexp(t, `"name":"digits\.\d+\.json"`, string(out), "the trace is listed")
			assert.Contains(t, string(out), `"steps":3`)
		case strings.Contains(block, "digits/infer") && strings.Contains(block, "od -A n"):
			assert.Regexp(t, `0\.998\d+`, string(out), "the binary example shows the 7's probability")
		case strings.Contains(block, "digits/infer"):
			assert.Contains(t, string(out), `"model_name":"digits"`)
		case strings.Contains(block, "tiny-encoder/infer"):
			assert.Contains(t, string(out), `"shape":[2,128]`)
		case strings.Contains(block, "/v1/embeddings"):
			assert.Contains(t, string(out), `"object":"list"`)
			assert.Contains(t, string(out), `"usage":{"prompt_tokens":9,"total_tokens":9}`)
			assert.Contains(t, string(out), `[[`, "/embed's answer")
		case strings.Contains(block, "/rerank"):
			assert.Regexp(t, `^\[\{"index":[01],"text":"[^"]+","score":0\.\d+\},\{"index":[01],`, string(out))
		case strings.Contains(block, "advise"):
			assert.Regexp(t, `advised: +batch \[`, string(out), "the digits examples above are its traffic")
			assert.Contains(t, string(out), "buckets:\n  batch: [")
		}
	}
	for i, block := range py {
		out, err := exec.Command("/usr/bin/python3", "-c", strings.ReplaceAll(block, "localhost:8000", host)).CombinedOutput()
		require.NoError(t, err, "README Python block %d:\n%s\noutput:\n%s", i, block, out)
		assert.Contains(t, string(out), "'name': 'probabilities'")
		assert.Regexp(t, `0\.998\d+`, string(out))
	}
}

// TestREADMEGRPCExample runs the README's Python gRPC client (the blocks
// that name localhost:8001) against the real server's gRPC listener, from
// the repository's root as the README says.
func TestREADMEGRPCExample(t *testing.T) {
	if out, err := exec.Command("/usr/bin/python3", "-c", "import grpc, grpc_tools.protoc").CombinedOutput(); err != nil {
		t.Skipf("Python's grpcio and grpc_tools are needed (make deps installs python3-grpcio and python3-grpc-tools): %s", out)
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```python\n(.*?)```").FindAllStringSubmatch(docText(t), -1) {
		if strings.Contains(m[1], "localhost:8001") {
			blocks = append(blocks, m[1])
		}
	}
	require.NotEmpty(t, blocks, "the README's gRPC example")
	p := start(t)
	for i, block := range blocks {
		cmd := exec.Command("/usr/bin/python3", "-c", strings.ReplaceAll(block, "localhost:8001", p.grpc))
		cmd.Dir = "../.."
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "README gRPC block %d:\n%s\noutput:\n%s", i, block, out)
		assert.Regexp(t, `^probabilities 7 0\.998\d*\n$`, string(out))
	}
}

// TestREADMEChartPreview runs the README's offline chart preview with the
// Helm make deps builds, and checks it shows the objects it says.
func TestREADMEChartPreview(t *testing.T) {
	var block string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(docText(t), -1) {
		if strings.Contains(m[1], " template ") {
			block = m[1]
		}
	}
	require.NotEmpty(t, block, "the README's helm template example")
	bin := regexp.MustCompile(`bin/helm-v[0-9.]+`).FindString(block)
	if _, err := os.Stat("../../" + bin); err != nil {
		t.Skipf("%s is not built (make deps builds it)", bin)
	}
	cmd := exec.Command("bash", "-c", "set -e -o pipefail\n"+block)
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s\n%s", block, out)
	for _, kind := range []string{"Deployment", "Service", "ServiceMonitor", "PrometheusRule"} {
		assert.Contains(t, string(out), "kind: "+kind+"\n")
	}
}
