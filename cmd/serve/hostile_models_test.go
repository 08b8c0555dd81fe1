package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hostileModel is a model directory that must not load: how it is made
// from a copy of a good model, and what the refusal says.
type hostileModel struct {
	name string
	// base is the shipped model the directory starts as a copy of.
	base string
	make func(t *testing.T, dir string)
	want string
}

// editYAML replaces old with new in dir's model.yaml.
func editYAML(old, new string) func(t *testing.T, dir string) {
	return func(t *testing.T, dir string) {
		path := filepath.Join(dir, "model.yaml")
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Contains(t, string(b), old)
		require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(b), old, new, 1)), 0o644))
	}
}

// fifo makes dir's file a FIFO.
func fifo(file string) func(t *testing.T, dir string) {
	return func(t *testing.T, dir string) {
		path := filepath.Join(dir, file)
		require.NoError(t, os.Remove(path))
		require.NoError(t, syscall.Mkfifo(path, 0o644))
	}
}

// symlink makes dir's file a symbolic link to target.
func symlink(file, target string) func(t *testing.T, dir string) {
	return func(t *testing.T, dir string) {
		path := filepath.Join(dir, file)
		require.NoError(t, os.Remove(path))
		require.NoError(t, os.Symlink(target, path))
	}
}

// writeFile replaces dir's file with content.
func writeFile(file, content string) func(t *testing.T, dir string) {
	return func(t *testing.T, dir string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, file), []byte(content), 0o644))
	}
}

func hostileModels() []hostileModel {
	return []hostileModel{
		{name: "layers 2e9", base: "tiny-encoder", make: editYAML("layers: 2\n", "layers: 2000000000\n"),
			want: "encoder.layers: 2000000000 is above the limit of"},
		{name: "batch bucket 65536", base: "tiny-encoder", make: editYAML("batch: [1, 4, 16, 64]", "batch: [1, 65536]"),
			want: "above models.max_model_bytes"},
		{name: "FIFO model.yaml", base: "digits", make: fifo("model.yaml"),
			want: "/model.yaml: not a regular file"},
		{name: "FIFO weights", base: "digits", make: fifo("weights.safetensors"),
			want: "/weights.safetensors: not a regular file"},
		{name: "weights linked to /etc/passwd", base: "digits", make: symlink("weights.safetensors", "/etc/passwd"),
			want: "/weights.safetensors: a symbolic link out of the model repository"},
		{name: "model.yaml linked to /etc/passwd", base: "digits", make: symlink("model.yaml", "/etc/passwd"),
			want: "/model.yaml: a symbolic link out of the model repository"},
		{name: "vocab linked to /etc/passwd", base: "tiny-encoder", make: symlink("vocab.txt", "/etc/passwd"),
			want: "/vocab.txt: a symbolic link out of the model repository"},
		{name: "model.yaml holding passwd lines", base: "digits", make: writeFile("model.yaml", "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"),
			want: "line 1: want a mapping of model.yaml's keys, found a string"},
		{name: "model.yaml over 1 MiB", base: "digits", make: writeFile("model.yaml", "architecture: mlp\n#"+strings.Repeat("x", 1<<20)+"\n"),
			want: "/model.yaml: larger than the 1048576-byte limit"},
		{name: "weights header over the limit", base: "digits", make: writeFile("weights.safetensors", "\x00\x00\x00\x10\x00\x00\x00\x00root:x:0:0"),
			want: "header length 268435456 exceeds the"},
	}
}

// makeHostileModel copies tc's base model into repo under name and spoils it.
func makeHostileModel(t *testing.T, repo, name string, tc hostileModel) {
	src := map[string]string{"digits": "../../model_repository/digits", "tiny-encoder": "../../model_repository/tiny-encoder"}[tc.base]
	dst := filepath.Join(repo, name)
	require.NoError(t, os.MkdirAll(dst, 0o755))
	for _, f := range []string{"model.yaml", "weights.safetensors", "vocab.txt", "labels.txt"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if os.IsNotExist(err) {
			continue
		}
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, f), b, 0o644))
	}
	tc.make(t, dst)
}

// assertNames checks that an error names the model (and its file, where
// the problem is a file) and the problem.
func assertNames(t *testing.T, text, model string, tc hostileModel) {
	t.Helper()
	if strings.HasPrefix(tc.want, "/") {
		assert.Contains(t, text, model+tc.want, tc.name)
	} else {
		assert.Contains(t, text, model, tc.name)
		assert.Contains(t, text, tc.want, tc.name)
	}
}

// assertNoLeak checks that an error text shows neither the server's paths
// nor the bytes of a file it was pointed at.
func assertNoLeak(t *testing.T, text, repo, what string) {
	t.Helper()
	assert.NotContains(t, text, repo, "%s: the error shows the repository's absolute path", what)
	assert.NotContains(t, text, "root:", "%s: the error echoes file bytes", what)
}

// TestHostileModelsAtStartup: a repository holding a model that must not
// load stops the server before it listens, at once, with an error naming
// the file and the problem: no hang, no crash, no listener.
func TestHostileModelsAtStartup(t *testing.T) {
	for _, tc := range hostileModels() {
		t.Run(tc.name, func(t *testing.T) {
			repo := t.TempDir()
			copyDigits(t, repo, "digits", "")
			makeHostileModel(t, repo, "bad", tc)
			// The deadline only keeps a hanging server from hanging the
			// suite; a server that needs it has failed.
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, "prlimit", "--as="+strconv.Itoa(hostileMemoryCap), "--", binPath,
				"--server.addr", "127.0.0.1:0", "--model_repository", repo)
			began := time.Now()
			out, err := cmd.CombinedOutput()
			took := time.Since(began)
			var peak int64
			if cmd.ProcessState != nil {
				peak = cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10
			}
			t.Logf("%s: exit %v after %v, peak RSS %.1f MiB", tc.name, err, took.Round(time.Millisecond), float64(peak)/(1<<20))
			require.NoError(t, ctx.Err(), "the server hung at start-up; output:\n%s", out)
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "the server must exit non-zero: %v\n%s", err, out)
			assert.Equal(t, 1, exit.ExitCode(), "%s", out)
			assertNames(t, string(out), "bad", tc)
			assert.NotContains(t, string(out), "msg=serving", "the server listened")
			for _, crash := range []string{"panic:", "fatal error:", "goroutine "} {
				assert.NotContains(t, string(out), crash, "a crash trace")
			}
			assert.NotContains(t, string(out), "root:", "the error echoes file bytes")
		})
	}
}

// TestHostileModelsThroughTheRepositoryAPI: each hostile model is a 400
// naming the problem, at once, while the server stays up, the other models
// keep serving, a served model whose files turn hostile keeps serving its
// loaded version, and the error shows neither the server's paths nor file
// bytes.
func TestHostileModelsThroughTheRepositoryAPI(t *testing.T) {
	repo := hostileRepo(t)
	copyDigits(t, repo, "victim", "")
	p := startCapped(t, hostileMemoryCap, "--model_repository", repo, "--server.enable_model_control")
	d := heldout(t)[0]
	client := &http.Client{Timeout: 60 * time.Second}
	load := func(name string) (int, string, time.Duration) {
		began := time.Now()
		resp, err := client.Post(p.base+"/v2/repository/models/"+name+"/load", "application/json", nil)
		require.NoError(t, err, "load %s: no answer", name)
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		require.NoError(t, err)
		return resp.StatusCode, string(b), time.Since(began)
	}
	rssBefore := p.rss(t)
	for i, tc := range hostileModels() {
		name := fmt.Sprintf("bad-%d", i)
		makeHostileModel(t, repo, name, tc)
		code, body, took := load(name)
		t.Logf("%s: %d after %v, peak RSS %.1f MiB: %s", tc.name, code, took.Round(time.Millisecond), float64(p.peakRSS(t))/(1<<20), body)
		assert.Equal(t, 400, code, "%s: %s", tc.name, body)
		assertNames(t, body, name, tc)
		assertNoLeak(t, body, repo, tc.name)
		require.True(t, p.alive(), "%s: the server died", tc.name)
		assert.Equal(t, d.label, classifyOne(t, p.base, d), "%s: digits still serves", tc.name)

		// The same files under a served model's name: the load fails, the
		// loaded version keeps serving.
		require.NoError(t, os.RemoveAll(filepath.Join(repo, "victim")))
		makeHostileModel(t, repo, "victim", tc)
		code, body, _ = load("victim")
		assert.Equal(t, 400, code, "%s (reload): %s", tc.name, body)
		assertNoLeak(t, body, repo, tc.name+" (reload)")
		assert.Equal(t, 200, status(t, "GET", p.base+"/v2/models/victim/ready"), "%s: the loaded victim keeps serving", tc.name)
	}
	// The index names why each failed, without leaking either.
	resp, body := post(t, p.base+"/v2/repository/index", nil)
	require.Equal(t, 200, resp.StatusCode)
	assertNoLeak(t, string(body), repo, "index")

	// Loads still work after all that: no lock held, nothing left behind.
	code, body2, _ := load("digits")
	assert.Equal(t, 200, code, body2)
	embed(t, p.base, "The water is warm.")
	rssAfter := p.rss(t)
	t.Logf("rss %.1f MiB -> %.1f MiB, peak %.1f MiB", float64(rssBefore)/(1<<20), float64(rssAfter)/(1<<20), float64(p.peakRSS(t))/(1<<20))
	assert.Less(t, rssAfter, rssBefore+256<<20, "memory returns after the refused loads")
}

// TestModelOverTheMemoryLimit: a model whose estimated resident size is
// above models.max_model_bytes is refused before it is read, at start-up
// and through the repository API, naming the estimate and the limit.
func TestModelOverTheMemoryLimit(t *testing.T) {
	repo := t.TempDir()
	copyDigits(t, repo, "digits", "")
	makeHostileModel(t, repo, "tiny-encoder", hostileModel{base: "tiny-encoder", make: func(*testing.T, string) {}})
	out, err := runBinary("--model_repository", repo, "--server.addr", "127.0.0.1:0", "--models.max_model_bytes", "1MiB")
	require.Error(t, err, out)
	assert.Contains(t, out, "tiny-encoder: needs about")
	assert.Contains(t, out, "above models.max_model_bytes (1 MiB)")

	require.NoError(t, os.RemoveAll(filepath.Join(repo, "tiny-encoder")))
	p := startCapped(t, hostileMemoryCap, "--model_repository", repo, "--server.enable_model_control", "--models.max_model_bytes", "1MiB")
	makeHostileModel(t, repo, "tiny-encoder", hostileModel{base: "tiny-encoder", make: func(*testing.T, string) {}})
	resp, body := post(t, p.base+"/v2/repository/models/tiny-encoder/load", nil)
	assert.Equal(t, 400, resp.StatusCode, string(body))
	assert.Contains(t, string(body), "above models.max_model_bytes (1 MiB)")
	assertNoLeak(t, string(body), repo, "over the limit")
	assert.Equal(t, heldout(t)[0].label, classifyOne(t, p.base, heldout(t)[0]))
}
