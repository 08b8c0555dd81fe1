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

	benchgguf "github.com/stepserve/stepserve/bench/gguf"
	"github.com/stepserve/stepserve/internal/randweights"
	"github.com/stepserve/stepserve/models"
)

// prepare writes, under base, the shape's float32 Hugging Face folder
// (src, outside the repository), one model of the repository per format
// (repo/NAME-FORMAT: the same files linked, and a model.yaml choosing the
// format) and the GGUF file of each format (NAME-FORMAT.gguf), and
// returns the parameter count. Nothing but what the formats need is
// written: a 1B shape's float32 folder alone is 5 GB.
func prepare(base string, s shapeSpec, fs []format) (int64, error) {
	if *reuse {
		if n, ok := reused(base, s, fs); ok {
			return n, nil
		}
	}
	if err := os.RemoveAll(base); err != nil {
		return 0, err
	}
	tok, err := randweights.ByteLevelTokenizer(s.d.Vocab)
	if err != nil {
		return 0, err
	}
	src := filepath.Join(base, "src")
	if err := randweights.WriteDecoderFolder(src, randweights.DecoderFolder{Shape: s.d, Seed: 1, Tokenizer: tok,
		Generator: "bench/llamapeer"}); err != nil {
		return 0, err
	}
	ctx := max(*promptLen+*newTokens, *streamPrompt+*streamNew, 128+*checkF32, 128+*check) + 64
	yaml := func(extra string) string {
		return fmt.Sprintf("engine: cpu\n%sgeneration:\n  max_num_seqs: %d\n  max_model_len: %d\n  max_batch_tokens: %d\n",
			extra, max(*streams, *peerSeqs), ctx, max(512, *streams**streamPrompt))
	}
	for _, f := range fs {
		m := filepath.Join(base, "repo-"+f.name, s.name+"-"+f.name)
		if err := os.MkdirAll(m, 0o755); err != nil {
			return 0, err
		}
		for _, n := range []string{"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"} {
			if err := os.Link(filepath.Join(src, n), filepath.Join(m, n)); err != nil {
				return 0, err
			}
		}
		if err := os.WriteFile(filepath.Join(m, "model.yaml"), []byte(yaml(f.yaml)), 0o644); err != nil {
			return 0, err
		}
	}
	m, err := models.Load(src)
	if err != nil {
		return 0, err
	}
	params := int64(0)
	for _, t := range m.Weights.Tensors {
		params += int64(t.Numel())
	}
	for _, f := range fs {
		path := filepath.Join(base, s.name+"-"+f.name+".gguf")
		if err := benchgguf.Write(path, m.Config.Decoder, m.Weights, benchgguf.Options{Type: f.peer, Name: s.name + "-shape", BOS: s.d.BOS, EOS: s.d.EOS}); err != nil {
			return 0, err
		}
	}
	return params, nil
}

// reused is the parameter count of a shape whose files a run with -keep
// left, if every one the formats need is there.
func reused(base string, s shapeSpec, fs []format) (int64, bool) {
	for _, f := range fs {
		for _, p := range []string{filepath.Join(base, s.name+"-"+f.name+".gguf"), filepath.Join(base, "repo-"+f.name, s.name+"-"+f.name, "model.yaml")} {
			if _, err := os.Stat(p); err != nil {
				return 0, false
			}
		}
	}
	m, err := models.Load(filepath.Join(base, "src"))
	if err != nil {
		return 0, false
	}
	n := int64(0)
	for _, t := range m.Weights.Tensors {
		n += int64(t.Numel())
	}
	return n, true
}

// agree compares greedy continuations of two prompts before anything is
// timed. SmolLM in float32: stepserve, llama.cpp and the PyTorch
// reference must be identical. Every other pair is reported: the leading
// tokens on which stepserve and llama.cpp agree and, where they part,
// how far stepserve's choice leads llama.cpp's token in stepserve's own
// log-probabilities. A random model with tied embeddings has logits that
// spread by about the square root of its width (about 200 at hidden
// 2048), and its greedy text repeats itself, so one near tie broken the
// other way changes every later token: llama.cpp's Q8_0 alone moves a
// Llama-3.2-1B shape's logit gaps by up to 4 nats between its flash
// attention on and off. A parting within 8 tokens is flagged as a bug
// only when stepserve's margin is above nearTie.
func agree(s shapeSpec, srvs []*stepserve, fs []format, names []string, peers []*peer) error {
	for i, f := range fs {
		n := *check
		if f.name == "f32" && s.name == "smollm" {
			n = *checkF32
		}
		ps := [][]int32{prompts(1, 128, 1)[0], prompts(1, 48, 2)[0]}
		ours, err := srvs[i].generate(names[i], ps, n)
		if err != nil {
			return err
		}
		theirs := make([][]int32, len(ps))
		for j := range ps {
			t, err := peers[i].generate(ps[j:j+1], n)
			if err != nil {
				return err
			}
			theirs[j] = t.tokens[0]
		}
		if f.name == "f32" && s.name == "smollm" {
			ref, err := reference(filepath.Join(*dir, s.name, "src"), ps, n)
			if err != nil {
				return err
			}
			for j := range ps {
				if !slices.Equal(ours.tokens[j], ref[j]) || !slices.Equal(theirs[j], ref[j]) {
					return fmt.Errorf("greedy tokens disagree on prompt %d (%d tokens):\n  stepserve %v\n  llama.cpp %v\n  torch     %v",
						j, len(ps[j]), ours.tokens[j], theirs[j], ref[j])
				}
			}
			fmt.Printf("agreement, f32: %d greedy tokens after each of 2 prompts (128 and 48 tokens) identical from stepserve, llama.cpp and PyTorch\n", n)
			continue
		}
		a, b := common(ours.tokens[0], theirs[0]), common(ours.tokens[1], theirs[1])
		verdict, bug := "", false
		for j, c := range []int{a, b} {
			if c >= n {
				continue
			}
			m, err := srvs[i].margin(names[i], append(slices.Clone(ps[j]), ours.tokens[j][:c]...), theirs[j][c])
			if err != nil {
				return err
			}
			verdict += fmt.Sprintf("; prompt %d parts at token %d, where stepserve's choice leads llama.cpp's by %.2f nats", j, c, m)
			bug = bug || c < 8 && m >= nearTie
		}
		if bug {
			verdict += "; A REAL DISAGREEMENT, not a near tie"
			for j := range ps {
				verdict += fmt.Sprintf("\n  prompt %d: stepserve %v..., llama.cpp %v...", j, ours.tokens[j][:min(8, n)], theirs[j][:min(8, n)])
			}
		}
		fmt.Printf("agreement, %s: stepserve and llama.cpp give the same leading greedy tokens for %d and %d of %d after 2 prompts (128 and 48 tokens)%s\n",
			f.label, a, b, n, verdict)
	}
	return nil
}

// nearTie is the margin in nats below which a parting is a near tie
// (agree).
const nearTie = 3

func common(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// reference runs engine/cpufallback/testdata/llama_ref.py on the float32
// folder.
func reference(folder string, ps [][]int32, n int) ([][]int32, error) {
	in, err := json.Marshal(ps)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(*python, "engine/cpufallback/testdata/llama_ref.py", folder, strconv.Itoa(n), "float32")
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
// byte ids of the shape's vocabulary.
func prompts(n, length, seed int) [][]int32 {
	out := make([][]int32, n)
	for i := range out {
		p := make([]int32, length)
		for j := range p {
			p[j] = int32(259 + (seed*7919+i*131+j*37+11)%(shape.Vocab-259))
		}
		out[i] = p
	}
	return out
}
