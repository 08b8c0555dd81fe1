package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"time"
)

// peer is a running bench/llama/llama.js.
type peer struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	logs bytes.Buffer
}

func startPeer(model string, threads, seqs int) (*peer, error) {
	p := &peer{cmd: exec.Command(*nodeBin, "bench/llama/llama.js", model, strconv.Itoa(threads), strconv.Itoa(seqs))}
	p.cmd.Stderr = &p.logs
	var err error
	if p.in, err = p.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.out = bufio.NewReaderSize(out, 1<<20)
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("node bench/llama/llama.js (run make bench-llama, which installs it): %w", err)
	}
	var hello struct {
		Ready bool `json:"ready"`
	}
	if err := p.read(&hello); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *peer) read(v any) error {
	line, err := p.out.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("llama.js: %w\n%s", err, p.logs.String())
	}
	return json.Unmarshal(line, v)
}

func (p *peer) generate(ps [][]int32, n int) (*result, error) {
	settle()
	q, _ := json.Marshal(map[string]any{"prompts": ps, "n": n})
	if _, err := p.in.Write(append(q, '\n')); err != nil {
		return nil, err
	}
	var a struct {
		Tokens [][]int32 `json:"tokens"`
		First  []float64 `json:"first"`
		Last   []float64 `json:"last"`
		Wall   float64   `json:"wall"`
	}
	if err := p.read(&a); err != nil {
		return nil, err
	}
	for i, t := range a.Tokens {
		if len(t) != n {
			return nil, fmt.Errorf("llama.cpp gave %d tokens for prompt %d, not %d", len(t), i, n)
		}
	}
	return &result{tokens: a.Tokens, first: a.First, last: a.Last, wall: a.Wall}, nil
}

func (p *peer) stop() {
	p.in.Close()
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
}

func peerVersion() string {
	b, err := os.ReadFile("bench/llama/node_modules/node-llama-cpp/package.json")
	if err != nil {
		return "?"
	}
	var v struct {
		Version string `json:"version"`
	}
	json.Unmarshal(b, &v)
	return v.Version
}
