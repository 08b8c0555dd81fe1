package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/stepserve/stepserve/bench/gguf"
	"github.com/stepserve/stepserve/internal/randweights"
	"github.com/stepserve/stepserve/models"
)

// prepare writes the model folders (float32, and bfloat16 weights opted
// into by model.yaml over the same files) and the GGUF files, and returns
// the model as stepserve reads it.
func prepare(repo string) (*models.Model, error) {
	tok, err := randweights.ByteLevelTokenizer(shape.Vocab)
	if err != nil {
		return nil, err
	}
	yaml := func(extra string) string {
		return fmt.Sprintf("engine: cpu\n%sgeneration:\n  max_num_seqs: %d\n  max_model_len: 2304\n  max_batch_tokens: 256\n", extra, max(*streams, *peerSeqs))
	}
	f32 := filepath.Join(repo, "smollm")
	if err := os.RemoveAll(repo); err != nil {
		return nil, err
	}
	if err := randweights.WriteDecoderFolder(f32, randweights.DecoderFolder{Shape: shape, Seed: 1, Tokenizer: tok,
		ModelYAML: yaml(""), Generator: "bench/llamapeer"}); err != nil {
		return nil, err
	}
	bf16 := filepath.Join(repo, "smollm-bf16")
	if err := os.MkdirAll(bf16, 0o755); err != nil {
		return nil, err
	}
	for _, f := range []string{"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"} {
		if err := os.Link(filepath.Join(f32, f), filepath.Join(bf16, f)); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(bf16, "model.yaml"), []byte(yaml("device_dtype: bfloat16\n")), 0o644); err != nil {
		return nil, err
	}
	m, err := models.Load(f32)
	if err != nil {
		return nil, err
	}
	for _, g := range []struct {
		name string
		typ  gguf.Type
	}{{"smollm-f32.gguf", gguf.F32}, {"smollm-f16.gguf", gguf.F16}} {
		if err := gguf.WriteLlama(filepath.Join(*dir, g.name), m.Config.Decoder, m.Weights, gguf.Options{Name: "smollm-shape", Type: g.typ, BOS: shape.BOS, EOS: shape.EOS}); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// agree compares greedy continuations of two prompts: stepserve float32,
// llama.cpp float32 and the PyTorch reference must be identical; the
// half-precision pair is reported (their roundings differ: bfloat16 keeps
// 8 bits of mantissa, float16 11).
func agree(srv *stepserve, f32, f16 *peer, m *models.Model) error {
	ps := [][]int32{prompts(1, *promptLen, 1)[0], prompts(1, 48, 2)[0]}
	ours, err := srv.generate("smollm", ps, *check)
	if err != nil {
		return err
	}
	theirs, err := f32.generate(ps[:1], *check)
	if err != nil {
		return err
	}
	theirs2, err := f32.generate(ps[1:], *check)
	if err != nil {
		return err
	}
	ref, err := reference(ps, *check)
	if err != nil {
		return err
	}
	for i := range ps {
		peerTokens := theirs.tokens[0]
		if i == 1 {
			peerTokens = theirs2.tokens[0]
		}
		if !slices.Equal(ours.tokens[i], ref[i]) || !slices.Equal(peerTokens, ref[i]) {
			return fmt.Errorf("greedy tokens disagree on prompt %d (%d tokens):\n  stepserve %v\n  llama.cpp %v\n  torch     %v",
				i, len(ps[i]), ours.tokens[i], peerTokens, ref[i])
		}
	}
	fmt.Printf("agreement: %d greedy tokens after each of 2 prompts identical from stepserve (float32), llama.cpp (f32 GGUF) and PyTorch\n", *check)
	half, err := srv.generate("smollm-bf16", ps[:1], *check)
	if err != nil {
		return err
	}
	h16, err := f16.generate(ps[:1], *check)
	if err != nil {
		return err
	}
	fmt.Printf("half precision: stepserve bfloat16 matches the float32 tokens for %d of %d, llama.cpp f16 for %d of %d (leading tokens equal)\n\n",
		common(half.tokens[0], ref[0]), *check, common(h16.tokens[0], ref[0]), *check)
	return nil
}

func common(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// reference runs engine/cpufallback/testdata/llama_ref.py on the float32
// folder.
func reference(ps [][]int32, n int) ([][]int32, error) {
	in, err := json.Marshal(ps)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(*python, "engine/cpufallback/testdata/llama_ref.py", filepath.Join(*dir, "repo", "smollm"), strconv.Itoa(n), "float32")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("the PyTorch reference: %w\n%s", err, stderr.String())
	}
	var ref [][]int32
	return ref, json.Unmarshal(out, &ref)
}

// prompts are n prompts of length token ids each, past the special and
// byte ids.
func prompts(n, length, seed int) [][]int32 {
	out := make([][]int32, n)
	for i := range out {
		p := make([]int32, length)
		for j := range p {
			p[j] = int32(259 + (seed*7919+i*131+j*37+11)%(*vocab-259))
		}
		out[i] = p
	}
	return out
}

// mixed are n prompts of 32 to 256 tokens.
func mixed(n, seed int) [][]int32 {
	out := make([][]int32, n)
	for i := range out {
		out[i] = prompts(1, 32+(i*97)%225, seed*100+i)[0]
	}
	return out
}
