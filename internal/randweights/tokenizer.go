package randweights

import (
	"encoding/json"
	"fmt"
)

// ByteLevelTokenizer is a tokenizer.json of exactly vocab ids for a
// random decoder, shaped like GPT-2's and SmolLM's: three special tokens
// (<|endoftext|> 0, <|im_start|> 1, <|im_end|> 2), the 256 byte-level
// characters, then merges of earlier tokens up to vocab. Every id then
// decodes to something, as a real model's do, so a server streams each
// generated token's text.
func ByteLevelTokenizer(vocab int) ([]byte, error) {
	if vocab < 3+256 {
		return nil, fmt.Errorf("randweights: a byte-level vocabulary needs at least 259 ids, not %d", vocab)
	}
	// GPT-2's bytes_to_unicode: printable bytes stand for themselves,
	// the others for 256 onwards.
	var chars [256]rune
	n := 0
	for b := range 256 {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			chars[b] = rune(b)
		} else {
			chars[b] = rune(256 + n)
			n++
		}
	}
	ids := map[string]int{}
	var tokens []string
	add := func(t string) {
		ids[t] = len(tokens) + 3
		tokens = append(tokens, t)
	}
	for _, c := range chars {
		add(string(c))
	}
	// Merges: the space onto each letter, then each merged token in turn
	// onto each letter (breadth first: every new token is a new string).
	var merges []string
	merge := func(left, right string) {
		merges = append(merges, left+" "+right)
		add(left + right)
	}
	for c := 'a'; c <= 'z' && len(tokens)+3 < vocab; c++ {
		merge("\u0120", string(c)) // Ġ is the byte-level space
	}
	for i := 256; len(tokens)+3 < vocab; i++ {
		for c := 'a'; c <= 'z' && len(tokens)+3 < vocab; c++ {
			merge(tokens[i], string(c))
		}
	}
	vocabMap := map[string]int{"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
	for t, id := range ids {
		vocabMap[t] = id
	}
	special := func(id int, s string) map[string]any {
		return map[string]any{"id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
	}
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
	return json.Marshal(map[string]any{
		"version":        "1.0",
		"added_tokens":   []any{special(0, "<|endoftext|>"), special(1, "<|im_start|>"), special(2, "<|im_end|>")},
		"normalizer":     nil,
		"pre_tokenizer":  byteLevel,
		"post_processor": nil,
		"decoder":        byteLevel,
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": vocabMap, "merges": merges},
	})
}
