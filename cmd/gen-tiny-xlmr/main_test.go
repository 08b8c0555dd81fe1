package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestShippedDemosAreReproducible regenerates the two demos and holds the
// shipped files to the same bytes.
func TestShippedDemosAreReproducible(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, write(dir, filepath.Join("../..", tokenizerFile)))
	for _, m := range []string{"tiny-xlmr", "tiny-reranker"} {
		shipped := filepath.Join("../../model_repository", m)
		n := 0
		require.NoError(t, filepath.WalkDir(filepath.Join(dir, m), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(filepath.Join(dir, m), p)
			want, err := os.ReadFile(p)
			require.NoError(t, err)
			have, err := os.ReadFile(filepath.Join(shipped, rel))
			require.NoError(t, err, "make tiny-xlmr writes %s/%s", m, rel)
			assert.Equal(t, want, have, "%s/%s differs from what make tiny-xlmr writes", m, rel)
			n++
			return nil
		}))
		assert.GreaterOrEqual(t, n, 4)
	}
}
