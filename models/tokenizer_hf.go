package models

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path"

	"github.com/stepserve/stepserve/models/tokenizers"
)

// TokenizerFile is the Hugging Face tokenizers file a text model's
// directory may hold; with it, vocab.txt is not read.
const TokenizerFile = "tokenizer.json"

// The names of a text model's tensors, which Hub folders are served with
// and which the text APIs (OpenAI, TEI) look for in any model.
const (
	// TextInput is a text model's BYTES input: one text per element.
	TextInput = "text"
	// TextPairInput is the optional second BYTES input of a model that
	// scores text pairs (rerankers, NLI): each element is tokenized with
	// the text element of the same index, as the model's family frames a
	// pair.
	TextPairInput = "text_pair"
	// EmbeddingOutput is an embedding model's FP32 output, [n, hidden].
	EmbeddingOutput = "embedding"
	// LogitsOutput is a classifier's or reranker's FP32 output, [n, labels].
	LogitsOutput = "logits"
)

// maxTokenizerBytes bounds tokenizer.json: multilingual SentencePiece
// files (XLM-R's 250,000 pieces) are about 17 MB.
const maxTokenizerBytes = 64 << 20

// Token is a token of a text, as /tokenize shows it.
type Token struct {
	ID int64
	// Text is the token as the vocabulary spells it ("##ing", "▁the",
	// "Ġworld", "[CLS]"); the text it stands for is text[Start:Stop].
	Text string
	// Start and Stop are byte offsets into the text; equal for a special
	// token the tokenizer inserted ([CLS], <s>).
	Start, Stop int
	// Special marks special tokens: inserted ones, and special added
	// tokens written in the text.
	Special bool
}

// TextTokenizer turns a text model's text into token ids: a
// tokenizer.json ([HFTokenizer]) or a vocab.txt ([Tokenizer]).
type TextTokenizer interface {
	// AppendEncode appends the ids of text framed by its special tokens,
	// at most maxLen of them: longer text is truncated when truncate is
	// set and matches ErrTooLong otherwise (dst comes back unchanged).
	AppendEncode(dst []int64, text string, maxLen int, truncate bool) ([]int64, error)
	// AppendEncodePair appends the ids and token types of the pair (text,
	// pair) framed as the model's family frames pairs, as AppendEncode
	// does a text.
	AppendEncodePair(ids, types []int64, text, pair string, maxLen int, truncate bool) ([]int64, []int64, error)
	// Tokenize is every token of text with its special tokens, with byte
	// offsets into text.
	Tokenize(text string) ([]Token, error)
	// PadID is the id rows are padded with.
	PadID() int64
}

// HFTokenizer is a tokenizer.json tokenizer.
type HFTokenizer struct {
	t *tokenizers.Tokenizer
}

// ParseHFTokenizer reads a tokenizer.json; name names it in errors. Every
// id must be under vocabSize (the embedding table's rows) when that is
// set.
func ParseHFTokenizer(data []byte, name string, vocabSize int) (*HFTokenizer, error) {
	t, err := tokenizers.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if vocabSize > 0 && t.VocabSize() > vocabSize {
		return nil, fmt.Errorf("%s: token ids up to %d, beyond encoder.vocab_size %d", name, t.VocabSize()-1, vocabSize)
	}
	return &HFTokenizer{t}, nil
}

// Tokenizers is the tokenizer.json tokenizer underneath.
func (h *HFTokenizer) Tokenizers() *tokenizers.Tokenizer { return h.t }

// PadID is the file's padding id, else its [PAD] or <pad> token, else 0.
func (h *HFTokenizer) PadID() int64 { return h.t.PadID() }

func (h *HFTokenizer) AppendEncode(dst []int64, text string, maxLen int, truncate bool) ([]int64, error) {
	toks, err := h.t.Encode(text, "", false, tokenizers.Options{MaxLen: maxLen, Truncate: truncate})
	if err != nil {
		return dst, hfError(err)
	}
	for _, t := range toks {
		dst = append(dst, t.ID)
	}
	return dst, nil
}

// EncodeIDs is text's ids for a language model: framed by the
// post-processor's special tokens (a Llama's BOS) with special, as
// transformers' add_special_tokens; without, as a rendered chat template
// is encoded (the template writes those tokens itself).
func (h *HFTokenizer) EncodeIDs(text string, special bool) ([]int32, error) {
	toks, err := h.t.Encode(text, "", false, tokenizers.Options{Plain: !special})
	if err != nil {
		return nil, hfError(err)
	}
	out := make([]int32, len(toks))
	for i, t := range toks {
		out[i] = int32(t.ID)
	}
	return out, nil
}

func (h *HFTokenizer) AppendEncodePair(ids, types []int64, text, pair string, maxLen int, truncate bool) ([]int64, []int64, error) {
	toks, err := h.t.Encode(text, pair, true, tokenizers.Options{MaxLen: maxLen, Truncate: truncate})
	if err != nil {
		return ids, types, hfError(err)
	}
	for _, t := range toks {
		ids, types = append(ids, t.ID), append(types, t.TypeID)
	}
	return ids, types, nil
}

func (h *HFTokenizer) Tokenize(text string) ([]Token, error) {
	toks, err := h.t.Encode(text, "", false, tokenizers.Options{})
	if err != nil {
		return nil, hfError(err)
	}
	out := make([]Token, len(toks))
	for i, t := range toks {
		out[i] = Token{ID: t.ID, Text: h.t.TokenText(t.ID), Start: t.Start, Stop: t.Stop, Special: t.Special}
	}
	return out, nil
}

// hfError makes the tokenizer's refusal of long text match ErrTooLong.
func hfError(err error) error {
	var tl *tokenizers.TooLongError
	if errors.As(err, &tl) {
		return &tooLongError{tokens: tl.Tokens, limit: tl.Limit, specials: "the special tokens"}
	}
	return err
}

// bert is the tokenizer.json pipeline a vocab.txt stands for (BERT's
// normalizer and pre-tokenizer, WordPiece, [CLS] A [SEP] B [SEP] with
// token types 0 then 1): the vocab.txt tokenizer's pairs and offsets.
func bert(vocab []string, lowercase bool) (*tokenizers.Tokenizer, error) {
	ids := make(map[string]int, len(vocab))
	for i := len(vocab) - 1; i >= 0; i-- { // the first of duplicates wins
		ids[vocab[i]] = i
	}
	var added []map[string]any
	for _, name := range []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"} {
		if id, ok := ids[name]; ok {
			added = append(added, map[string]any{"id": id, "content": name, "special": true, "normalized": false})
		}
	}
	special := func(name string) map[string]any {
		return map[string]any{"id": name, "ids": []int{ids[name]}, "tokens": []string{name}}
	}
	item := func(kind, id string, typeID int) map[string]any {
		return map[string]any{kind: map[string]any{"id": id, "type_id": typeID}}
	}
	file := map[string]any{
		"added_tokens":  added,
		"normalizer":    map[string]any{"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "lowercase": lowercase},
		"pre_tokenizer": map[string]any{"type": "BertPreTokenizer"},
		"post_processor": map[string]any{
			"type":   "TemplateProcessing",
			"single": []any{item("SpecialToken", "[CLS]", 0), item("Sequence", "A", 0), item("SpecialToken", "[SEP]", 0)},
			"pair": []any{item("SpecialToken", "[CLS]", 0), item("Sequence", "A", 0), item("SpecialToken", "[SEP]", 0),
				item("Sequence", "B", 1), item("SpecialToken", "[SEP]", 1)},
			"special_tokens": map[string]any{"[CLS]": special("[CLS]"), "[SEP]": special("[SEP]")},
		},
		"model": map[string]any{"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
			"max_input_chars_per_word": maxWordChars, "vocab": ids},
		// What transformers' BertTokenizer decodes with: pieces joined,
		// "##" continuations glued on, spaces before punctuation cleaned.
		"decoder": map[string]any{"type": "WordPiece", "prefix": "##", "cleanup": true},
	}
	b, err := json.Marshal(file)
	if err != nil {
		return nil, err
	}
	return tokenizers.Parse(b)
}

// PadID is [PAD]'s id.
func (t *Tokenizer) PadID() int64 { return t.PAD }

// Tokenizers is the same tokenizer as a tokenizer.json pipeline (with
// BertTokenizer's WordPiece decoder), for what the vocab.txt pipeline
// does not do: pairs, offsets, decoding ids.
func (t *Tokenizer) Tokenizers() *tokenizers.Tokenizer { return t.hf }

// AppendEncodePair encodes a pair as BERT does: [CLS] text [SEP] pair
// [SEP], token types 0 up to the first [SEP] and 1 after.
func (t *Tokenizer) AppendEncodePair(ids, types []int64, text, pair string, maxLen int, truncate bool) ([]int64, []int64, error) {
	return (&HFTokenizer{t.hf}).AppendEncodePair(ids, types, text, pair, maxLen, truncate)
}

// Tokenize is every token of text, [CLS] and [SEP] included, with byte
// offsets into text.
func (t *Tokenizer) Tokenize(text string) ([]Token, error) {
	return (&HFTokenizer{t.hf}).Tokenize(text)
}

// findTokenizer is the tokenizer file in an encoder's directory:
// tokenizer.json when present, else vocab.txt, else "" (an error for a
// model that takes text); configFile names the config in errors.
func (m *Manifest) findTokenizer(configFile string) (string, error) {
	for _, f := range []struct {
		name  string
		limit int64
	}{{TokenizerFile, maxTokenizerBytes}, {VocabFile, maxVocabBytes}} {
		ok, err := statFile(m.root, path.Join(m.Name, f.name), f.limit)
		if err != nil {
			return "", err
		}
		if ok {
			return f.name, nil
		}
	}
	if m.Config.TextInput() {
		if m.hf {
			return "", folderError(fmt.Sprintf("%s: a Hugging Face encoder folder needs its %s (or a WordPiece %s) beside it to read text; this folder has neither",
				path.Join(m.Name, HFConfigFile), TokenizerFile, VocabFile))
		}
		return "", fmt.Errorf("%s: %w: inputs: a text input needs a %s or a WordPiece %s in the model directory", configFile, ErrConfig, TokenizerFile, VocabFile)
	}
	return "", nil
}

// loadTokenizer reads the tokenizer file findTokenizer found, through the
// repository (a file swapped for a link or a FIFO since is refused here
// too); nil when there is none.
func (m *Manifest) loadTokenizer(file string) (TextTokenizer, error) {
	if file == "" {
		return nil, nil
	}
	name := path.Join(m.Name, file)
	limit := int64(maxVocabBytes)
	if file == TokenizerFile {
		limit = maxTokenizerBytes
	}
	b, err := readFile(m.root, name, limit)
	if err != nil {
		return nil, err
	}
	if d := m.Config.Decoder; d != nil {
		return ParseHFTokenizer(b, name, d.Vocab)
	}
	enc := m.Config.Encoder
	if file == TokenizerFile {
		return ParseHFTokenizer(b, name, enc.VocabSize)
	}
	lowercase := enc.Lowercase == nil || *enc.Lowercase
	return ParseTokenizer(bytes.NewReader(b), name, lowercase, enc.VocabSize)
}
