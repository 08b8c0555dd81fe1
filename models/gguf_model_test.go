package models

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
