package models

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// familiesDir holds golden_families.py's HF folders.
const familiesDir = "../engine/cpufallback/testdata/families"

// hfFolder copies the reference folder name into repo as dir, without its
// model.yaml (the folder as the Hub has it), with a small WordPiece
// vocab.txt for its text input, and returns its path.
func copyHFFolder(t *testing.T, repo, name, dir string) string {
	t.Helper()
	src, dst := filepath.Join(familiesDir, name), filepath.Join(repo, dir)
	require.NoError(t, filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		require.NoError(t, err)
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if rel == ConfigFile || rel == "reference.json" {
			return nil
		}
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	}))
	vocab := "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n"
	require.NoError(t, os.WriteFile(filepath.Join(dst, VocabFile), []byte(vocab), 0o644))
	return dst
}

// TestHFFolderWithoutModelYAML: config.json decides the family, the sizes,
// the head and its labels; stepserve's defaults the signature and buckets.
func TestHFFolderWithoutModelYAML(t *testing.T) {
	repo := t.TempDir()
	copyHFFolder(t, repo, "bert-classifier", "nli")
	copyHFFolder(t, repo, "distilbert", "distil")
	copyHFFolder(t, repo, "camembert", "camem")
	require.NoError(t, os.MkdirAll(filepath.Join(repo, "not-a-model"), 0o755))
	names, err := List(repo)
	require.NoError(t, err)
	assert.Equal(t, []string{"camem", "distil", "nli"}, names, "HF folders are listed; a directory without either config is not")

	m, err := Load(filepath.Join(repo, "nli"))
	require.NoError(t, err)
	c, e := m.Config, m.Config.Encoder
	assert.Equal(t, "encoder", c.Architecture)
	assert.Equal(t, []TensorSpec{{Name: "text", Datatype: BYTES, Shape: []int{-1}}, {Name: "text_pair", Datatype: BYTES, Shape: []int{-1}}}, c.Inputs)
	assert.Equal(t, []TensorSpec{{Name: "logits", Datatype: FP32, Shape: []int{-1, 3}}}, c.Outputs)
	assert.Equal(t, [][]string{{"contradiction", "entailment", "neutral"}}, m.Labels)
	assert.Equal(t, Buckets{Batch: []int{1, 4, 16, 64}, Seq: []int{32, 64}}, c.Buckets, "seq up to max_position_embeddings 64")
	assert.Equal(t, []any{FamilyBERT, HeadClassification, 3, "gelu", 1e-12, 2, 0, "cls", true},
		[]any{e.Family, e.Head, e.NumLabels, e.HiddenAct, e.LayerNormEps, e.TypeVocabSize, e.PadID(), e.Pooling, e.Truncate})
	assert.Equal(t, "", c.Engine, "the server's default engine")
	assert.Equal(t, []string{"bert.embeddings.position_ids"}, m.Skipped)
	require.NotNil(t, m.Encoder.Head)
	assert.Equal(t, "tanh", m.Encoder.Head.Act)

	m, err = Load(filepath.Join(repo, "distil"))
	require.NoError(t, err)
	e = m.Config.Encoder
	assert.Equal(t, []any{FamilyDistilBERT, 32, 2, 4, 64, "mean", false, 1},
		[]any{e.Family, e.Hidden, e.Layers, e.Heads, e.Intermediate, e.Pooling, e.Normalize, e.TypeVocabSize},
		"DistilBERT's names (dim, n_layers, ...), pooling from 1_Pooling/config.json")
	assert.Equal(t, []TensorSpec{{Name: "embedding", Datatype: FP32, Shape: []int{-1, 32}}}, m.Config.Outputs)

	m, err = Load(filepath.Join(repo, "camem"))
	require.NoError(t, err)
	e = m.Config.Encoder
	assert.Equal(t, []any{FamilyCamemBERT, "last", true, 1e-5, 1, 66, "relu"},
		[]any{e.Family, e.Pooling, e.Normalize, e.LayerNormEps, e.PadID(), e.MaxPosition, e.HiddenAct},
		"lasttoken pooling, Normalize from modules.json")
	assert.Equal(t, []int{32, 64}, m.Config.Buckets.Seq, "66 positions less the offset of 2")
	assert.Len(t, m.Weights.Paths, 2, "two shards")
	assert.NotEmpty(t, m.Encoder.Layers[1].OutNorm.Weight, "the shards' values are read")
}

// TestHFFolderModelYAMLOverrides: the keys model.yaml sets win, the others
// stay config.json's.
func TestHFFolderModelYAMLOverrides(t *testing.T) {
	repo := t.TempDir()
	dir := copyHFFolder(t, repo, "distilbert", "d")
	require.NoError(t, os.WriteFile(filepath.Join(dir, ConfigFile), []byte(`
description: a demo
encoder: {pooling: cls, normalize: true, truncate: false}
buckets: {batch: [1, 8], seq: [32]}
engine: cpu
`), 0o644))
	m, err := Load(dir)
	require.NoError(t, err)
	e := m.Config.Encoder
	assert.Equal(t, []any{"a demo", "cls", true, false, "cpu", []int{1, 8}, []int{32}, 32, FamilyDistilBERT},
		[]any{m.Config.Description, e.Pooling, e.Normalize, e.Truncate, m.Config.Engine, m.Config.Buckets.Batch, m.Config.Buckets.Seq, e.Hidden, e.Family})

	require.NoError(t, os.WriteFile(filepath.Join(dir, ConfigFile), []byte("encoder: {polling: cls}\n"), 0o644))
	_, err = Load(dir)
	assert.ErrorContains(t, err, `d/model.yaml (over d/config.json): models: invalid model.yaml: line 1: unknown key "polling"`)
}

func TestHFFolderErrors(t *testing.T) {
	for _, tc := range []struct {
		name, file, from, to, want string
	}{
		{"model type", HFConfigFile, `"model_type": "bert"`, `"model_type": "gpt2"`, `model_type: "gpt2" is not supported`},
		{"architecture", HFConfigFile, `"BertForSequenceClassification"`, `"BertForTokenClassification"`, `architectures: "BertForTokenClassification" is not supported`},
		{"activation", HFConfigFile, `"hidden_act": "gelu"`, `"hidden_act": "swish"`, `hidden_act: swish is not supported; want gelu, gelu_new, gelu_pytorch_tanh, relu`},
		{"labels", HFConfigFile, `"2": "neutral"`, `"7": "neutral"`, `id2label: key "7" is not one of the ids 0..2`},
		{"head shape", HFConfigFile, `"2": "neutral"`, `"2": "neutral", "3": "other"`, `tensor "classifier.weight" has shape [3 32], want [4 32] (the bert classification head, encoder.num_labels 4)`},
		{"family", HFConfigFile, `"model_type": "bert"`, `"model_type": "distilbert"`, `the file's names are those of a bert checkpoint: set encoder.family`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := t.TempDir()
			dir := copyHFFolder(t, repo, "bert-classifier", "m")
			p := filepath.Join(dir, tc.file)
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			require.Contains(t, string(b), tc.from)
			require.NoError(t, os.WriteFile(p, []byte(strings.Replace(string(b), tc.from, tc.to, 1)), 0o644))
			_, err = Open(repo, "m")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), repo, "errors name files by their path in the repository")
		})
	}
}

func TestHFShardIndexErrors(t *testing.T) {
	for _, tc := range []struct{ from, to, want string }{
		{`"model-00002-of-00002.safetensors"`, `"../outside.safetensors"`, `shard "../outside.safetensors" is not a file name in the model directory`},
		{`"model-00002-of-00002.safetensors"`, `"model-00003-of-00002.safetensors"`, `model-00003-of-00002.safetensors: file does not exist`},
		{`"weight_map"`, `"weights"`, `want {"weight_map": {tensor: shard file}}`},
	} {
		repo := t.TempDir()
		dir := copyHFFolder(t, repo, "camembert", "m")
		p := filepath.Join(dir, HFWeightsIndexFile)
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(p, []byte(strings.Replace(string(b), tc.from, tc.to, 1)), 0o644))
		_, err = Open(repo, "m")
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
	}
}

func TestHFSeqBuckets(t *testing.T) {
	assert.Equal(t, []int{32, 64, 128, 256, 512}, hfSeqBuckets(512))
	assert.Equal(t, []int{32, 64, 128, 256, 384}, hfSeqBuckets(400))
	assert.Equal(t, []int{32}, hfSeqBuckets(40))
	assert.Empty(t, hfSeqBuckets(31))
}

// A Hugging Face folder without its tokenizer is named by its folder and
// config.json, not by a model.yaml it does not have, and is still a
// configuration error (issue 34).
func TestHFFolderWithoutTokenizerSaysSo(t *testing.T) {
	repo := t.TempDir()
	dir := filepath.Join(repo, "novocab")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for _, f := range []string{"config.json", "model.safetensors"} {
		b, err := os.ReadFile(filepath.Join("../model_repository/tiny-xlmr", f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	_, err := Open(repo, "novocab")
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrConfig)
	assert.EqualError(t, err, "novocab/config.json: a Hugging Face encoder folder needs its tokenizer.json (or a WordPiece vocab.txt) beside it to read text; this folder has neither")
}
