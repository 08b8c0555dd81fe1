package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFreshCloneBuildsAndRetrains: a clone of the repository on its own
// (nothing outside the repository) builds the server and retrains the
// shipped models to the same bytes as shipped: make build, make digits,
// make digits-cnn.
func TestFreshCloneBuildsAndRetrains(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(root, ".git")); err != nil {
		t.Skip("not a git checkout")
	}
	clone := filepath.Join(t.TempDir(), "stepserve")
	out, err := exec.Command("git", "clone", "--quiet", "--no-hardlinks", root, clone).CombinedOutput()
	require.NoError(t, err, "%s", out)
	// The clone has the last commit: its retrained files are held to
	// that commit's shipped ones.
	for _, target := range []string{"build", "digits", "digits-cnn"} {
		cmd := exec.Command("make", "-C", clone, target, "GOTAGS=")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "make %s in a fresh clone:\n%s", target, out)
	}
	require.FileExists(t, filepath.Join(clone, "bin", "stepserve"))
	for _, f := range []string{"model_repository/digits/weights.safetensors", "cmd/serve/testdata/digits-heldout.csv",
		"model_repository/digits-cnn/weights.safetensors"} {
		shipped, err := exec.Command("git", "-C", root, "show", "HEAD:"+f).Output()
		require.NoError(t, err)
		retrained, err := os.ReadFile(filepath.Join(clone, f))
		require.NoError(t, err)
		require.True(t, bytes.Equal(shipped, retrained), "%s: retrained in a fresh clone, it differs from the shipped file", f)
	}
}
