package models

import (
	"fmt"
	"slices"
	"strings"

	"github.com/stepserve/stepserve/internal/clip"
)

// The encoder families: the checkpoint layouts encoder.family names.
const (
	FamilyBERT       = "bert"
	FamilyRoBERTa    = "roberta"
	FamilyXLMRoBERTa = "xlm-roberta"
	FamilyCamemBERT  = "camembert"
	FamilyDistilBERT = "distilbert"
)

// The encoder heads encoder.head names.
const (
	// HeadNone: the pooled (optionally normalized) embedding is the output.
	HeadNone = "none"
	// HeadClassification: the family's *ForSequenceClassification head on
	// the first token; the output is raw logits, [-1, num_labels].
	HeadClassification = "classification"
)

// HiddenActs are the feed-forward activations encoder.hidden_act takes:
// gelu is the exact (erf) GELU, gelu_new and gelu_pytorch_tanh its tanh
// approximation.
var HiddenActs = []string{"gelu", "gelu_new", "gelu_pytorch_tanh", "relu"}

// encoderFamily is what a family implies beyond config.json's numbers.
type encoderFamily struct {
	prefix string  // the base model's tensor prefix in a *For... checkpoint
	pad    int     // default pad_token_id
	types  int     // default type_vocab_size
	eps    float64 // default layer_norm_eps
	// offsetPositions: real tokens' positions start at pad_token_id + 1
	// (HF's create_position_ids_from_input_ids), padding's are
	// pad_token_id.
	offsetPositions bool
	distil          bool // DistilBERT's tensor names, no token types
}

var encoderFamilies = map[string]encoderFamily{
	FamilyBERT:       {prefix: "bert.", pad: 0, types: 2, eps: 1e-12},
	FamilyRoBERTa:    {prefix: "roberta.", pad: 1, types: 1, eps: 1e-5, offsetPositions: true},
	FamilyXLMRoBERTa: {prefix: "roberta.", pad: 1, types: 1, eps: 1e-5, offsetPositions: true},
	FamilyCamemBERT:  {prefix: "roberta.", pad: 1, types: 1, eps: 1e-5, offsetPositions: true},
	FamilyDistilBERT: {prefix: "distilbert.", pad: 0, types: 1, eps: 1e-12, distil: true},
}

// encoderFamilyNames are the families in the order errors list them.
var encoderFamilyNames = []string{FamilyBERT, FamilyRoBERTa, FamilyXLMRoBERTa, FamilyCamemBERT, FamilyDistilBERT}

func (f encoderFamily) positionOffset(pad int) int {
	if f.offsetPositions {
		return pad + 1
	}
	return 0
}

// PositionOffset is where the positions of real tokens start: pad_token_id
// + 1 for the RoBERTa family, 0 for the others.
func (e *EncoderConfig) PositionOffset() int {
	return encoderFamilies[e.Family].positionOffset(e.padID())
}

// OffsetPositions reports whether the family numbers positions as RoBERTa
// does: a real token at index s of its sequence (counting only the tokens
// before it that are not padding) has position pad_token_id + 1 + s, a
// padding token pad_token_id.
func (e *EncoderConfig) OffsetPositions() bool { return encoderFamilies[e.Family].offsetPositions }

// PadID is encoder.pad_token_id (its default once validated).
func (e *EncoderConfig) PadID() int { return e.padID() }

func (e *EncoderConfig) padID() int {
	if e.PadTokenID != nil {
		return *e.PadTokenID
	}
	return encoderFamilies[e.Family].pad
}

// MaxSeq is the longest sequence the position table holds: max_position
// less the family's position offset.
func (e *EncoderConfig) MaxSeq() int { return e.MaxPosition - e.PositionOffset() }

// TokenTypes reports whether the family has token type embeddings
// (DistilBERT has none: its token types are ignored).
func (e *EncoderConfig) TokenTypes() bool { return !encoderFamilies[e.Family].distil }

// OutputWidth is the width of the model's one output row: num_labels with
// a classification head, hidden without.
func (e *EncoderConfig) OutputWidth() int {
	if e.Head == HeadClassification {
		return e.NumLabels
	}
	return e.Hidden
}

// Encoder is the encoder architecture's weights, as the Hugging Face
// checkpoints of its family name them.
type Encoder struct {
	Config *EncoderConfig

	// WordEmb is [vocab, H], PosEmb [max_position, H], TypeEmb
	// [types, H] (nil for DistilBERT, which has none).
	WordEmb, PosEmb, TypeEmb []float32
	EmbNorm                  Norm
	Layers                   []EncoderLayer
	// Head is the classification head; nil without one.
	Head *EncoderHead
	// Unused names the tensors of the weights that the model does not
	// read (an I64 position_ids, an embedding model's pooler, a masked
	// LM's lm_head), sorted.
	Unused []string
}

// EncoderLayer is one post-norm transformer layer.
type EncoderLayer struct {
	Query, Key, Value, AttnOut Linear
	AttnNorm                   Norm
	Inter, Out                 Linear // feed-forward: H -> I (hidden_act) -> H
	OutNorm                    Norm
}

// EncoderHead is a sequence classification head on the first token's
// state: Dense (H -> H), then Act, then Classifier (H -> num_labels). BERT's
// is its pooler (tanh) then classifier; RoBERTa's classifier.dense (tanh)
// then classifier.out_proj; DistilBERT's pre_classifier (ReLU) then
// classifier.
type EncoderHead struct {
	Dense      Linear
	Act        string // "tanh" or "relu"
	Classifier Linear
}

// Norm is a LayerNorm's scale and shift.
type Norm struct{ Weight, Bias []float32 }

// encoderNames are one family's tensor names, after its prefix.
type encoderNames struct {
	word, pos, types, embNorm            string
	layer                                string // fmt pattern with the layer's index
	query, key, value, attnOut, attnNorm string
	inter, out, outNorm                  string
	headDense, headAct, headClassifier   string
	headInBase                           bool // the head's dense sits under the base prefix (BERT's pooler)
}

var (
	bertNames = encoderNames{
		word: "embeddings.word_embeddings", pos: "embeddings.position_embeddings",
		types: "embeddings.token_type_embeddings", embNorm: "embeddings.LayerNorm",
		layer: "encoder.layer.%d.",
		query: "attention.self.query", key: "attention.self.key", value: "attention.self.value",
		attnOut: "attention.output.dense", attnNorm: "attention.output.LayerNorm",
		inter: "intermediate.dense", out: "output.dense", outNorm: "output.LayerNorm",
	}
	distilNames = encoderNames{
		word: "embeddings.word_embeddings", pos: "embeddings.position_embeddings", embNorm: "embeddings.LayerNorm",
		layer: "transformer.layer.%d.",
		query: "attention.q_lin", key: "attention.k_lin", value: "attention.v_lin",
		attnOut: "attention.out_lin", attnNorm: "sa_layer_norm",
		inter: "ffn.lin1", out: "ffn.lin2", outNorm: "output_layer_norm",
		headDense: "pre_classifier", headAct: "relu", headClassifier: "classifier",
	}
)

func familyNames(family string) encoderNames {
	switch family {
	case FamilyDistilBERT:
		return distilNames
	case FamilyBERT:
		n := bertNames
		n.headDense, n.headAct, n.headClassifier, n.headInBase = "pooler.dense", "tanh", "classifier", true
		return n
	default: // the RoBERTa family
		n := bertNames
		n.headDense, n.headAct, n.headClassifier = "classifier.dense", "tanh", "classifier.out_proj"
		return n
	}
}

// NewEncoder takes an encoder's tensors out of w, by its family's names,
// with or without the family's prefix ("bert.", "roberta.",
// "distilbert."), checking every shape against cfg. It stops at the first
// tensor missing or of the wrong shape, so that a config asking for more
// layers than the file holds costs no more than the file does. Run on
// weights whose data is not read yet, it checks the shapes alone. The
// tensors it does not read are listed in Encoder.Unused.
func NewEncoder(cfg *EncoderConfig, w *Weights) (*Encoder, error) {
	fam, ok := encoderFamilies[cfg.Family]
	if cfg.Family == "" {
		fam, ok = encoderFamilies[FamilyBERT], true
	}
	if !ok {
		return nil, fmt.Errorf("models: encoder family %q is not supported; want %s", clip.Clip(cfg.Family, maxNameInError), strings.Join(encoderFamilyNames, ", "))
	}
	names := familyNames(cfg.Family)
	if cfg.Family == "" {
		names = familyNames(FamilyBERT)
	}
	prefix := ""
	if _, ok := w.Tensors[fam.prefix+names.word+".weight"]; ok {
		prefix = fam.prefix
	}
	H, I := cfg.Hidden, cfg.Intermediate
	used := make(map[string]bool, len(w.Tensors))
	var err error
	getAt := func(name string, shape ...int) []float32 {
		if err != nil {
			return nil
		}
		var t *Tensor
		t, err = w.Tensor(name, shape...)
		if err != nil {
			return nil
		}
		used[name] = true
		return t.Data
	}
	get := func(name string, shape ...int) []float32 { return getAt(prefix+name, shape...) }
	linear := func(name string, out, in int) Linear {
		return Linear{In: in, Out: out, Weight: get(name+".weight", out, in), Bias: get(name+".bias", out)}
	}
	norm := func(name string) Norm {
		return Norm{Weight: get(name+".weight", H), Bias: get(name+".bias", H)}
	}
	e := &Encoder{
		Config:  cfg,
		WordEmb: get(names.word+".weight", cfg.VocabSize, H),
		PosEmb:  get(names.pos+".weight", cfg.MaxPosition, H),
	}
	if !fam.distil {
		e.TypeEmb = get(names.types+".weight", cfg.TypeVocabSize, H)
	}
	e.EmbNorm = norm(names.embNorm)
	if err != nil {
		return nil, familyHint(err, cfg.Family, w)
	}
	e.Layers = make([]EncoderLayer, 0, min(cfg.Layers, len(w.Tensors)))
	for i := range cfg.Layers {
		p := fmt.Sprintf(names.layer, i)
		l := EncoderLayer{
			Query:    linear(p+names.query, H, H),
			Key:      linear(p+names.key, H, H),
			Value:    linear(p+names.value, H, H),
			AttnOut:  linear(p+names.attnOut, H, H),
			AttnNorm: norm(p + names.attnNorm),
			Inter:    linear(p+names.inter, I, H),
			Out:      linear(p+names.out, H, I),
			OutNorm:  norm(p + names.outNorm),
		}
		if err != nil {
			return nil, fmt.Errorf("%w (encoder.layers is %d)", err, cfg.Layers)
		}
		e.Layers = append(e.Layers, l)
	}
	if cfg.Head == HeadClassification {
		dense := names.headDense
		if names.headInBase {
			dense = prefix + dense
		}
		h := &EncoderHead{
			Dense: Linear{In: H, Out: H, Weight: getAt(dense+".weight", H, H), Bias: getAt(dense+".bias", H)},
			Act:   names.headAct,
			Classifier: Linear{In: H, Out: cfg.NumLabels,
				Weight: getAt(names.headClassifier+".weight", cfg.NumLabels, H), Bias: getAt(names.headClassifier+".bias", cfg.NumLabels)},
		}
		if err != nil {
			return nil, fmt.Errorf("%w (the %s classification head, encoder.num_labels %d)", err, cfg.Family, cfg.NumLabels)
		}
		e.Head = h
	}
	for name := range w.Tensors {
		if !used[name] {
			e.Unused = append(e.Unused, name)
		}
	}
	slices.Sort(e.Unused)
	return e, nil
}

// familyHint adds to an embedding table's error the family the file's
// names suggest, when they are another family's.
func familyHint(err error, family string, w *Weights) error {
	guess := ""
	switch {
	case w.Tensors["distilbert.embeddings.word_embeddings.weight"] != nil || w.Tensors["transformer.layer.0.attention.q_lin.weight"] != nil:
		guess = FamilyDistilBERT
	case w.Tensors["roberta.embeddings.word_embeddings.weight"] != nil:
		guess = FamilyRoBERTa
	case w.Tensors["bert.embeddings.word_embeddings.weight"] != nil:
		guess = FamilyBERT
	}
	if guess == "" || encoderFamilies[guess].prefix == encoderFamilies[family].prefix {
		return err
	}
	if guess == FamilyRoBERTa {
		guess = "roberta, xlm-roberta or camembert"
	}
	return fmt.Errorf("%w; the file's names are those of a %s checkpoint: set encoder.family", err, guess)
}
