package models

import (
	"context"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/stepserve/stepserve/internal/clip"
	"github.com/stepserve/stepserve/models/gguf"
)

// A folder holding one .gguf file (llama.cpp's format, as ollama and the
// Hub ship language models) is a decoder served as it is: the file's
// metadata gives the architecture (llama, mistral, qwen2), its tokenizer,
// special tokens and chat template, and its tensors the weights; a
// model.yaml beside it only overrides, as over a Hugging Face folder.

// ggufFile is the .gguf file the model directory name serves, if it is a
// GGUF folder: one holding .gguf files and no other weights (no
// weights.safetensors, no Hugging Face config.json), for the Hub's folders
// often ship a .gguf beside the safetensors they are served from. More
// than one .gguf is an error (which would it serve?).
func ggufFile(m *Manifest) (string, bool, error) {
	entries, err := fs.ReadDir(m.root.FS(), m.Name)
	if err != nil {
		return "", false, nil // Open says what is wrong with the directory
	}
	var found []string
	for _, e := range entries {
		switch name := e.Name(); {
		case name == WeightsFile || name == HFConfigFile:
			return "", false, nil
		case !e.IsDir() && strings.HasSuffix(strings.ToLower(name), ".gguf"):
			found = append(found, name)
		}
	}
	switch len(found) {
	case 0:
		return "", false, nil
	case 1:
		return found[0], true, nil
	}
	return "", true, folderError(fmt.Sprintf("%s: %d .gguf files (%s); a model directory serves one: move the others out",
		m.Name, len(found), clip.Clip(strings.Join(found, ", "), 200)))
}

// isGGUFFolder reports whether directory name of root holds one .gguf.
func isGGUFFolder(root *os.Root, name string) bool {
	_, ok, _ := ggufFile(&Manifest{Name: name, root: root})
	return ok
}

// ggufModel is what Open keeps of a GGUF folder until Load: the file, the
// decoder's description and its tensors.
type ggufModel struct {
	file    *repoFile
	f       *gguf.File
	cfg     *gguf.DecoderConfig
	tensors []gguf.DecoderTensor
	tok     []byte // tokenizer.json, made from the metadata
}

// openGGUF reads the GGUF folder m names, if it is one: the file's header
// and metadata (every count and offset checked), then model.yaml over the
// configuration they give. It reports false, having done nothing, for a
// directory without a .gguf.
func (m *Manifest) openGGUF() (bool, error) {
	name, ok, err := ggufFile(m)
	if !ok || err != nil {
		return ok, err
	}
	file := path.Join(m.Name, name)
	rf, err := openFile(m.root, file, 0)
	if err != nil {
		return true, err
	}
	g := &ggufModel{file: rf}
	m.gguf = g
	if g.f, err = gguf.Parse(rf, rf.Size); err != nil {
		return true, ggufError(file, err)
	}
	if g.cfg, err = gguf.ReadDecoderConfig(g.f); err != nil {
		return true, ggufError(file, err)
	}
	if g.tensors, err = gguf.DecoderTensors(g.f, g.cfg); err != nil {
		return true, ggufError(file, err)
	}
	tok, err := gguf.ReadTokenizer(g.f)
	if err != nil {
		return true, ggufError(file, err)
	}
	if g.tok, err = tok.HFJSON(); err != nil {
		return true, ggufError(file+": the tokenizer", err)
	}
	c := g.cfg
	dc := &DecoderConfig{Family: c.Family, Vocab: c.Vocab, Hidden: c.Hidden, Layers: c.Layers, Heads: c.Heads, KVHeads: c.KVHeads,
		HeadDim: c.HeadDim, Intermediate: c.Intermediate, MaxPosition: c.MaxPosition, RMSNormEps: c.RMSNormEps, RopeTheta: c.RopeTheta,
		QKVBias: c.QKVBias, OBias: c.OBias, TiedEmbeddings: c.TiedEmbeddings}
	if c.RopeFreqs {
		if dc.RopeFactors, err = ropeFactors(g.f, c.HeadDim); err != nil {
			return true, ggufError(file, err)
		}
	}
	cfg := &Config{
		Description:  fmt.Sprintf("GGUF %s file %s (decoder language model)", c.Architecture, name),
		Architecture: "decoder",
		Engine:       "cpu",
		Decoder:      dc,
		Inputs:       []TensorSpec{{Name: GenerateInput, Datatype: BYTES, Shape: []int{-1}}},
		Outputs:      []TensorSpec{{Name: TextOutput, Datatype: BYTES, Shape: []int{-1}}},
	}
	// A file whose projections are Q8_0 or Q4_0 is served in that format:
	// its blocks quantize back to themselves (a Q8_0 block's largest
	// value is ±127 times its scale; the engine finds a Q4_0 block's
	// scale among its largest magnitude over 1 to 8). The
	// K-quants (Q4_K_M files mix Q4_K and Q6_K, Q5_K_M Q5_K and Q6_K) have
	// no kernel here: they are served in Q8_0, which keeps their values
	// to within half a step of 1/127 of each block's largest.
	for _, t := range g.tensors {
		if strings.HasSuffix(t.HF, "self_attn.q_proj.weight") {
			switch t.Info.Type {
			case gguf.Q8_0, gguf.Q4_K, gguf.Q5_K, gguf.Q6_K:
				cfg.Quantization = "q8_0"
			case gguf.Q4_0:
				cfg.Quantization = "q4_0"
			}
		}
	}
	gen := &GenerationConfig{}
	if tok.EOS >= 0 {
		gen.EOS = []int{tok.EOS}
	}
	if tok.BOS >= 0 && tok.AddBOS {
		bos := tok.BOS
		gen.BOS = &bos
	}
	m.generation = gen
	if tok.ChatTemplate != "" {
		special := map[string]any{}
		for key, id := range map[string]int{"bos_token": tok.BOS, "eos_token": tok.EOS, "unk_token": tok.UNK, "pad_token": tok.PAD} {
			if id >= 0 && id < len(tok.Tokens) {
				special[key] = tok.Tokens[id]
			}
		}
		if m.chat, err = ParseChatTemplate(tok.ChatTemplate, special); err != nil {
			return true, fmt.Errorf("%s: tokenizer.chat_template: %w", file, err)
		}
	}
	if err := m.overHF(cfg); err != nil {
		return true, err
	}
	if m.Config.Engine != "cpu" {
		return true, fmt.Errorf("%s: %w: engine: a GGUF file is served by the CPU engine; %s needs the Hugging Face folder", path.Join(m.Name, ConfigFile), ErrConfig, m.Config.Engine)
	}
	// The weights by their Hugging Face names, shapes only until Load.
	m.Weights = &Weights{Name: file, Path: filepath.Join(m.dir, name), Tensors: map[string]*Tensor{}}
	for _, t := range g.tensors {
		m.Weights.Tensors[t.HF] = &Tensor{Name: t.HF, Dtype: "F32", Shape: t.Shape}
	}
	return true, m.openLayers()
}

// loadGGUF reads the tensors' values into m.Weights: dequantized to
// float32, llama.cpp's Q/K row order undone.
func (m *Manifest) loadGGUF(ctx context.Context) error {
	g := m.gguf
	for i := range g.tensors {
		t := &g.tensors[i]
		w, ok := m.Weights.Tensors[t.HF]
		if !ok {
			continue // dropped: the architecture does not use it
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s: reading the weights: %w", m.Weights.Name, err)
		}
		data, err := g.f.ReadDecoderTensor(t, g.cfg.HeadDim)
		if err != nil {
			return ggufError(m.Weights.Name, err)
		}
		w.Data = data
	}
	return nil
}

// ggufError is a GGUF file refused: a configuration error (a 400 on a
// load) that names the file and what is wrong in it.
func ggufError(file string, err error) error {
	return folderError(fmt.Sprintf("%s: %v", file, err))
}

// closeGGUF releases the file.
func (g *ggufModel) close() error {
	if g == nil || g.file == nil {
		return nil
	}
	err := g.file.Close()
	g.file = nil
	return err
}

// ropeFactors reads rope_freqs.weight: one divisor a frequency of a
// head's RoPE (headDim/2), each finite and positive.
func ropeFactors(f *gguf.File, headDim int) ([]float64, error) {
	t, _ := f.TensorByName("rope_freqs.weight")
	if len(t.Dims) != 1 || t.Dims[0] != uint64(headDim/2) {
		return nil, fmt.Errorf("%w: rope_freqs.weight has shape %v; want [%d], one factor a frequency of the head's %d dimensions", gguf.ErrMalformed, t.Dims, headDim/2, headDim)
	}
	v, err := f.ReadFloat32(t)
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(v))
	for i, x := range v {
		if !(x > 0) || math.IsInf(float64(x), 0) {
			return nil, fmt.Errorf("%w: rope_freqs.weight[%d] is %g; want a positive factor", gguf.ErrMalformed, i, x)
		}
		out[i] = float64(x)
	}
	return out, nil
}
