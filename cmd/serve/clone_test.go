package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFreshCloneBuildsAndRetrains: a clone of the repository on its own
// (nothing outside the repository) builds the server and retrains the
// shipped models reproducibly: make build, then make digits and make
// digits-cnn twice.
//
// What is held, and why not the shipped bytes: training is float
// arithmetic, and its last bits depend on the machine. torch picks its
// convolution and matrix kernels by cpuid (Debian's OpenBLAS takes some
// Xeons for "Prescott"), and forty epochs of Adam carry a last-bit
// difference into every weight, so a retrain on another CPU writes other
// bytes of the same quality (0.9911 on a Xeon where the shipped file, made
// on an EPYC, scores 0.9867). So:
//   - two retrains on this machine write the same bytes (the trainers are
//     deterministic: fixed seeds, one thread, deterministic kernels);
//   - each reaches a floor of held-out accuracy;
//   - the held-out rows equal the shipped file's byte for byte: they are
//     integers chosen by a seeded integer generator, no float involved.
func TestFreshCloneBuildsAndRetrains(t *testing.T) {
	if testing.Short() {
		t.Skip("retrains two models twice (minutes): make test-long runs it")
	}
	root, clone := freshClone(t)

	makeTarget := func(target string) string {
		t.Helper()
		out, err := exec.Command("make", "-C", clone, target, "GOTAGS=").CombinedOutput()
		require.NoError(t, err, "make %s in a fresh clone:\n%s", target, out)
		return string(out)
	}
	makeTarget("build")
	require.FileExists(t, filepath.Join(clone, "bin", "stepserve"))

	files := map[string]string{
		"digits":     "model_repository/digits/weights.safetensors",
		"digits-cnn": "model_repository/digits-cnn/weights.safetensors",
	}
	accuracy := regexp.MustCompile(`held-out accuracy ([0-9.]+)`)
	first := map[string][]byte{}
	for round := range 2 {
		for _, target := range []string{"digits", "digits-cnn"} {
			// The checkout's file is removed first: a trainer that wrote
			// nothing would otherwise match itself.
			require.NoError(t, os.Remove(filepath.Join(clone, files[target])))
			out := makeTarget(target)
			m := accuracy.FindStringSubmatch(out)
			require.NotNil(t, m, "make %s prints its held-out accuracy:\n%s", target, out)
			acc, err := strconv.ParseFloat(m[1], 64)
			require.NoError(t, err)
			t.Logf("make %s, round %d: held-out accuracy %.4f", target, round+1, acc)
			// Both shipped models score 0.9867 (445 of 451) where they were
			// trained; 0.97 leaves room for another CPU's rounding and
			// still fails a trainer that broke.
			assert.GreaterOrEqual(t, acc, 0.97, "make %s: held-out accuracy", target)

			b, err := os.ReadFile(filepath.Join(clone, files[target]))
			require.NoError(t, err)
			if round == 0 {
				first[target] = b
			} else {
				assert.True(t, bytes.Equal(first[target], b), "make %s twice on one machine wrote different %s", target, files[target])
			}
		}
	}

	const heldout = "cmd/serve/testdata/digits-heldout.csv"
	shipped, err := exec.Command("git", "-C", root, "show", "HEAD:"+heldout).Output()
	require.NoError(t, err)
	written, err := os.ReadFile(filepath.Join(clone, heldout))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(shipped, written), "%s: make digits in a fresh clone chose other rows than the shipped file", heldout)
}

// TestNewcomerPath follows the README in a fresh clone (nothing outside
// it): make build, the server on the shipped repository, the README's
// first inference example, then a Hugging Face folder dropped in as the
// Hub ships it (no model.yaml; here the shipped tiny-xlmr's files without
// its model.yaml) and served: its embeddings over OpenAI's API (issue 34).
func TestNewcomerPath(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a fresh clone: make test-long runs it")
	}
	_, clone := freshClone(t)
	out, err := exec.Command("make", "-C", clone, "build", "GOTAGS=").CombinedOutput()
	require.NoError(t, err, "make build in a fresh clone:\n%s", out)

	// The Hub folder: config.json, model.safetensors, tokenizer.json and
	// the sentence-transformers files, no model.yaml.
	hub := filepath.Join(clone, "model_repository", "my-embedder")
	require.NoError(t, os.MkdirAll(filepath.Join(hub, "1_Pooling"), 0o755))
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json", "modules.json", "1_Pooling/config.json"} {
		b, err := os.ReadFile(filepath.Join(clone, "model_repository", "tiny-xlmr", f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(hub, f), b, 0o644))
	}
	cmd := exec.Command(filepath.Join(clone, "bin", "stepserve"), "--server.addr", "127.0.0.1:0", "--server.grpc_addr=",
		"--model_repository", filepath.Join(clone, "model_repository"))
	cmd.Dir = clone
	p := startCmd(t, cmd)

	readme, err := os.ReadFile(filepath.Join(clone, "README.md"))
	require.NoError(t, err)
	var first string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(readme), -1) {
		if bytes.Contains([]byte(m[1]), []byte("digits/infer")) {
			first = m[1]
			break
		}
	}
	require.NotEmpty(t, first, "the README's first inference example")
	script := "set -e -o pipefail\ncurl() { command curl --fail-with-body \"$@\"; }\n" +
		regexp.MustCompile(`localhost:8000`).ReplaceAllString(first, p.base[len("http://"):])
	out, err = exec.Command("bash", "-c", script).CombinedOutput()
	require.NoError(t, err, "%s\n%s", first, out)
	assert.Contains(t, string(out), `"model_name":"digits"`)

	resp, body := post(t, p.base+"/v1/embeddings", []byte(`{"model": "my-embedder", "input": ["The water is warm."]}`))
	require.Equal(t, 200, resp.StatusCode, string(body))
	assert.Contains(t, string(body), `"object":"list"`)
	assert.Contains(t, string(body), `"model":"my-embedder"`)
}

// freshClone clones the repository this test runs in (root) into a
// temporary directory (clone), as a user's git clone would: only what is
// committed. It skips the test without git or outside a checkout.
func freshClone(t *testing.T) (root, clone string) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(root, ".git")); err != nil {
		t.Skip("not a git checkout")
	}
	clone = filepath.Join(t.TempDir(), "stepserve")
	out, err := exec.Command("git", "clone", "--quiet", "--no-hardlinks", root, clone).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return root, clone
}
