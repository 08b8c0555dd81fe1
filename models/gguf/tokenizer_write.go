package gguf

import (
	"encoding/json"
	"fmt"
	"strings"
)

// WriteHFTokenizer writes a byte-level BPE tokenizer.json (the model BPE,
// no normalizer, and GPT-2's pre-tokenizer, or Llama 3's or Qwen2's: a
// Split by their regex before ByteLevel) into w's metadata as llama.cpp's
// converter writes a gpt2 vocabulary (tokenizer.ggml.pre gpt2, llama-bpe
// or qwen2): tokens by id, their types (added special tokens as control,
// other added ones user-defined), merges in priority order, the special
// ids and the chat template ("" for none). bos < 0 names none. Other
// tokenizer.json kinds are refused: they do not round-trip through GGUF's
// gpt2 model.
func (w *Writer) WriteHFTokenizer(tokenizerJSON []byte, chatTemplate string, bos, eos int, addBOS bool) error {
	var doc struct {
		Normalizer   json.RawMessage `json:"normalizer"`
		PreTokenizer json.RawMessage `json:"pre_tokenizer"`
		Model        struct {
			Type   string            `json:"type"`
			Vocab  map[string]int    `json:"vocab"`
			Merges []json.RawMessage `json:"merges"`
		} `json:"model"`
		Added []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
	}
	if err := json.Unmarshal(tokenizerJSON, &doc); err != nil {
		return fmt.Errorf("gguf: tokenizer.json: %w", err)
	}
	preName := preTokenizerName(doc.PreTokenizer)
	if doc.Model.Type != "BPE" || preName == "" || (len(doc.Normalizer) > 0 && string(doc.Normalizer) != "null") {
		return fmt.Errorf("gguf: tokenizer.json: model %q: only byte-level BPE with GPT-2's, Llama 3's or Qwen2's pre-tokenizer and no normalizer is written",
			doc.Model.Type)
	}
	n := 0
	for _, id := range doc.Model.Vocab {
		n = max(n, id+1)
	}
	for _, a := range doc.Added {
		n = max(n, a.ID+1)
	}
	if n > maxTokens {
		return fmt.Errorf("gguf: tokenizer.json: %d tokens; at most %d", n, maxTokens)
	}
	tokens, types := make([]string, n), make([]int32, n)
	for i := range tokens {
		tokens[i], types[i] = fmt.Sprintf("[PAD%d]", i), TokenUnused
	}
	for tok, id := range doc.Model.Vocab {
		if id < 0 {
			return fmt.Errorf("gguf: tokenizer.json: token %q has id %d", tok, id)
		}
		tokens[id], types[id] = tok, TokenNormal
	}
	for _, a := range doc.Added {
		if a.ID < 0 {
			return fmt.Errorf("gguf: tokenizer.json: added token %q has id %d", a.Content, a.ID)
		}
		tokens[a.ID], types[a.ID] = a.Content, TokenUserDefined
		if a.Special {
			types[a.ID] = TokenControl
		}
	}
	merges := make([]string, 0, len(doc.Model.Merges))
	for _, m := range doc.Model.Merges {
		var s string
		if json.Unmarshal(m, &s) != nil {
			var pair []string
			if err := json.Unmarshal(m, &pair); err != nil || len(pair) != 2 {
				return fmt.Errorf("gguf: tokenizer.json: a merge is neither \"a b\" nor [a, b]")
			}
			s = strings.Join(pair, " ")
		}
		merges = append(merges, s)
	}
	w.String("tokenizer.ggml.model", "gpt2")
	w.String("tokenizer.ggml.pre", preName)
	w.Strings("tokenizer.ggml.tokens", tokens)
	w.Int32s("tokenizer.ggml.token_type", types)
	w.Strings("tokenizer.ggml.merges", merges)
	if bos >= 0 {
		w.Uint32("tokenizer.ggml.bos_token_id", uint32(bos))
	}
	if eos >= 0 {
		w.Uint32("tokenizer.ggml.eos_token_id", uint32(eos))
	}
	w.Bool("tokenizer.ggml.add_bos_token", addBOS)
	if chatTemplate != "" {
		w.String("tokenizer.chat_template", chatTemplate)
	}
	return nil
}

// preTokenizerName is llama.cpp's name of a tokenizer.json's byte-level
// pre-tokenizer: "gpt2" (ByteLevel with its own regex), "llama-bpe" or
// "qwen2" (a Split by their regex, then ByteLevel without one); "" for
// any other.
func preTokenizerName(raw json.RawMessage) string {
	type step struct {
		Type     string `json:"type"`
		UseRegex *bool  `json:"use_regex"`
		Pattern  struct {
			Regex string `json:"Regex"`
		} `json:"pattern"`
		Steps []json.RawMessage `json:"pretokenizers"`
	}
	var p step
	if json.Unmarshal(raw, &p) != nil {
		return ""
	}
	if p.Type == "ByteLevel" && (p.UseRegex == nil || *p.UseRegex) {
		return "gpt2"
	}
	if p.Type != "Sequence" || len(p.Steps) != 2 {
		return ""
	}
	var split, bl step
	if json.Unmarshal(p.Steps[0], &split) != nil || json.Unmarshal(p.Steps[1], &bl) != nil ||
		split.Type != "Split" || bl.Type != "ByteLevel" || bl.UseRegex == nil || *bl.UseRegex {
		return ""
	}
	switch split.Pattern.Regex {
	case llama3Regex:
		return "llama-bpe"
	case qwen2Regex:
		return "qwen2"
	}
	return ""
}
