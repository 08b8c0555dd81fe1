package enginetest

// What the engines' decoder tests share: the random decoders they are
// held to the torch reference on, writing one as a Hugging Face folder,
// the reference itself (engine/cpufallback/testdata/llama_ref.py, a Llama
// written by hand in torch that recomputes every prefix), and running
// prompts through a generation loop over an engine's decoder.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/internal/randweights"
	"github.com/stepserve/stepserve/models"
)

// DecoderShapes are the random decoders the engines are held to the torch
// reference on: the shipped demo's shape, and a Qwen2-style one with
// q/k/v biases, llama3 RoPE scaling and four query heads per KV head.
var DecoderShapes = map[string]randweights.Decoder{
	"llama": {Arch: "LlamaForCausalLM", Vocab: 512, Hidden: 128, Layers: 2, Heads: 4, KVHeads: 2, Inter: 344,
		MaxPosition: 2048, RopeTheta: 10000, BOS: 0, EOS: 2},
	"qwen2": {Arch: "Qwen2ForCausalLM", Vocab: 512, Hidden: 96, Layers: 3, Heads: 8, KVHeads: 2, Inter: 200,
		MaxPosition: 4096, RopeTheta: 500000, QKVBias: true, Llama3Scaling: true, BOS: 0, EOS: 2},
}

// repoFile is a file of the repository, by its path from the root.
func repoFile(rel string) string {
	_, here, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(here), "..", "..", filepath.FromSlash(rel))
}

// WriteDecoder writes a random decoder of shape into a temporary
// repository with model.yaml yaml (seeded by seed) and returns its folder.
func WriteDecoder(t testing.TB, shape randweights.Decoder, seed uint64, yaml string) string {
	t.Helper()
	tok, err := os.ReadFile(repoFile("models/testdata/tokenizers/bpe.json"))
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "lm")
	require.NoError(t, randweights.WriteDecoderFolder(dir, randweights.DecoderFolder{Shape: shape, Seed: seed, Tokenizer: tok,
		ModelYAML: yaml, Generator: t.Name()}))
	return dir
}

// TorchGreedy is each prompt's greedy continuation of n tokens by the
// torch reference, computing in dtype (float32 or bfloat16). It skips
// the test without Debian's torch.
func TorchGreedy(t testing.TB, dir string, prompts [][]int32, n int, dtype string) [][]int32 {
	t.Helper()
	const python = "/usr/bin/python3"
	if _, err := exec.LookPath(python); err != nil {
		t.Skip("no /usr/bin/python3 (python3-torch) to compute the reference")
	}
	in, err := json.Marshal(prompts)
	require.NoError(t, err)
	cmd := exec.Command(python, repoFile("engine/cpufallback/testdata/llama_ref.py"), dir, fmt.Sprint(n), dtype)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "the torch reference: %s", stderr.String())
	var ids [][]int32
	require.NoError(t, json.Unmarshal(out, &ids))
	return ids
}

// Prompts are prompts of the given lengths, of ids below 500.
func Prompts(lengths ...int) [][]int32 {
	var ps [][]int32
	for i, n := range lengths {
		p := make([]int32, n)
		for j := range p {
			p[j] = int32((i*131 + j*37 + 11) % 500)
		}
		ps = append(ps, p)
	}
	return ps
}

// StartLoop runs a generation loop over dec with m's generation keys
// until the test ends.
func StartLoop(t testing.TB, dec generation.Model, m *models.Model) *generation.Loop {
	t.Helper()
	g := m.Config.Generation
	loop, err := generation.NewLoop(g.Loop(), dec)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { loop.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return loop
}

// Generate runs every prompt through loop at once, max tokens each and no
// end-of-sequence token, sampled as sampling says (nil: greedy, without
// log-probabilities), and returns what each produced.
func Generate(t testing.TB, loop *generation.Loop, prompts [][]int32, max int, sampling []generation.Sampling) [][]int32 {
	t.Helper()
	return GenerateUnder(t, loop, prompts, max, sampling, nil)
}

// GenerateUnder is Generate with prompt i's output constrained by
// constraint(i) where that is not nil (constraint nil: none is).
func GenerateUnder(t testing.TB, loop *generation.Loop, prompts [][]int32, max int, sampling []generation.Sampling,
	constraint func(i int) generation.Constraint) [][]int32 {
	t.Helper()
	out := make([][]int32, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		s := generation.Sampling{Logprobs: -1}
		if sampling != nil {
			s = sampling[i]
		}
		r := generation.Request{Prompt: p, MaxTokens: max, Sampling: s}
		if constraint != nil {
			r.Constraint = constraint(i)
		}
		st, err := loop.Generate(context.Background(), r)
		require.NoError(t, err)
		wg.Go(func() {
			for {
				ev, ok := st.Next(context.Background())
				if !ok {
					return
				}
				if ev.Err != nil {
					t.Errorf("prompt %d: %v", i, ev.Err)
					return
				}
				if !ev.Last() {
					out[i] = append(out[i], ev.Token)
				}
			}
		})
	}
	wg.Wait()
	return out
}

// Stride is a constraint for the engines' masked-sampling tests: the
// k-th token of the output is one of the vocabulary's ids that are
// Offset+k modulo Every, so that a step's mask leaves a sparse set
// across every word of it (bit 31 of a word included), and the
// unmasked favourite is mostly out. It never completes: max_tokens ends
// the output.
type Stride struct {
	Vocab, Every, Offset int
	n                    int
	mask                 []uint32
}

// Allows reports whether tok may be the k-th token.
func (c *Stride) Allows(k int, tok int32) bool {
	return int(tok) >= 0 && int(tok) < c.Vocab && (int(tok)-c.Offset-k)%c.Every == 0
}

// Mask implements [generation.Constraint].
func (c *Stride) Mask() []uint32 {
	if c.mask == nil {
		c.mask = make([]uint32, (c.Vocab+31)/32)
	}
	clear(c.mask)
	for t := range c.Vocab {
		if c.Allows(c.n, int32(t)) {
			c.mask[t/32] |= 1 << (t % 32)
		}
	}
	return c.mask
}

// Accept implements [generation.Constraint].
func (c *Stride) Accept(tok int32) error {
	if !c.Allows(c.n, tok) {
		return fmt.Errorf("token %d is not %d modulo %d", tok, c.Offset+c.n, c.Every)
	}
	c.n++
	return nil
}

// Done implements [generation.Constraint].
func (c *Stride) Done() bool { return false }

// CopyModel copies the model folder src (flat, as the shipped ones are)
// to dst, writing modelYAML as its model.yaml when it is not empty.
func CopyModel(t testing.TB, src, dst, modelYAML string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dst, 0o755))
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		if e.Name() == models.ConfigFile && modelYAML != "" {
			b = []byte(modelYAML)
		}
		require.NoError(t, os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644))
	}
}

// CompiledWhole asserts that every report is a program inductor built as
// one graph, with no break, no recompile and nothing found by the step
// audit, logs each one's build time, and returns their sum.
func CompiledWhole(t testing.TB, reports []engine.ProgramReport) (seconds float64) {
	t.Helper()
	for _, r := range reports {
		what := r.Kind + " " + r.Bucket
		assert.Equal(t, "inductor", r.Compiler, "%s: %s", what, r.Error)
		assert.Equal(t, [3]engine.Count{1, 0, 0}, [3]engine.Count{r.Graphs, r.GraphBreaks, r.Recompiles}, "%s: graphs, breaks, recompiles", what)
		if assert.NotNil(t, r.Audit, what) {
			assert.Zero(t, r.Audit.Total, "%s: %+v", what, r.Audit.Findings)
		}
		if r.CompileSeconds != nil {
			seconds += *r.CompileSeconds
			t.Logf("%s: compiled in %.1f s", what, *r.CompileSeconds)
		}
	}
	return seconds
}
