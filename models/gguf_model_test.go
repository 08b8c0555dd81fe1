package models

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/models/gguf"
)

// TestStrayGGUFLeavesFoldersAlone: a .gguf beside a folder's own weights
// (as the Hub's folders often ship one) changes nothing: a model.yaml
// model and a Hugging Face folder load as before, even with two of them.
func TestStrayGGUFLeavesFoldersAlone(t *testing.T) {
	repo := t.TempDir()
	for _, name := range []string{"digits", "tiny-llama"} {
		dir := filepath.Join(repo, name)
		require.NoError(t, os.CopyFS(dir, os.DirFS(filepath.Join("..", "model_repository", name))))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.gguf"), []byte("not a gguf"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "model-q8_0.gguf"), []byte("GGUF"), 0o644))
	}
	names, err := List(repo)
	require.NoError(t, err)
	assert.Equal(t, []string{"digits", "tiny-llama"}, names)
	for _, name := range names {
		m, err := Open(repo, name)
		require.NoError(t, err, name)
		assert.Nil(t, m.gguf, name)
		_, err = m.Load(t.Context())
		require.NoError(t, err, name)
	}
}

// TestGGUFFolderErrors: in a folder of .gguf files alone, two are refused
// by name and a malformed one names its file and what is wrong, as a
// configuration error.
func TestGGUFFolderErrors(t *testing.T) {
	repo := t.TempDir()
	dir := filepath.Join(repo, "lm")
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.gguf"), []byte("not a gguf"), 0o644))
	_, err := Open(repo, "lm")
	require.ErrorIs(t, err, ErrConfig)
	assert.Contains(t, err.Error(), "lm/a.gguf")
	assert.Contains(t, err.Error(), "magic")
	assert.NotContains(t, err.Error(), "model.yaml")

	require.NoError(t, os.WriteFile(filepath.Join(dir, "b.gguf"), []byte("GGUF"), 0o644))
	_, err = Open(repo, "lm")
	require.ErrorIs(t, err, ErrConfig)
	assert.Contains(t, err.Error(), "2 .gguf files")
}

// TestRopeFactors: rope_freqs.weight (llama3's rope scaling as llama.cpp's
// converter writes it) divides RoPE's frequencies; a factor a frequency,
// each positive and finite, or the file is refused naming the tensor.
func TestRopeFactors(t *testing.T) {
	read := func(shape []int, data []float32) ([]float64, error) {
		t.Helper()
		var w gguf.Writer
		w.String("general.architecture", "llama")
		require.NoError(t, w.Tensor("rope_freqs.weight", shape, gguf.F32, data))
		var b bytes.Buffer
		_, err := w.WriteTo(&b)
		require.NoError(t, err)
		f, err := gguf.Parse(bytes.NewReader(b.Bytes()), int64(b.Len()))
		require.NoError(t, err)
		return ropeFactors(f, 8)
	}
	got, err := read([]int{4}, []float32{1, 1, 2, 8})
	require.NoError(t, err)
	assert.Equal(t, []float64{1, 1, 2, 8}, got)
	c := DecoderConfig{HeadDim: 8, RopeTheta: 10000}
	plain := c.InvFreq()
	c.RopeFactors = got
	scaled := c.InvFreq()
	for i := range plain {
		assert.InDelta(t, plain[i]/got[i], scaled[i], 1e-15)
	}
	_, err = read([]int{3}, []float32{1, 1, 2})
	assert.ErrorContains(t, err, "rope_freqs.weight has shape [3]; want [4]")
	for _, bad := range []float32{0, -1, float32(math.Inf(1)), float32(math.NaN())} {
		_, err = read([]int{4}, []float32{1, bad, 1, 1})
		assert.ErrorContains(t, err, "rope_freqs.weight[1]", "%g", bad)
	}
}
