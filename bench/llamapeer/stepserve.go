package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stepserve is the server binary serving the repository.
type stepserve struct {
	cmd    *exec.Cmd
	base   string
	client *http.Client
	logs   bytes.Buffer
	exited chan error // the process's Wait
}

func startServer(bin, repo string, names []string, threads int) (*stepserve, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	s := &stepserve{base: "http://" + addr, client: &http.Client{Timeout: 10 * time.Minute}}
	s.cmd = exec.Command(bin, "--server.addr", addr, "--server.grpc_addr=", "--model_repository", repo,
		"--engine.cpu_threads", strconv.Itoa(threads), "--log.level", "warn")
	s.cmd.Stdout, s.cmd.Stderr = &s.logs, &s.logs
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s (make build): %w", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait() }()
	s.exited = exited
	deadline := time.Now().Add(10 * time.Minute)
	for _, m := range names {
		for {
			resp, err := s.client.Get(s.base + "/v2/models/" + m + "/ready")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			select {
			case err := <-exited:
				exited <- err
				return nil, fmt.Errorf("%s exited loading %s (%v; out of memory?):\n%s", bin, m, err, s.logs.String())
			default:
			}
			if time.Now().After(deadline) {
				s.stop()
				return nil, fmt.Errorf("%s did not serve %s within 10 minutes:\n%s", bin, m, s.logs.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return s, nil
}

func (s *stepserve) stop() {
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	err := <-s.exited
	s.exited <- err
}

// generate sends every prompt at once, each its own streamed
// /v1/completions request, and collects the token ids as they arrive.
func (s *stepserve) generate(model string, ps [][]int32, n int) (*result, error) {
	settle()
	r := &result{tokens: make([][]int32, len(ps)), first: make([]float64, len(ps)), last: make([]float64, len(ps))}
	errs := make([]error, len(ps))
	start := time.Now()
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { errs[i] = s.one(model, p, n, start, r, i) })
	}
	wg.Wait()
	r.wall = time.Since(start).Seconds()
	return r, errors.Join(errs...)
}

func (s *stepserve) one(model string, prompt []int32, n int, start time.Time, r *result, i int) error {
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0,
		"ignore_eos": true, "stream": true, "logprobs": 0, "return_tokens_as_token_ids": true})
	resp, err := s.client.Post(s.base+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s: %s", model, resp.Status, b)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		now := time.Since(start).Seconds()
		var c struct {
			Choices []struct {
				Logprobs *struct {
					Tokens []string `json:"tokens"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return err
		}
		for _, ch := range c.Choices {
			if ch.Logprobs == nil {
				continue
			}
			for _, t := range ch.Logprobs.Tokens {
				id, err := strconv.Atoi(strings.TrimPrefix(t, "token_id:"))
				if err != nil {
					return fmt.Errorf("token %q: %w", t, err)
				}
				if len(r.tokens[i]) == 0 {
					r.first[i] = now
				}
				r.tokens[i] = append(r.tokens[i], int32(id))
				r.last[i] = now
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if len(r.tokens[i]) != n {
		return fmt.Errorf("%s gave %d tokens, not %d", model, len(r.tokens[i]), n)
	}
	return nil
}
