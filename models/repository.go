package models

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// The files of a model directory.
const (
	ConfigFile  = "model.yaml"
	WeightsFile = "weights.safetensors"
)

// Model is one loaded model: its validated config and its weights, ready for
// an engine to build programs from.
type Model struct {
	Name    string
	Version string
	Dir     string
	Config  *Config
	Weights *Weights
	// MLP is set when Config.Architecture is "mlp".
	MLP *MLP
	// Encoder is set when Config.Architecture is "encoder".
	Encoder *Encoder
	// Tokenizer is set when the directory holds a vocab.txt.
	Tokenizer *Tokenizer
}

// Load reads the model in dir, named after the directory.
func Load(dir string) (*Model, error) {
	name := filepath.Base(dir)
	if !ValidName(name) {
		return nil, fmt.Errorf("%s: %q is not a valid model name; use letters, digits, '_', '.' or '-'", dir, name)
	}
	cfg, err := ReadConfig(filepath.Join(dir, ConfigFile))
	if err != nil {
		return nil, err
	}
	if cfg.Name != "" && cfg.Name != name {
		return nil, fmt.Errorf("%s: %w: name: %q differs from the directory name %q; rename one or drop the key",
			filepath.Join(dir, ConfigFile), ErrConfig, cfg.Name, name)
	}
	w, err := ReadSafetensors(filepath.Join(dir, WeightsFile))
	if err != nil {
		return nil, err
	}
	m := &Model{Name: name, Version: cfg.Version, Dir: dir, Config: cfg, Weights: w}
	switch cfg.Architecture {
	case "mlp":
		if m.MLP, err = NewMLP(cfg.MLP, w); err != nil {
			return nil, err
		}
	case "encoder":
		if m.Encoder, err = NewEncoder(cfg.Encoder, w); err != nil {
			return nil, err
		}
		vocab := filepath.Join(dir, VocabFile)
		if _, err := os.Stat(vocab); err == nil {
			if m.Tokenizer, err = ReadTokenizer(vocab, *cfg.Encoder.Lowercase, cfg.Encoder.VocabSize); err != nil {
				return nil, err
			}
		} else if cfg.TextInput() {
			return nil, fmt.Errorf("%s: %w: inputs: a text input needs a WordPiece %s in the model directory", filepath.Join(dir, ConfigFile), ErrConfig, VocabFile)
		}
	}
	return m, nil
}

// LoadRepository loads every model directory (a directory holding a
// model.yaml) under root, in name order. Other entries are ignored. One bad
// model fails the whole load, naming the model, so that a server never starts
// with part of what it was asked to serve.
func LoadRepository(root string) ([]*Model, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("models: repository: %w", err)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	var out []*Model
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(root, e.Name())
		if _, err := os.Stat(filepath.Join(dir, ConfigFile)); errors.Is(err, os.ErrNotExist) {
			continue
		}
		m, err := Load(dir)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("models: repository %s holds no model (no <name>/%s)", root, ConfigFile)
	}
	return out, nil
}
