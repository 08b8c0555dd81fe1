package models

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

const labelledMLP = `
architecture: mlp
mlp:
  sizes: [4, 8, 3]
inputs:
  - {name: x, datatype: FP32, shape: [-1, 4]}
outputs:
  - {name: y, datatype: FP32, shape: [-1, 3], labels: classes.txt}
buckets:
  batch: [1, 2, 8]
`

func TestLabelsAreReadWithTheModel(t *testing.T) {
	repo := t.TempDir()
	dir := writeModel(t, repo, "m", labelledMLP, mlpTensors())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "classes.txt"), []byte("cat\r\n\nbird\n"), 0o644))
	m, err := Load(dir)
	require.NoError(t, err)
	assert.Equal(t, [][]string{{"cat", "", "bird"}}, m.Labels, "a blank line leaves its index unlabelled")

	// Without the key, no labels.
	dir = writeModel(t, repo, "n", validMLP, mlpTensors())
	m, err = Load(dir)
	require.NoError(t, err)
	assert.Nil(t, m.Labels)
}

// The shipped classifiers name their classes.
func TestShippedDigitsLabels(t *testing.T) {
	for _, name := range []string{"digits", "digits-cnn"} {
		man, err := Open("../model_repository", name)
		require.NoError(t, err, name)
		require.Len(t, man.labels, 1, name)
		assert.Equal(t, "seven", man.labels[0][7], name)
		assert.Len(t, man.labels[0], 10, name)
		man.Close()
	}
}

func TestLabelsErrors(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(outside, []byte("root:x:0:0\nb\nc\n"), 0o644))
	write := func(content string) func(string) error {
		return func(p string) error { return os.WriteFile(p, []byte(content), 0o644) }
	}
	for _, tt := range []struct {
		name, yaml string
		file       func(path string) error // classes.txt, when not nil
		want       string
	}{
		{"missing file", labelledMLP, nil, "m/model.yaml: models: invalid model.yaml: outputs[0].labels: m/classes.txt is not in the model directory"},
		{"too few lines", labelledMLP, write("a\nb\n"), "m/classes.txt: has 2 labels (lines); the output has 3 elements per row, one label each (outputs[0].labels, output \"y\")"},
		{"too many lines", labelledMLP, write("a\nb\nc\nd"), "has 4 labels (lines)"},
		{"empty file", labelledMLP, write(""), "has 0 labels"},
		{"not UTF-8", labelledMLP, write("a\n\xff\nc\n"), "m/classes.txt: not valid UTF-8 text"},
		{"long label", labelledMLP, write("a\n" + strings.Repeat("x", MaxLabelBytes+1) + "\nc\n"), "line 2: a label of 257 bytes, above the limit of 256"},
		{"control character", labelledMLP, write("a\nb\x00\nc\n"), "line 2: a label holds a control character"},
		{"over the size limit", labelledMLP, write(strings.Repeat("x", maxLabelsBytes+1)), "m/classes.txt: larger than the 1048576-byte limit"},
		{"a FIFO", labelledMLP, func(p string) error { return syscall.Mkfifo(p, 0o644) }, "m/classes.txt: not a regular file (a FIFO)"},
		{"linked out", labelledMLP, func(p string) error { return os.Symlink(outside, p) }, "m/classes.txt: a symbolic link out of the model repository"},
		{"path out of the directory", strings.Replace(labelledMLP, "classes.txt", "../classes.txt", 1), nil, `outputs[0].labels: "../classes.txt" must be a file in the model directory`},
		{"absolute path", strings.Replace(labelledMLP, "classes.txt", "/etc/passwd", 1), nil, `outputs[0].labels: "/etc/passwd" must be a file in the model directory`},
		{"on an input", strings.Replace(labelledMLP, "shape: [-1, 4]}", "shape: [-1, 4], labels: classes.txt}", 1), nil, "inputs[0].labels: labels name an output's classes; remove it from the input"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			repo := t.TempDir()
			dir := writeModel(t, repo, "m", tt.yaml, mlpTensors())
			if tt.file != nil {
				require.NoError(t, tt.file(filepath.Join(dir, "classes.txt")))
			}
			_, err := Open(repo, "m")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), "root:", "the error echoes file bytes")
			assert.NotContains(t, err.Error(), repo, "the error shows the repository's path")
		})
	}
}

func TestLabelsOnlyOnRankableOutputs(t *testing.T) {
	for _, tt := range []struct{ spec, want string }{
		{"{name: y, datatype: BYTES, shape: [-1, 3], labels: l.txt}", `output "y" is BYTES`},
		{"{name: y, datatype: BOOL, shape: [-1, 3], labels: l.txt}", `output "y" is BOOL`},
		{"{name: y, datatype: FP32, shape: [-1, -1], labels: l.txt}", `output "y" has a variable dimension`},
	} {
		err := validateSpecs("outputs", mustSpecs(t, tt.spec))
		require.Error(t, err, tt.spec)
		assert.Contains(t, err.Error(), "outputs[0].labels: "+tt.want)
	}
}

func mustSpecs(t *testing.T, flow string) []TensorSpec {
	t.Helper()
	var specs []TensorSpec
	require.NoError(t, yaml.Unmarshal([]byte("["+flow+"]"), &specs))
	return specs
}
