package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
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

// memory is the server's resident set now and its peak since it started
// (the kernel's VmRSS and VmHWM), in bytes.
func (s *stepserve) memory() (rss, peak int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc status %s: %w", k, err)
		}
		if k == "VmRSS" {
			rss = kb << 10
		} else {
			peak = kb << 10
		}
	}
	return rss, peak, nil
}

// cacheTokens is the token slots of model's KV cache, from its
// vllm:cache_config_info series (block_size x num_gpu_blocks).
func (s *stepserve) cacheTokens(model string) (int64, error) {
	resp, err := s.client.Get(s.base + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	re := regexp.MustCompile(`vllm:cache_config_info\{([^}]*)\}`)
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		labels := map[string]string{}
		for _, kv := range strings.Split(m[1], ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				labels[k] = strings.Trim(v, `"`)
			}
		}
		if labels["model_name"] != model {
			continue
		}
		bs, err1 := strconv.ParseInt(labels["block_size"], 10, 64)
		n, err2 := strconv.ParseInt(labels["num_gpu_blocks"], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return 0, err
		}
		return bs * n, nil
	}
	return 0, fmt.Errorf("%s: no vllm:cache_config_info series", model)
}

// margin is how many nats stepserve's greedy choice after prompt leads
// token alt by, in its own log-probabilities (its 5 most likely; +Inf
// where alt is not among them).
func (s *stepserve) margin(model string, prompt []int32, alt int32) (float64, error) {
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0,
		"logprobs": 5, "return_tokens_as_token_ids": true})
	resp, err := s.client.Post(s.base+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var c struct {
		Choices []struct {
			Logprobs struct {
				TokenLogprobs []float64            `json:"token_logprobs"`
				TopLogprobs   []map[string]float64 `json:"top_logprobs"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		return 0, fmt.Errorf("%s: logprobs: %w", model, err)
	}
	if len(c.Choices) == 0 || len(c.Choices[0].Logprobs.TopLogprobs) == 0 || len(c.Choices[0].Logprobs.TokenLogprobs) == 0 {
		return 0, fmt.Errorf("%s: no logprobs in the answer (%s)", model, resp.Status)
	}
	lp := c.Choices[0].Logprobs
	a, ok := lp.TopLogprobs[0][fmt.Sprintf("token_id:%d", alt)]
	if !ok {
		return math.Inf(1), nil
	}
	return lp.TokenLogprobs[0] - a, nil
}
