package cpufallback

import (
	"cmp"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	benchgguf "github.com/stepserve/stepserve/bench/gguf"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/internal/randweights"
	"github.com/stepserve/stepserve/models"
)

// TestGGUFServesAsTheFolder: a folder holding only a .gguf (written from a
// Hugging Face folder as llama.cpp's converter lays it out: Q/K rows
// permuted, names and metadata llama.cpp's) is a model; in float32 it
// generates the folder's greedy tokens exactly, and a Q8_0 or Q4_0 file is
// served in its format with the tokens of the folder quantized at load
// (its blocks quantize back to themselves; under Q4_0 the head is Q8_0 on
// both sides).
func TestGGUFServesAsTheFolder(t *testing.T) {
	llama := enginetest.DecoderShapes["llama"]
	llama.Inter = 352 // Q8_0 packs rows of whole blocks of 32
	qwen2 := enginetest.DecoderShapes["qwen2"]
	qwen2.Inter, qwen2.Llama3Scaling = 224, false // llama.cpp reads rope_freqs.weight on the llama architecture only
	llama3 := llama
	llama3.Llama3Scaling = true // written as rope_freqs.weight
	keys := "generation:\n  max_model_len: 256\n  max_num_seqs: 8\n  max_batch_tokens: 64\n"
	prompts := testPrompts()
	for _, tc := range []struct {
		name  string
		shape randweights.Decoder
		typ   benchgguf.Type
		quant string
	}{
		{"llama f32", llama, benchgguf.F32, ""}, {"llama q8_0", llama, benchgguf.Q8_0, "quantization: q8_0\n"},
		{"qwen2 f32", qwen2, benchgguf.F32, ""}, {"qwen2 q8_0", qwen2, benchgguf.Q8_0, "quantization: q8_0\n"},
		{"llama3 rope f32", llama3, benchgguf.F32, ""}, {"llama3 rope q8_0", llama3, benchgguf.Q8_0, "quantization: q8_0\n"},
		{"llama q4_0", llama, benchgguf.Q4_0, "quantization: q4_0\n"}, {"qwen2 q4_0", qwen2, benchgguf.Q4_0, "quantization: q4_0\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			folder := writeDecoder(t, tc.shape, tc.quant+keys)
			hf, err := models.Load(folder)
			require.NoError(t, err)
			dir := filepath.Join(t.TempDir(), "lm-gguf")
			require.NoError(t, os.Mkdir(dir, 0o755))
			require.NoError(t, benchgguf.Write(filepath.Join(dir, "model.gguf"), hf.Decoder.Config, hf.Weights,
				benchgguf.Options{Name: "lm", Type: tc.typ, BOS: 0, EOS: 2}))
			// The generation keys the folder's model.yaml had, beside the file.
			require.NoError(t, os.WriteFile(filepath.Join(dir, models.ConfigFile), []byte(keys), 0o644))

			names, err := models.List(filepath.Dir(dir))
			require.NoError(t, err)
			assert.Equal(t, []string{"lm-gguf"}, names)
			want := enginetest.Generate(t, mustLoop(t, folder), prompts, 24, nil)
			loop, m := startDecoder(t, dir)
			assert.Equal(t, cmp.Or(strings.TrimSpace(strings.TrimPrefix(tc.quant, "quantization:")), "none"), m.Config.Quantization, "the file's type decides")
			assert.Equal(t, hf.Decoder.Config.Family, m.Decoder.Config.Family)
			assert.Equal(t, hf.Decoder.Config.QKVBias, m.Decoder.Config.QKVBias)
			assert.Equal(t, want, enginetest.Generate(t, loop, prompts, 24, nil))
		})
	}
}

func mustLoop(t *testing.T, dir string) *generation.Loop {
	loop, _ := startDecoder(t, dir)
	return loop
}
