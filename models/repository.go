package models

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"

	"github.com/stepserve/stepserve/internal/clip"
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
	// Decoder is set when Config.Architecture is "decoder".
	Decoder *Decoder
	// Tokenizer is set when the directory holds a tokenizer.json or a
	// vocab.txt.
	Tokenizer TextTokenizer
	// Labels holds, per output (Config.Outputs' order), the class names
	// its labels file gives each element of a row; nil when no output has
	// one, and a nil entry for an output without one.
	Labels [][]string
	// Skipped names the weights' tensors the model does not use, left
	// unread (sorted), for the load log.
	Skipped []string
}

// Load reads the model in dir, named after the directory, as [Open] and
// [Manifest.Load] do with dir's parent as the repository.
func Load(dir string) (*Model, error) {
	dir = filepath.Clean(dir)
	m, err := Open(filepath.Dir(dir), filepath.Base(dir))
	if err != nil {
		return nil, err
	}
	return m.Load(context.Background())
}

// List names the models of the repository at repo: its directories that
// hold a model.yaml or are Hugging Face model folders (config.json and
// model.safetensors or its shard index), in name order. Other entries are
// ignored.
func List(repo string) ([]string, error) {
	root, err := os.OpenRoot(repo)
	if err != nil {
		return nil, fmt.Errorf("models: repository: %w", unwrapPath(err))
	}
	defer root.Close()
	entries, err := fs.ReadDir(root.FS(), ".")
	if err != nil {
		return nil, fmt.Errorf("models: repository: %w", unwrapPath(err))
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		// Lstat: only whether it is there; Open says what is wrong with it.
		if _, err := root.Lstat(path.Join(e.Name(), ConfigFile)); err != nil && !isHFFolder(root, e.Name()) && !isGGUFFolder(root, e.Name()) {
			continue
		}
		out = append(out, e.Name())
	}
	return out, nil // fs.ReadDir sorts by name
}

// Manifest is a model directory read up to its weights' values: the
// validated model.yaml and the weights file's header, every tensor the
// architecture takes present with the shape model.yaml implies. What the
// model will take to hold is known from it ([Weights.ResidentBytes]);
// nothing that grows with the weights is allocated until [Manifest.Load].
// Close it when it is not loaded.
type Manifest struct {
	Name   string
	Config *Config
	// Weights lists the weights file's tensors, without their values.
	Weights *Weights

	dir     string
	root    *os.Root
	weights *repoFile
	tokfile string      // the tokenizer file the directory has, if any
	labels  [][]string  // the outputs' labels files, read at Open (small)
	shards  []*repoFile // sharded weights' files (weights is the first); nil for one file
	skipped []string    // the tensors the model does not use, dropped at Open
	// A decoder folder's generation_config.json and chat template.
	generation *GenerationConfig
	chat       *ChatTemplate
	hf         bool       // a Hugging Face folder: no model.yaml
	gguf       *ggufModel // a GGUF folder's file, nil for others
}

// Open reads model name of the repository at repo up to its weights'
// values: model.yaml, the weights' header and the shapes of the tensors
// it names, and whether a vocab.txt is there. Every file is opened through
// the repository (a symbolic link out of it is refused), must be a regular
// file (a FIFO or a device is refused without blocking), and is read only
// up to its limit. Errors name files by their path in the repository
// (digits/model.yaml), never by the server's path, and quote no more of a
// file than a key or a tensor name. A missing model wraps [ErrNoModel].
func Open(repo, name string) (*Manifest, error) {
	if !ValidName(name) {
		return nil, fmt.Errorf("models: %q is not a valid model name; use letters, digits, '_', '.' or '-'", clip.Clip(name, maxNameInError))
	}
	root, err := os.OpenRoot(repo)
	if err != nil {
		return nil, fmt.Errorf("models: repository: %w", unwrapPath(err))
	}
	m := &Manifest{Name: name, dir: filepath.Join(repo, name), root: root}
	if err := m.open(); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

func (m *Manifest) open() error {
	file := path.Join(m.Name, ConfigFile)
	if ok, err := m.openGGUF(); ok || err != nil {
		m.hf = true
		return err
	}
	hf, err := m.openHF()
	m.hf = hf
	if err != nil || hf {
		if err == nil {
			err = m.openLayers()
		}
		if err == nil {
			err = m.checkVocab()
		}
		return err
	}
	b, err := readFile(m.root, file, maxConfigBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: the repository has no %s", ErrNoModel, file)
	}
	if err != nil {
		return err
	}
	if m.Config, err = ParseConfig(bytes.NewReader(b)); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if m.Config.Name != "" && m.Config.Name != m.Name {
		return fmt.Errorf("%s: %w: name: %q differs from the directory name %q; rename one or drop the key",
			file, ErrConfig, m.Config.Name, m.Name)
	}
	if m.labels, err = m.readLabels(); err != nil {
		return err
	}
	if m.Config.Architecture == "torch" {
		return m.openTorch()
	}
	if m.weights, err = openFile(m.root, path.Join(m.Name, WeightsFile), 0); err != nil {
		return err
	}
	if m.Weights, err = readHeader(m.weights); err != nil {
		return err
	}
	m.Weights.Path = filepath.Join(m.dir, WeightsFile)
	if err := m.openLayers(); err != nil {
		return err
	}
	return m.checkVocab()
}

// openLayers checks the weights' shapes against the architecture, and
// drops the tensors it does not use, so that they are neither read nor
// counted.
func (m *Manifest) openLayers() error {
	out, err := m.layers()
	if err != nil {
		return err
	}
	if out.Encoder != nil {
		m.skipped = out.Encoder.Unused
		m.Weights.Drop(m.skipped)
	}
	if out.Decoder != nil {
		want := m.Config.Decoder.Tensors()
		for name := range m.Weights.Tensors {
			if _, ok := want[name]; !ok {
				m.skipped = append(m.skipped, name)
			}
		}
		slices.Sort(m.skipped)
		m.Weights.Drop(m.skipped)
	}
	return nil
}

// checkVocab finds a text encoder's tokenizer files.
func (m *Manifest) checkVocab() error {
	var err error
	file := path.Join(m.Name, ConfigFile)
	switch m.Config.Architecture {
	case "encoder":
		if m.tokfile, err = m.findTokenizer(file); err != nil {
			return err
		}
	case "decoder":
		ok, err := statFile(m.root, path.Join(m.Name, TokenizerFile), maxTokenizerBytes)
		if err != nil {
			return err
		}
		if !ok {
			return folderError(fmt.Sprintf("%s: a decoder language model's folder needs its %s beside it; this folder has none",
				path.Join(m.Name, HFConfigFile), TokenizerFile))
		}
		m.tokfile = TokenizerFile
	}
	return nil
}

// folderError is a Hugging Face folder missing a file it needs: a
// configuration error ([ErrConfig], a 400 on load) whose text names the
// folder, not a model.yaml it does not have.
type folderError string

func (e folderError) Error() string        { return string(e) }
func (e folderError) Is(target error) bool { return target == ErrConfig }

// openTorch checks an architecture torch model's files: the module a
// regular file of at most maxModuleBytes, the weights (if named) a
// safetensors file whose header parses. The worker reads both; Go reads
// no tensor values.
func (m *Manifest) openTorch() error {
	t := m.Config.Torch
	ok, err := statFile(m.root, path.Join(m.Name, t.Module), maxModuleBytes)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%s: %w: torch.module: %s is not in the model directory", path.Join(m.Name, ConfigFile), ErrConfig, path.Join(m.Name, t.Module))
	}
	m.Weights = &Weights{Tensors: map[string]*Tensor{}}
	if t.Weights == "" {
		return nil
	}
	if m.weights, err = openFile(m.root, path.Join(m.Name, t.Weights), 0); err != nil {
		return err
	}
	if m.Weights, err = readHeader(m.weights); err != nil {
		return err
	}
	m.Weights.Path = filepath.Join(m.dir, t.Weights)
	return nil
}

// maxModuleBytes bounds an architecture torch model's Python file.
const maxModuleBytes = 16 << 20

// ModulePath is where an architecture torch model's Python file is on
// disk, for the worker that imports it.
func (m *Model) ModulePath() string {
	if m.Config.Torch == nil {
		return ""
	}
	return filepath.Join(m.Dir, filepath.FromSlash(m.Config.Torch.Module))
}

// layers builds the architecture's layers from the weights: their shapes
// alone before the values are read.
func (m *Manifest) layers() (*Model, error) {
	out := &Model{Name: m.Name, Version: m.Config.Version, Dir: m.dir, Config: m.Config, Weights: m.Weights, Labels: m.labels, Skipped: m.skipped}
	var err error
	switch m.Config.Architecture {
	case "mlp":
		out.MLP, err = NewMLP(m.Config.MLP, m.Weights)
	case "encoder":
		out.Encoder, err = NewEncoder(m.Config.Encoder, m.Weights)
	case "decoder":
		if out.Decoder, err = NewDecoder(m.Config.Decoder, m.Weights); err == nil {
			out.Decoder.Generation, out.Decoder.Chat = m.generation, m.chat
		}
	}
	return out, err
}

// Load reads the weights' values (and the vocabulary) and returns the
// model; it honours ctx between chunks of the weights. It closes m.
func (m *Manifest) Load(ctx context.Context) (*Model, error) {
	defer m.Close()
	if m.Config.Architecture == "torch" {
		// The worker reads the module and its weights; nothing to hold here.
		return m.layers()
	}
	if m.gguf != nil {
		if m.gguf.file == nil {
			return nil, fmt.Errorf("models: model %s: the manifest was loaded or closed already", m.Name)
		}
		if err := m.loadGGUF(ctx); err != nil {
			return nil, err
		}
		m.gguf.close() // a second Load is told the manifest was loaded
		out, err := m.layers()
		if err != nil {
			return nil, err
		}
		if out.Tokenizer, err = ParseHFTokenizer(m.gguf.tok, m.Weights.Name+" (its tokenizer)", m.Config.Decoder.Vocab); err != nil {
			return nil, err
		}
		return out, nil
	}
	if m.weights == nil {
		return nil, fmt.Errorf("models: model %s: the manifest was loaded or closed already", m.Name)
	}
	files := []*repoFile{m.weights}
	if m.shards != nil {
		files = m.shards
	}
	if err := m.Weights.readData(ctx, files...); err != nil {
		return nil, err
	}
	out, err := m.layers()
	if err != nil {
		return nil, err
	}
	if out.Tokenizer, err = m.loadTokenizer(m.tokfile); err != nil {
		return nil, err
	}
	return out, nil
}

// Close releases the files Open kept open. It is idempotent.
func (m *Manifest) Close() error {
	var errs []error
	for _, f := range m.shards {
		if f != m.weights {
			errs = append(errs, f.Close())
		}
	}
	m.shards = nil
	errs = append(errs, m.gguf.close())
	if m.weights != nil {
		errs = append(errs, m.weights.Close())
		m.weights = nil
	}
	if m.root != nil {
		errs = append(errs, m.root.Close())
		m.root = nil
	}
	return errors.Join(errs...)
}
