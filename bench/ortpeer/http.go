package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// httpPeer is stepserve's HTTP binary path on the same encoder: the
// server binary started on a loopback port with the encoder as model
// "minilm", asked by one client at a time with Triton's binary tensor
// extension (the token tensors as raw bytes after the JSON header, the
// embedding back the same way).
type httpPeer struct {
	cmd    *exec.Cmd
	base   string
	client *http.Client
	logs   bytes.Buffer
	bodies map[string][]byte // per case: the request
	header map[string]int    // per case: the JSON header's length
}

func startHTTPPeer(bin, dir string, threads int, cases []caseSpec) (*httpPeer, error) {
	// A repository of the one model, linked to the encoder's files (the
	// server's repository scan takes directories, not links to them).
	repo := filepath.Join(dir, "repo")
	if err := os.RemoveAll(repo); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(repo, "minilm"), 0o755); err != nil {
		return nil, err
	}
	for _, f := range []string{"model.yaml", "weights.safetensors"} {
		if err := os.Link(filepath.Join(dir, "model", f), filepath.Join(repo, "minilm", f)); err != nil {
			return nil, err
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	p := &httpPeer{base: "http://" + addr, client: &http.Client{Timeout: time.Minute}, bodies: map[string][]byte{}, header: map[string]int{}}
	p.cmd = exec.Command(bin, "--server.addr", addr, "--server.grpc_addr=", "--model_repository", repo,
		"--engine.cpu_threads", strconv.Itoa(threads), "--log.level", "warn")
	p.cmd.Stdout, p.cmd.Stderr = &p.logs, &p.logs
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := p.client.Get(p.base + "/v2/models/minilm/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("%s did not serve minilm within 2 minutes:\n%s", bin, p.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, c := range cases {
		ids, err := os.ReadFile(filepath.Join(dir, c.Name+".ids.bin"))
		if err != nil {
			return nil, err
		}
		mask, err := os.ReadFile(filepath.Join(dir, c.Name+".mask.bin"))
		if err != nil {
			return nil, err
		}
		types := make([]byte, len(ids))
		shape := []int{c.Batch, c.Seq}
		in := func(name string, b []byte) map[string]any {
			return map[string]any{"name": name, "datatype": "INT64", "shape": shape, "parameters": map[string]any{"binary_data_size": len(b)}}
		}
		hdr, _ := json.Marshal(map[string]any{
			"inputs":  []any{in("input_ids", ids), in("attention_mask", mask), in("token_type_ids", types)},
			"outputs": []any{map[string]any{"name": "embedding", "parameters": map[string]any{"binary_data": true}}},
		})
		p.header[c.Name] = len(hdr)
		p.bodies[c.Name] = append(append(append(hdr, ids...), mask...), types...)
	}
	return p, nil
}

// infer sends case c once and returns its embeddings.
func (p *httpPeer) infer(c caseSpec) ([]float32, error) {
	req, err := http.NewRequest(http.MethodPost, p.base+"/v2/models/minilm/infer", bytes.NewReader(p.bodies[c.Name]))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Inference-Header-Content-Length", strconv.Itoa(p.header[c.Name]))
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("case %s: %s: %s", c.Name, resp.Status, body)
	}
	n, err := strconv.Atoi(resp.Header.Get("Inference-Header-Content-Length"))
	if err != nil || n > len(body) {
		return nil, fmt.Errorf("case %s: no binary answer (Inference-Header-Content-Length %q)", c.Name, resp.Header.Get("Inference-Header-Content-Length"))
	}
	raw := body[n:]
	if len(raw) != 4*c.Batch*384 {
		return nil, fmt.Errorf("case %s: %d bytes of embeddings, want %d", c.Name, len(raw), 4*c.Batch*384)
	}
	out := make([]float32, len(raw)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return out, nil
}

// rate sends case c back to back for seconds and returns sequences per
// second.
func (p *httpPeer) rate(c caseSpec, seconds float64) (float64, error) {
	if _, err := p.infer(c); err != nil { // warm
		return 0, err
	}
	start := time.Now()
	runs := 0
	for runs < 2 || time.Since(start).Seconds() < seconds {
		if _, err := p.infer(c); err != nil {
			return 0, err
		}
		runs++
	}
	return float64(runs*c.Batch) / time.Since(start).Seconds(), nil
}

func (p *httpPeer) stop() {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.cmd.Wait()
}
