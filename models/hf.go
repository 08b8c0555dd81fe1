package models

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/stepserve/stepserve/internal/clip"
)

// The files of a Hugging Face model folder, served as it is: config.json
// decides the architecture, the weights are model.safetensors or the
// shards a model.safetensors.index.json lists, and a model.yaml beside
// them only overrides.
const (
	HFConfigFile       = "config.json"
	HFWeightsFile      = "model.safetensors"
	HFWeightsIndexFile = "model.safetensors.index.json"
	// The sentence-transformers files that say how to pool and whether to
	// normalize.
	stModulesFile     = "modules.json"
	stPoolingFile     = "1_Pooling/config.json"
	hfTokenizerConfig = "tokenizer_config.json"
	hfTokenizerFile   = "tokenizer.json"
)

// The limits on an HF folder's small files: a config.json is a page, a
// shard index lists every tensor once.
const (
	maxHFConfigBytes = 1 << 20
	maxHFIndexBytes  = 16 << 20
	maxShards        = 1024
)

// HFBatchBuckets are the batch buckets of an HF folder without them in a
// model.yaml.
var HFBatchBuckets = []int{1, 4, 16, 64}

// hfMaxSeq bounds the default seq buckets: 512 tokens, as BERT was trained
// with, whatever longer position table a model has.
const hfMaxSeq = 512

// isHFFolder reports whether the directory name of root is a Hugging Face
// model folder: a config.json and model.safetensors or its shard index.
func isHFFolder(root *os.Root, name string) bool {
	if _, err := root.Lstat(path.Join(name, HFConfigFile)); err != nil {
		return false
	}
	for _, w := range []string{HFWeightsFile, HFWeightsIndexFile} {
		if _, err := root.Lstat(path.Join(name, w)); err == nil {
			return true
		}
	}
	return false
}

// hfConfig is what stepserve reads of a transformers config.json; the
// other keys are ignored. DistilBERT's names (dim, n_layers, n_heads,
// hidden_dim, activation) are read beside BERT's.
type hfConfig struct {
	ModelType     string   `json:"model_type"`
	Architectures []string `json:"architectures"`

	HiddenSize        int `json:"hidden_size"`
	Dim               int `json:"dim"`
	NumHiddenLayers   int `json:"num_hidden_layers"`
	NLayers           int `json:"n_layers"`
	NumAttentionHeads int `json:"num_attention_heads"`
	NHeads            int `json:"n_heads"`
	IntermediateSize  int `json:"intermediate_size"`
	HiddenDim         int `json:"hidden_dim"`

	MaxPositionEmbeddings int               `json:"max_position_embeddings"`
	TypeVocabSize         int               `json:"type_vocab_size"`
	LayerNormEps          float64           `json:"layer_norm_eps"`
	HiddenAct             any               `json:"hidden_act"`
	Activation            any               `json:"activation"`
	PadTokenID            *int              `json:"pad_token_id"`
	VocabSize             int               `json:"vocab_size"`
	ID2Label              map[string]string `json:"id2label"`
	PositionEmbeddingType string            `json:"position_embedding_type"`
	SinusoidalPosEmbds    bool              `json:"sinusoidal_pos_embds"`
}

// hfFamilies maps config.json's model_type to an encoder family.
var hfFamilies = map[string]string{
	"bert": FamilyBERT, "roberta": FamilyRoBERTa, "xlm-roberta": FamilyXLMRoBERTa,
	"camembert": FamilyCamemBERT, "distilbert": FamilyDistilBERT,
}

// hfArchFamilies maps an architectures entry's class prefix to a family,
// for a config.json without model_type.
var hfArchFamilies = []struct{ prefix, family string }{
	{"XLMRoberta", FamilyXLMRoBERTa}, {"Roberta", FamilyRoBERTa}, {"Camembert", FamilyCamemBERT},
	{"DistilBert", FamilyDistilBERT}, {"Bert", FamilyBERT},
}

// hfFolder is what an HF folder's files beyond config.json say.
type hfFolder struct {
	pooling   string // "" when no sentence-transformers file says
	normalize bool
	lowercase *bool
	labels    []string // id2label, in id order
}

// openHF reads the HF folder m names, if it is one: config.json, then
// model.yaml over it, and the weights' headers (one file or its shards).
// It reports false, having done nothing, for a directory that is not one.
func (m *Manifest) openHF() (bool, error) {
	if !isHFFolder(m.root, m.Name) {
		return false, nil
	}
	file := path.Join(m.Name, HFConfigFile)
	b, err := readFile(m.root, file, maxHFConfigBytes)
	if err != nil {
		return true, err
	}
	if IsDecoderConfig(b) {
		cfg, err := m.openDecoder(b)
		if err != nil {
			return true, err
		}
		if err := m.overHF(cfg); err != nil {
			return true, err
		}
		return true, m.openHFWeights()
	}
	var hc hfConfig
	if err := json.Unmarshal(b, &hc); err != nil {
		return true, fmt.Errorf("%s: %w: not a transformers config: %s", file, ErrConfig, clip.Clip(jsonError(err), maxNameInError))
	}
	var folder hfFolder
	if err := m.readSentenceTransformers(&folder); err != nil {
		return true, err
	}
	cfg, err := hc.config(&folder)
	if err != nil {
		return true, fmt.Errorf("%s: %w", file, err)
	}
	if err := m.overHF(cfg); err != nil {
		return true, err
	}
	if m.labels, err = m.readLabels(); err != nil {
		return true, err
	}
	if m.labels == nil && folder.labels != nil && cfg.Encoder.Head == HeadClassification &&
		len(cfg.Outputs) == 1 && cfg.Outputs[0].RowElements(0) == len(folder.labels) {
		m.labels = [][]string{folder.labels}
	}
	return true, m.openHFWeights()
}

// overHF decodes the folder's model.yaml, if it has one, over cfg (what
// config.json said), validates it, and makes it the manifest's config.
func (m *Manifest) overHF(cfg *Config) error {
	file := path.Join(m.Name, HFConfigFile)
	yamlFile := path.Join(m.Name, ConfigFile)
	over, err := readFile(m.root, yamlFile, maxConfigBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := cfg.validate(); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
	case err != nil:
		return err
	default:
		if err := overrideConfig(cfg, over); err != nil {
			return fmt.Errorf("%s (over %s): %w", yamlFile, file, err)
		}
		if cfg.Name != "" && cfg.Name != m.Name {
			return fmt.Errorf("%s: %w: name: %q differs from the directory name %q; rename one or drop the key",
				yamlFile, ErrConfig, cfg.Name, m.Name)
		}
	}
	m.Config = cfg
	return nil
}

// config is the model.yaml an HF folder would have had.
func (hc *hfConfig) config(folder *hfFolder) (*Config, error) {
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrConfig, key, fmt.Sprintf(format, args...))
	}
	family, head, err := hc.familyAndHead()
	if err != nil {
		return nil, err
	}
	first := func(a, b int) int {
		if a != 0 {
			return a
		}
		return b
	}
	act, err := hfAct(hc.HiddenAct, hc.Activation)
	if err != nil {
		return nil, err
	}
	if hc.PositionEmbeddingType != "" && hc.PositionEmbeddingType != "absolute" {
		return nil, bad("position_embedding_type", "%q is not supported; stepserve runs absolute position embeddings", clip.Clip(hc.PositionEmbeddingType, maxNameInError))
	}
	e := &EncoderConfig{
		Family:        family,
		VocabSize:     hc.VocabSize,
		Hidden:        first(hc.HiddenSize, hc.Dim),
		Layers:        first(hc.NumHiddenLayers, hc.NLayers),
		Heads:         first(hc.NumAttentionHeads, hc.NHeads),
		Intermediate:  first(hc.IntermediateSize, hc.HiddenDim),
		MaxPosition:   hc.MaxPositionEmbeddings,
		TypeVocabSize: hc.TypeVocabSize,
		LayerNormEps:  hc.LayerNormEps,
		HiddenAct:     act,
		PadTokenID:    hc.PadTokenID,
		Head:          head,
		Pooling:       folder.pooling,
		Normalize:     folder.normalize,
		Lowercase:     folder.lowercase,
		// Truncated to the largest bucket, as sentence-transformers and
		// transformers' pipelines do with these models; model.yaml's
		// encoder.truncate: false refuses long text instead.
		Truncate: true,
	}
	for _, k := range []struct {
		key string
		v   int
	}{{"hidden_size", e.Hidden}, {"num_hidden_layers", e.Layers}, {"num_attention_heads", e.Heads}, {"intermediate_size", e.Intermediate}, {"vocab_size", e.VocabSize}} {
		if k.v <= 0 {
			return nil, bad(k.key, "is missing or not positive; want the model's %s", strings.ReplaceAll(k.key, "_", " "))
		}
	}
	if family == FamilyDistilBERT {
		e.TypeVocabSize = 0 // the family's default: DistilBERT has no token types
	}
	if e.MaxPosition < 0 {
		return nil, bad("max_position_embeddings", "%d is negative; want the model's position count (e.g. 512)", e.MaxPosition)
	}
	if id := e.padID(); id < 0 || id >= e.VocabSize {
		return nil, bad("pad_token_id", "%d is outside the vocabulary (0..%d)", id, e.VocabSize-1)
	}
	if e.MaxPosition == 0 { // absent
		e.MaxPosition = 512 + encoderFamilies[family].positionOffset(e.padID())
	}
	if e.Pooling == "" && head == HeadNone {
		e.Pooling = "mean"
	}
	if e.Normalize && head == HeadClassification {
		e.Normalize = false
	}
	c := &Config{
		Description:  fmt.Sprintf("Hugging Face %s folder (%s)", family, strings.Join(hc.Architectures, ", ")),
		Architecture: "encoder",
		Encoder:      e,
		Inputs:       []TensorSpec{{Name: TextInput, Datatype: BYTES, Shape: []int{-1}}},
	}
	if head == HeadClassification {
		labels, err := hfLabels(hc.ID2Label)
		if err != nil {
			return nil, err
		}
		e.NumLabels = len(labels)
		folder.labels = labels
		c.Inputs = append(c.Inputs, TensorSpec{Name: TextPairInput, Datatype: BYTES, Shape: []int{-1}})
		c.Outputs = []TensorSpec{{Name: LogitsOutput, Datatype: FP32, Shape: []int{-1, e.NumLabels}}}
	} else {
		c.Outputs = []TensorSpec{{Name: EmbeddingOutput, Datatype: FP32, Shape: []int{-1, e.Hidden}}}
	}
	most := min(hfMaxSeq, e.MaxPosition-encoderFamilies[family].positionOffset(e.padID()))
	c.Buckets = Buckets{Batch: slices.Clone(HFBatchBuckets), Seq: hfSeqBuckets(most)}
	if len(c.Buckets.Seq) == 0 {
		return nil, bad("max_position_embeddings", "%d leaves no room for a 32-token sequence", e.MaxPosition)
	}
	return c, nil
}

// hfSeqBuckets are the default seq buckets up to most: 32, 64, 128, ...
// doubling, then most rounded down to a multiple of 32 when it is not one
// of them. Doubling, not every multiple of 32: each bucket is a compiled
// program with its own buffers, and padding to the next power of two
// costs at most twice a sequence's tokens.
func hfSeqBuckets(most int) []int {
	var out []int
	for s := 32; s <= most; s *= 2 {
		out = append(out, s)
	}
	if top := most / 32 * 32; len(out) > 0 && top != out[len(out)-1] {
		out = append(out, top)
	}
	return out
}

// familyAndHead reads the family from model_type (else the architectures'
// class names) and the head from architectures.
func (hc *hfConfig) familyAndHead() (family, head string, err error) {
	family = hfFamilies[hc.ModelType]
	if hc.ModelType != "" && family == "" {
		return "", "", fmt.Errorf("%w: model_type: %q is not supported; want one of bert, roberta, xlm-roberta, camembert, distilbert",
			ErrConfig, clip.Clip(hc.ModelType, maxNameInError))
	}
	head = HeadNone
	for _, a := range hc.Architectures {
		if family == "" {
			for _, f := range hfArchFamilies {
				if strings.HasPrefix(a, f.prefix) {
					family = f.family
					break
				}
			}
		}
		switch {
		case strings.HasSuffix(a, "ForSequenceClassification"):
			head = HeadClassification
		case strings.HasSuffix(a, "Model"), strings.HasSuffix(a, "ForMaskedLM"):
		default:
			return "", "", fmt.Errorf("%w: architectures: %q is not supported; want a *Model or *ForMaskedLM (embeddings) or a *ForSequenceClassification (a classification head)",
				ErrConfig, clip.Clip(a, maxNameInError))
		}
	}
	if family == "" {
		return "", "", fmt.Errorf("%w: model_type: is missing and architectures name no family stepserve runs; want model_type bert, roberta, xlm-roberta, camembert or distilbert", ErrConfig)
	}
	return family, head, nil
}

// hfAct reads hidden_act (activation, DistilBERT's name, when it is unset).
func hfAct(hidden, activation any) (string, error) {
	v, key := hidden, "hidden_act"
	if v == nil {
		v, key = activation, "activation"
	}
	if v == nil {
		return "gelu", nil
	}
	s, ok := v.(string)
	if !ok || !slices.Contains(HiddenActs, s) {
		return "", fmt.Errorf("%w: %s: %s is not supported; want %s", ErrConfig, key, clip.Clip(fmt.Sprintf("%v", v), maxNameInError), strings.Join(HiddenActs, ", "))
	}
	return s, nil
}

// hfLabels are id2label's names in id order: its keys must be 0..n-1. A
// config without id2label has transformers' default, two labels LABEL_0
// and LABEL_1.
func hfLabels(id2label map[string]string) ([]string, error) {
	if len(id2label) == 0 {
		return []string{"LABEL_0", "LABEL_1"}, nil
	}
	if len(id2label) > maxWidth {
		return nil, fmt.Errorf("%w: id2label: %d labels, above the limit of %d", ErrConfig, len(id2label), maxWidth)
	}
	out := make([]string, len(id2label))
	for k, v := range id2label {
		i, err := strconv.Atoi(k)
		if err != nil || i < 0 || i >= len(out) || strconv.Itoa(i) != k {
			return nil, fmt.Errorf("%w: id2label: key %q is not one of the ids 0..%d", ErrConfig, clip.Clip(k, maxNameInError), len(out)-1)
		}
		if len(v) > MaxLabelBytes || strings.ContainsAny(v, "\t\n\r") {
			return nil, fmt.Errorf("%w: id2label: label %d is longer than %d bytes or holds a tab or a line break", ErrConfig, i, MaxLabelBytes)
		}
		out[i] = v
	}
	return out, nil
}

// readSentenceTransformers reads what a sentence-transformers folder says
// of pooling and normalization (modules.json, the pooling module's
// config.json), and tokenizer_config.json's do_lower_case.
func (m *Manifest) readSentenceTransformers(f *hfFolder) error {
	poolingFile := path.Join(m.Name, stPoolingFile)
	file := path.Join(m.Name, stModulesFile)
	b, err := readFile(m.root, file, maxHFConfigBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	default:
		var mods []struct {
			Path string `json:"path"`
			Type string `json:"type"`
		}
		if err := json.Unmarshal(b, &mods); err != nil {
			return fmt.Errorf("%s: %w: want a list of {idx, name, path, type}: %s", file, ErrConfig, clip.Clip(jsonError(err), maxNameInError))
		}
		for _, mod := range mods {
			switch kind := strings.TrimPrefix(mod.Type, "sentence_transformers.models."); kind {
			case "Transformer":
			case "Normalize":
				f.normalize = true
			case "Pooling":
				if relativeFile(mod.Path) != nil {
					return fmt.Errorf("%s: %w: the Pooling module's path %q is not a directory of the folder", file, ErrConfig, clip.Clip(mod.Path, maxNameInError))
				}
				poolingFile = path.Join(m.Name, mod.Path, HFConfigFile)
			default:
				return fmt.Errorf("%s: %w: module %q is not one stepserve runs (Transformer, Pooling and Normalize are); its embeddings would differ",
					file, ErrConfig, clip.Clip(mod.Type, maxNameInError))
			}
		}
	}
	if b, err = readFile(m.root, poolingFile, maxHFConfigBytes); err == nil {
		var p map[string]any
		if err := json.Unmarshal(b, &p); err != nil {
			return fmt.Errorf("%s: %w: not a JSON object: %s", poolingFile, ErrConfig, clip.Clip(jsonError(err), maxNameInError))
		}
		modes := map[string]string{"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_lasttoken": "last"}
		var on []string
		for k, v := range p {
			if v != true || !strings.HasPrefix(k, "pooling_mode_") {
				continue
			}
			mode, ok := modes[k]
			if !ok {
				return fmt.Errorf("%s: %w: %s is not supported; want pooling_mode_cls_token, pooling_mode_mean_tokens or pooling_mode_lasttoken", poolingFile, ErrConfig, clip.Clip(k, maxNameInError))
			}
			on = append(on, mode)
		}
		if len(on) > 1 {
			slices.Sort(on)
			return fmt.Errorf("%s: %w: pooling modes %v are on together; stepserve pools one way", poolingFile, ErrConfig, on)
		}
		if len(on) == 1 {
			f.pooling = on[0]
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if b, err := readFile(m.root, path.Join(m.Name, hfTokenizerConfig), maxHFIndexBytes); err == nil {
		var tc struct {
			DoLowerCase *bool `json:"do_lower_case"`
		}
		if json.Unmarshal(b, &tc) == nil {
			f.lowercase = tc.DoLowerCase
		}
	}
	return nil
}

// overrideConfig decodes model.yaml over cfg, strictly (an unknown key is
// an error): every key it sets wins, the others keep config.json's
// values; then validates.
func overrideConfig(cfg *Config, b []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: %s", ErrConfig, yamlError(err))
	}
	return cfg.validate()
}

// openHFWeights opens model.safetensors, or every shard its index lists,
// and reads the headers.
func (m *Manifest) openHFWeights() error {
	index := path.Join(m.Name, HFWeightsIndexFile)
	b, err := readFile(m.root, index, maxHFIndexBytes)
	if errors.Is(err, fs.ErrNotExist) {
		if m.weights, err = openFile(m.root, path.Join(m.Name, HFWeightsFile), 0); err != nil {
			return err
		}
		if m.Weights, err = readHeader(m.weights); err != nil {
			return err
		}
		m.Weights.Path = filepath.Join(m.dir, HFWeightsFile)
		return nil
	}
	if err != nil {
		return err
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &idx); err != nil || len(idx.WeightMap) == 0 {
		return fmt.Errorf("%s: %w: want {\"weight_map\": {tensor: shard file}}", index, ErrSafetensors)
	}
	var names []string
	for _, f := range idx.WeightMap {
		if !slices.Contains(names, f) {
			if strings.ContainsAny(f, "/\\") || !ValidName(f) {
				return fmt.Errorf("%s: %w: shard %q is not a file name in the model directory", index, ErrSafetensors, clip.Clip(f, maxNameInError))
			}
			if names = append(names, f); len(names) > maxShards {
				return fmt.Errorf("%s: %w: more than %d shards", index, ErrSafetensors, maxShards)
			}
		}
	}
	slices.Sort(names)
	headers := make([]*Weights, len(names))
	paths := make([]string, len(names))
	for i, n := range names {
		f, err := openFile(m.root, path.Join(m.Name, n), 0)
		if err != nil {
			return err
		}
		m.shards = append(m.shards, f)
		if headers[i], err = readHeader(f); err != nil {
			return err
		}
		paths[i] = filepath.Join(m.dir, n)
	}
	if m.Weights, err = mergeShards(index, headers, paths); err != nil {
		return err
	}
	for t, f := range idx.WeightMap {
		if w := m.Weights.Tensors[t]; w == nil || names[w.shard] != f {
			return fmt.Errorf("%s: %w: tensor %q is not in shard %s, where the index says it is", index, ErrSafetensors, clip.Clip(t, maxNameInError), clip.Clip(f, maxNameInError))
		}
	}
	m.weights = m.shards[0]
	return nil
}

// jsonError is a JSON decoding error without the value it quotes.
func jsonError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("%s: want %s, found %s", te.Field, te.Type, te.Value)
	}
	return err.Error()
}
