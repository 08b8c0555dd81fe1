package models

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOpenRefusesHostileFiles: a model directory's files are regular files
// inside the repository, of bounded size; anything else is refused at once
// (no open blocks), naming the file by its path in the repository and
// quoting none of its bytes.
func TestOpenRefusesHostileFiles(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(outside, []byte("root:x:0:0:root:/root:/bin/bash\n"), 0o644))
	replace := func(file string, with func(path string) error) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			path := filepath.Join(dir, file)
			require.NoError(t, os.RemoveAll(path))
			require.NoError(t, with(path))
		}
	}
	fifo := func(path string) error { return syscall.Mkfifo(path, 0o644) }
	link := func(path string) error { return os.Symlink(outside, path) }
	content := func(b string) func(string) error {
		return func(path string) error { return os.WriteFile(path, []byte(b), 0o644) }
	}
	tests := []struct {
		name string
		make func(t *testing.T, dir string)
		want string
	}{
		{"FIFO model.yaml", replace(ConfigFile, fifo), "m/model.yaml: not a regular file (a FIFO)"},
		{"FIFO weights", replace(WeightsFile, fifo), "m/weights.safetensors: not a regular file (a FIFO)"},
		{"directory as model.yaml", replace(ConfigFile, func(p string) error { return os.Mkdir(p, 0o755) }), "m/model.yaml: not a regular file (a directory)"},
		{"model.yaml linked out", replace(ConfigFile, link), "m/model.yaml: a symbolic link out of the model repository"},
		{"weights linked out", replace(WeightsFile, link), "m/weights.safetensors: a symbolic link out of the model repository"},
		{"model.yaml over 1 MiB", replace(ConfigFile, content(validMLP+"#"+strings.Repeat("x", 1<<20))), "m/model.yaml: larger than the 1048576-byte limit"},
		{"passwd as model.yaml", replace(ConfigFile, content("root:x:0:0:root:/root:/bin/bash\n")), "m/model.yaml: models: invalid model.yaml: line 1: want a mapping of model.yaml's keys, found a string"},
		{"passwd line as a key", replace(ConfigFile, content(validMLP+"root:x:0:0:root:/root:/bin/bash: 1\n")), `unknown key "root:x:0:0:root:/root:/bin/bash"`},
		{"passwd as weights", replace(WeightsFile, content("root:x:0:0:root:/root:/bin/bash\n")), "m/weights.safetensors: models: malformed safetensors: header length"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			repo := t.TempDir()
			dir := writeModel(t, repo, "m", validMLP, mlpTensors())
			tc.make(t, dir)
			_, err := Open(repo, "m")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), repo, "the error shows the repository's path")
			if tc.name != "passwd line as a key" { // a key is quoted, clipped: it is what the file says the key is
				assert.NotContains(t, err.Error(), "root:", "the error echoes file bytes")
			}
		})
	}

	// The model directory itself linked out of the repository.
	repo := t.TempDir()
	elsewhere := writeModel(t, t.TempDir(), "m", validMLP, mlpTensors())
	require.NoError(t, os.Symlink(elsewhere, filepath.Join(repo, "m")))
	_, err := Open(repo, "m")
	assert.ErrorContains(t, err, "m: a symbolic link out of the model repository")

	// Links inside the repository are followed: two models may share
	// weights.
	repo = t.TempDir()
	writeModel(t, repo, "a", validMLP, mlpTensors())
	dir := writeModel(t, repo, "b", validMLP, mlpTensors())
	require.NoError(t, os.Remove(filepath.Join(dir, WeightsFile)))
	require.NoError(t, os.Symlink("../a/"+WeightsFile, filepath.Join(dir, WeightsFile)))
	m, err := Open(repo, "b")
	require.NoError(t, err)
	_, err = m.Load(context.Background())
	require.NoError(t, err)
}

func TestVocabIsCheckedLikeTheOtherFiles(t *testing.T) {
	repo := t.TempDir()
	dir := writeModel(t, repo, "e", validEncoder, encoderTensors(1))
	vocab := filepath.Join(dir, VocabFile)
	require.NoError(t, os.Symlink("/etc/passwd", vocab))
	_, err := Open(repo, "e")
	assert.ErrorContains(t, err, "e/vocab.txt: a symbolic link out of the model repository")

	require.NoError(t, os.Remove(vocab))
	require.NoError(t, syscall.Mkfifo(vocab, 0o644))
	_, err = Open(repo, "e")
	assert.ErrorContains(t, err, "e/vocab.txt: not a regular file (a FIFO)")

	require.NoError(t, os.Remove(vocab))
	require.NoError(t, os.WriteFile(vocab, []byte("[PAD]\n[UNK]\n"), 0o644))
	m, err := Open(repo, "e")
	require.NoError(t, err)
	_, err = m.Load(context.Background())
	assert.ErrorContains(t, err, "e/vocab.txt: the special token [CLS] is missing")
	assert.NotContains(t, err.Error(), repo)
}

// encoderTensors are validEncoder's tensors with layers layers.
func encoderTensors(layers int) []*Tensor {
	const H, I = 8, 16
	var out []*Tensor
	add := func(name string, shape ...int) {
		out = append(out, &Tensor{Name: name, Shape: shape, Data: make([]float32, numel(shape))})
	}
	add("embeddings.word_embeddings.weight", 10, H)
	add("embeddings.position_embeddings.weight", 64, H)
	add("embeddings.token_type_embeddings.weight", 2, H)
	add("embeddings.LayerNorm.weight", H)
	add("embeddings.LayerNorm.bias", H)
	for i := range layers {
		p := "encoder.layer." + string(rune('0'+i)) + "."
		for _, l := range []struct {
			name    string
			out, in int
		}{{"attention.self.query", H, H}, {"attention.self.key", H, H}, {"attention.self.value", H, H},
			{"attention.output.dense", H, H}, {"intermediate.dense", I, H}, {"output.dense", H, I}} {
			add(p+l.name+".weight", l.out, l.in)
			add(p+l.name+".bias", l.out)
		}
		for _, n := range []string{"attention.output.LayerNorm", "output.LayerNorm"} {
			add(p+n+".weight", H)
			add(p+n+".bias", H)
		}
	}
	return out
}

// TestManifestChecksShapesBeforeReadingValues: Open checks every tensor's
// shape from the header and knows the resident size; the values are read
// only by Load, which honours its context.
func TestManifestChecksShapesBeforeReadingValues(t *testing.T) {
	repo := t.TempDir()
	writeModel(t, repo, "e", strings.Replace(validEncoder, "{name: text, datatype: BYTES, shape: [-1]}",
		"{name: input_ids, datatype: INT64, shape: [-1, -1]}\n  - {name: attention_mask, datatype: INT64, shape: [-1, -1]}", 1), encoderTensors(2))
	m, err := Open(repo, "e")
	require.NoError(t, err)
	// The file holds 2 layers, model.yaml asks for 1: the second's tensors
	// are neither counted nor read.
	var want int64
	for _, tensor := range encoderTensors(1) {
		want += int64(len(tensor.Data)) * 4
	}
	assert.Equal(t, want, m.Weights.ResidentBytes())
	for _, tensor := range m.Weights.Tensors {
		assert.Nil(t, tensor.Data, "no value is read by Open")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = m.Load(ctx)
	assert.ErrorIs(t, err, context.Canceled)

	m, err = Open(repo, "e")
	require.NoError(t, err)
	loaded, err := m.Load(context.Background())
	require.NoError(t, err)
	assert.Len(t, loaded.Encoder.Layers, 1, "model.yaml says 1 layer; the file's second is not used")
	assert.Len(t, loaded.Encoder.Layers[0].Inter.Weight, 16*8)

	// More layers than the file holds: the first missing tensor stops the
	// check.
	writeModel(t, repo, "deep", strings.Replace(validEncoder, "layers: 1", "layers: 1000", 1), encoderTensors(2))
	_, err = Open(repo, "deep")
	assert.ErrorContains(t, err, `deep/weights.safetensors: tensor "encoder.layer.2.attention.self.query.weight" is missing (want shape [8 8]) (encoder.layers is 1000)`)
}

func TestConfigSizesAreBounded(t *testing.T) {
	for _, tc := range []struct{ old, new, want string }{
		{"layers: 1", "layers: 2000000000", "encoder.layers: 2000000000 is above the limit of 1024"},
		{"hidden: 8", "hidden: 1048576", "encoder.hidden: 1048576 is above the limit of 262144"},
		{"vocab_size: 10", "vocab_size: 100000000", "encoder.vocab_size: 100000000 is above the limit of 4194304"},
		{"max_position: 64", "max_position: 1000000", "encoder.max_position: 1000000 is above the limit of 131072"},
		{"batch: [1, 4]", "batch: [" + strings.Trim(strings.Repeat("1,", 600), ",") + "]", "buckets: 600 batch sizes and 2 sequence lengths make 1200 buckets, above the limit of 1024"},
	} {
		doc := strings.Replace(validEncoder, tc.old, tc.new, 1)
		require.NotEqual(t, validEncoder, doc)
		_, err := ParseConfig(strings.NewReader(doc))
		assert.ErrorContains(t, err, tc.want)
	}
	_, err := ParseConfig(strings.NewReader(strings.Replace(validMLP, "[4, 8, 3]", "[4, "+strings.Repeat("8, ", 1100)+"3]", 1)))
	assert.ErrorContains(t, err, "mlp.sizes: 1102 widths are 1101 layers, above the limit of 1024")
}

func TestYAMLErrorsQuoteNoValues(t *testing.T) {
	for doc, want := range map[string]string{
		"root:x:0:0:root:/root:/bin/bash\n":                 "line 1: want a mapping of model.yaml's keys, found a string",
		validMLP + "warmup: [1]\n":                          "want a string, found a list",
		validMLP + "batching: {max_queue_size: x}":          `want an integer, found a string ("x")`,
		validMLP + "batching: {max_queue_size: root:x:0:0}": "want an integer, found a string",
		validMLP + strings.Repeat("k", 500) + ": 1\n":       `unknown key "` + strings.Repeat("k", 64) + `..."`,
		"a: &x 1\nb: *y\n":                                  "unknown anchor",
	} {
		_, err := ParseConfig(strings.NewReader(doc))
		require.Error(t, err)
		assert.Contains(t, err.Error(), want)
		assert.NotContains(t, err.Error(), "root:")
		assert.Less(t, len(err.Error()), 300)
	}
}
