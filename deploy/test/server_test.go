package test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// stepserve is the server binary: $STEPSERVE (make builds it), or built
// here once.
func stepserve(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("STEPSERVE"); b != "" {
		return b
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "stepserve-deploy-test")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "stepserve")
		out, err := exec.Command("go", "build", "-C", "../..", "-o", binPath, "./cmd/serve").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("%v: %s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return binPath
}

// server is a running stepserve.
type server struct {
	base string
	logs *bytes.Buffer
}

var addrRE = regexp.MustCompile(`msg=serving addr=(\S+)`)

// startServer runs stepserve on a free loopback port until the test ends
// and waits for it to be ready.
func startServer(t *testing.T, args ...string) *server {
	t.Helper()
	cmd := exec.Command(stepserve(t), append([]string{"--server.addr", "127.0.0.1:0", "--server.grpc_addr", "127.0.0.1:0"}, args...)...)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	s := &server{logs: &bytes.Buffer{}}
	addr := make(chan string, 1)
	var mu sync.Mutex
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			s.logs.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if m := addrRE.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	select {
	case a := <-addr:
		s.base = "http://" + a
	case <-time.After(60 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("stepserve did not start:\n%s", s.logs)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(s.base + "/v2/health/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s
			}
		}
		require.True(t, time.Now().Before(deadline), "stepserve not ready in 60s")
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *server) get(t *testing.T, path string) string {
	resp, err := http.Get(s.base + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

func (s *server) infer(t *testing.T, model, body string) {
	resp, err := http.Post(s.base+"/v2/models/"+model+"/infer", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode, string(b))
}

// repository makes a model repository with the shipped models, each
// model.yaml edited by edit (nil leaves it).
func repository(t *testing.T, edit func(name, yaml string) string) string {
	root := t.TempDir()
	for _, name := range []string{"digits", "tiny-encoder", "tiny-llama"} {
		src := filepath.Join("../../model_repository", name)
		dst := filepath.Join(root, name)
		require.NoError(t, os.MkdirAll(dst, 0o755))
		entries, err := os.ReadDir(src)
		require.NoError(t, err)
		for _, e := range entries {
			b, err := os.ReadFile(filepath.Join(src, e.Name()))
			require.NoError(t, err)
			if e.Name() == "model.yaml" && edit != nil {
				b = []byte(edit(name, string(b)))
			}
			require.NoError(t, os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644))
		}
	}
	return root
}

const digitRow = `{"inputs":[{"name":"pixels","datatype":"FP32","shape":[1,64],"data":[0,0,2,13,16,14,1,0,0,0,11,12,7,16,3,0,0,0,9,3,2,16,3,0,0,0,0,0,9,11,0,0,0,0,2,11,15,13,3,0,0,0,4,15,16,13,3,0,0,0,0,14,8,0,0,0,0,0,5,15,4,0,0,0]}]}`
