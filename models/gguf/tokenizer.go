package gguf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/stepserve/stepserve/internal/clip"
)

// Tokenizer is the tokenizer a file's metadata describes (the
// tokenizer.ggml.* keys and tokenizer.chat_template).
type Tokenizer struct {
	// Model is tokenizer.ggml.model: "gpt2" (byte-level BPE by merges)
	// or "llama" (SentencePiece BPE by scores, with byte fallback).
	Model string
	// Pre is tokenizer.ggml.pre, the pre-tokenizer of a gpt2 model
	// ("default" when absent).
	Pre string
	// Tokens, Types and Scores are indexed by id; Types holds
	// TokenNormal..TokenByte (TokenNormal for every id when the file has
	// no token_type); Scores is nil for a gpt2 model.
	Tokens []string
	Types  []int32
	Scores []float32
	// Merges are a gpt2 model's merges, "left right", highest priority
	// first.
	Merges []string
	// BOS, EOS, PAD and UNK are the special tokens' ids; -1 when the file
	// names none.
	BOS, EOS, PAD, UNK int
	// AddBOS and AddEOS say encoding a text frames it with them.
	AddBOS, AddEOS bool
	// AddSpacePrefix says a llama model prefixes a text with a space
	// (tokenizer.ggml.add_space_prefix, true unless set false).
	AddSpacePrefix bool
	// ChatTemplate is tokenizer.chat_template; "" when absent.
	ChatTemplate string
}

// maxTokens bounds the vocabulary, as models bounds a decoder's.
const maxTokens = maxVocab

// maxMergeWork bounds the bytes spmMerges hashes (the squares of the
// tokens' lengths, summed): about a second.
const maxMergeWork = 1 << 30

// ReadTokenizer reads the tokenizer f's metadata describes. A vocabulary
// whose lists disagree in length, or a special id outside it, is an error
// wrapping ErrMalformed; a model or pre-tokenizer this package cannot
// express as tokenizer.json one wrapping ErrUnsupported.
func ReadTokenizer(f *File) (*Tokenizer, error) {
	t := &Tokenizer{BOS: -1, EOS: -1, PAD: -1, UNK: -1, Pre: "default", AddSpacePrefix: true}
	var ok bool
	var err error
	if t.Model, ok, err = f.String("tokenizer.ggml.model"); err != nil {
		return nil, err
	} else if !ok {
		return nil, fmt.Errorf("%w: metadata \"tokenizer.ggml.model\" is missing: the file has no tokenizer", ErrMalformed)
	}
	if t.Model != "gpt2" && t.Model != "llama" {
		return nil, fmt.Errorf("%w: tokenizer.ggml.model %q; want gpt2 (byte-level BPE) or llama (SentencePiece)", ErrUnsupported, clip.Clip(t.Model, maxErrName))
	}
	if t.Tokens, ok, err = f.Strings("tokenizer.ggml.tokens"); err != nil {
		return nil, err
	} else if !ok || len(t.Tokens) == 0 {
		return nil, fmt.Errorf("%w: metadata \"tokenizer.ggml.tokens\" is missing or empty", ErrMalformed)
	}
	n := len(t.Tokens)
	if n > maxTokens {
		return nil, fmt.Errorf("%w: %d tokens; want at most %d", ErrMalformed, n, maxTokens)
	}
	if types, ok, err := f.Ints("tokenizer.ggml.token_type"); err != nil {
		return nil, err
	} else if ok {
		if len(types) != n {
			return nil, fmt.Errorf("%w: tokenizer.ggml.token_type has %d entries for %d tokens", ErrMalformed, len(types), n)
		}
		t.Types = make([]int32, n)
		for i, v := range types {
			if v < TokenNormal || v > TokenByte {
				return nil, fmt.Errorf("%w: tokenizer.ggml.token_type[%d] is %d; want 1..6", ErrMalformed, i, v)
			}
			t.Types[i] = int32(v)
		}
	} else {
		t.Types = slices.Repeat([]int32{TokenNormal}, n)
	}
	if t.Model == "llama" {
		if t.Scores, ok, err = f.Float32s("tokenizer.ggml.scores"); err != nil {
			return nil, err
		} else if !ok || len(t.Scores) != n {
			return nil, fmt.Errorf("%w: a llama (SentencePiece) tokenizer needs tokenizer.ggml.scores, one for each of the %d tokens (has %d)", ErrMalformed, n, len(t.Scores))
		}
		t.AddBOS = true
	} else {
		if t.Merges, ok, err = f.Strings("tokenizer.ggml.merges"); err != nil {
			return nil, err
		} else if !ok {
			return nil, fmt.Errorf("%w: a gpt2 (BPE) tokenizer needs tokenizer.ggml.merges", ErrMalformed)
		}
		for i, m := range t.Merges {
			if l, r, ok := strings.Cut(m, " "); !ok || l == "" || r == "" || strings.Contains(r, " ") {
				return nil, fmt.Errorf("%w: tokenizer.ggml.merges[%d] is %q; want two tokens joined by one space", ErrMalformed, i, clip.Clip(m, maxErrName))
			}
		}
		if pre, ok, err := f.String("tokenizer.ggml.pre"); err != nil {
			return nil, err
		} else if ok {
			t.Pre = pre
		}
		if _, ok := preTokenizers[t.Pre]; !ok {
			return nil, fmt.Errorf("%w: tokenizer.ggml.pre %q; stepserve knows %s", ErrUnsupported, clip.Clip(t.Pre, maxErrName), strings.Join(knownPre(), ", "))
		}
		t.AddBOS = t.Pre == "llama3" || t.Pre == "llama-bpe"
	}
	for _, s := range []struct {
		key string
		dst *int
	}{{"bos_token_id", &t.BOS}, {"eos_token_id", &t.EOS}, {"padding_token_id", &t.PAD}, {"unknown_token_id", &t.UNK}} {
		v, ok, err := f.Uint("tokenizer.ggml." + s.key)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if v >= uint64(n) {
			return nil, fmt.Errorf("%w: tokenizer.ggml.%s is %d; the vocabulary has %d tokens", ErrMalformed, s.key, v, n)
		}
		*s.dst = int(v)
	}
	for _, b := range []struct {
		key string
		dst *bool
	}{{"add_bos_token", &t.AddBOS}, {"add_eos_token", &t.AddEOS}, {"add_space_prefix", &t.AddSpacePrefix}} {
		v, ok, err := f.Bool("tokenizer.ggml." + b.key)
		if err != nil {
			return nil, err
		}
		if ok {
			*b.dst = v
		}
	}
	if t.AddBOS && t.BOS < 0 {
		return nil, fmt.Errorf("%w: tokenizer.ggml.add_bos_token is set but no bos_token_id says which", ErrMalformed)
	}
	if t.AddEOS && t.EOS < 0 {
		return nil, fmt.Errorf("%w: tokenizer.ggml.add_eos_token is set but no eos_token_id says which", ErrMalformed)
	}
	if t.ChatTemplate, _, err = f.String("tokenizer.chat_template"); err != nil {
		return nil, err
	}
	return t, nil
}

// The pre-tokenizers' regexes, as llama.cpp's llama-vocab.cpp and the
// models' own tokenizer.json files spell them.
const (
	gpt2Regex   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	llama3Regex = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2Regex  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

func split(regex string) jobj {
	return jobj{"type": "Split", "pattern": jobj{"Regex": regex}, "behavior": "Isolated", "invert": false}
}

func byteLevel(trimOffsets, useRegex bool) jobj {
	return jobj{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": trimOffsets, "use_regex": useRegex}
}

// preTokenizers are the tokenizer.json pre-tokenizers of the
// tokenizer.ggml.pre values known here, with the normalizer and
// ignore_merges the model's own tokenizer.json has.
var preTokenizers = map[string]struct {
	pre          jobj
	normalizer   jobj
	ignoreMerges bool
}{
	// GPT-2's own: ByteLevel's regex is GPT-2's.
	"gpt2": {pre: byteLevel(true, true)},
	// llama.cpp's default for a BPE vocabulary without a pre: runs of
	// punctuation first, then GPT-2's pattern, then digit runs, then
	// threes of ASCII digits, each splitting what the one before left.
	"default": {pre: jobj{"type": "Sequence", "pretokenizers": []any{
		split(`[\p{P}\$\+<=>\^~\|]+`), split(gpt2Regex), split(`\p{N}+`), split(`[0-9][0-9][0-9]`), byteLevel(true, false)}}},
	"llama3":    {pre: jobj{"type": "Sequence", "pretokenizers": []any{split(llama3Regex), byteLevel(true, false)}}, ignoreMerges: true},
	"llama-bpe": {pre: jobj{"type": "Sequence", "pretokenizers": []any{split(llama3Regex), byteLevel(true, false)}}, ignoreMerges: true},
	"qwen2": {pre: jobj{"type": "Sequence", "pretokenizers": []any{split(qwen2Regex), byteLevel(false, false)}},
		normalizer: jobj{"type": "NFC"}},
}

func knownPre() []string {
	var out []string
	for k := range preTokenizers {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// jobj is a JSON object whose keys encoding/json writes sorted, so the
// document is the same bytes every time.
type jobj = map[string]any

// HFJSON is a Hugging Face tokenizer.json equivalent to t: the same ids
// for the same text. A gpt2 model is BPE over byte-level tokens with its
// merges and pre-tokenizer; a llama model is BPE with byte fallback whose
// merges are made from the scores as transformers' converter makes them
// (every split of a token into two tokens, ranked by the whole token's
// score), with SentencePiece's space handling (▁, a prefix space).
// Control, user-defined and unknown tokens are added tokens, matched in
// text before the model runs; control and unknown ones are special.
func (t *Tokenizer) HFJSON() ([]byte, error) {
	vocab := make(map[string]int, len(t.Tokens))
	for i, tok := range t.Tokens {
		if _, dup := vocab[tok]; !dup { // the first id of a repeated token, as llama.cpp's lookup
			vocab[tok] = i
		}
	}
	var added []any
	for i, tok := range t.Tokens {
		typ := t.Types[i]
		if typ != TokenControl && typ != TokenUserDefined && typ != TokenUnknown || tok == "" {
			continue
		}
		added = append(added, jobj{"id": i, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
			"normalized": false, "special": typ != TokenUserDefined})
	}
	doc := jobj{"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": added}
	model := jobj{"type": "BPE", "dropout": nil, "continuing_subword_prefix": nil, "end_of_word_suffix": nil, "vocab": vocab}
	switch t.Model {
	case "gpt2":
		p := preTokenizers[t.Pre]
		model["merges"] = t.Merges
		model["unk_token"] = nil
		model["fuse_unk"] = false
		model["byte_fallback"] = false
		model["ignore_merges"] = p.ignoreMerges
		doc["pre_tokenizer"] = p.pre
		doc["normalizer"] = p.normalizer
		doc["decoder"] = jobj{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}
	case "llama":
		merges, err := spmMerges(t.Tokens, t.Scores, t.Types, vocab)
		if err != nil {
			return nil, err
		}
		model["merges"] = merges
		model["unk_token"] = nil
		if t.UNK >= 0 {
			model["unk_token"] = t.Tokens[t.UNK]
		}
		model["fuse_unk"] = true
		model["byte_fallback"] = true
		model["ignore_merges"] = false
		var norm []any
		decoders := []any{jobj{"type": "Replace", "pattern": jobj{"String": "▁"}, "content": " "},
			jobj{"type": "ByteFallback"}, jobj{"type": "Fuse"}}
		if t.AddSpacePrefix {
			norm = append(norm, jobj{"type": "Prepend", "prepend": "▁"})
			decoders = append(decoders, jobj{"type": "Strip", "content": " ", "start": 1, "stop": 0})
		}
		norm = append(norm, jobj{"type": "Replace", "pattern": jobj{"String": " "}, "content": "▁"})
		doc["normalizer"] = jobj{"type": "Sequence", "normalizers": norm}
		doc["pre_tokenizer"] = nil
		doc["decoder"] = jobj{"type": "Sequence", "decoders": decoders}
	default:
		return nil, fmt.Errorf("%w: tokenizer model %q", ErrUnsupported, clip.Clip(t.Model, maxErrName))
	}
	doc["model"] = model
	doc["post_processor"] = t.postProcessor()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("gguf: tokenizer.json: %w", err)
	}
	return b.Bytes(), nil
}

// postProcessor frames a text with BOS and EOS as add_bos_token and
// add_eos_token say (a pair as llama's tokenizer.json does: each text
// framed); nil when neither is added.
func (t *Tokenizer) postProcessor() any {
	if !t.AddBOS && !t.AddEOS {
		return nil
	}
	var single, pair []any
	special := jobj{}
	tok := func(id int, typeID int) jobj {
		name := t.Tokens[id]
		special[name] = jobj{"id": name, "ids": []int{id}, "tokens": []string{name}}
		return jobj{"SpecialToken": jobj{"id": name, "type_id": typeID}}
	}
	for _, seq := range []struct {
		id     string
		typeID int
	}{{"A", 0}, {"B", 1}} {
		var items []any
		if t.AddBOS {
			items = append(items, tok(t.BOS, seq.typeID))
		}
		items = append(items, jobj{"Sequence": jobj{"id": seq.id, "type_id": seq.typeID}})
		if t.AddEOS {
			items = append(items, tok(t.EOS, seq.typeID))
		}
		if seq.id == "A" {
			single = items
		}
		pair = append(pair, items...)
	}
	return jobj{"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special}
}

// spmMerges makes a BPE merge list that reproduces SentencePiece's BPE by
// scores, as transformers' SentencePieceExtractor does: for every token,
// every split into a left and right token that are both in the
// vocabulary is a merge; merges rank by the whole token's score, highest
// first, ties kept in id order, and within one token by the ids of its
// left then right part. Byte tokens (<0x41>) and control tokens are left
// out: SentencePiece never merges into them.
func spmMerges(tokens []string, scores []float32, types []int32, vocab map[string]int) ([]string, error) {
	// Every split of a token is two lookups hashing the token's bytes:
	// L² a token. A real vocabulary's tokens are short (Llama 2's sum to
	// under 10^6); a file whose sum passes the budget is refused rather
	// than left to run for hours.
	var work int64
	for id, tok := range tokens {
		if types[id] == TokenNormal || types[id] == TokenUserDefined {
			work += int64(len(tok)) * int64(len(tok))
		}
	}
	if work > maxMergeWork {
		return nil, fmt.Errorf("%w: the SentencePiece vocabulary's tokens are too long to build its merges from (the squares of their lengths sum to %d; at most %d)",
			ErrMalformed, work, int64(maxMergeWork))
	}
	type merge struct {
		l, r   string
		li, ri int
		score  float32
		id     int
	}
	var ms []merge
	for id, tok := range tokens {
		if types[id] != TokenNormal && types[id] != TokenUserDefined {
			continue
		}
		if strings.Contains(tok, " ") {
			continue // a merge cannot say a token with a space
		}
		var local []merge
		for i := range tok {
			if i == 0 {
				continue
			}
			l, r := tok[:i], tok[i:]
			li, lok := vocab[l]
			ri, rok := vocab[r]
			if lok && rok && spmPiece(types[li]) && spmPiece(types[ri]) {
				local = append(local, merge{l, r, li, ri, scores[id], id})
			}
		}
		slices.SortFunc(local, func(a, b merge) int {
			if a.li != b.li {
				return a.li - b.li
			}
			return a.ri - b.ri
		})
		ms = append(ms, local...)
	}
	slices.SortStableFunc(ms, func(a, b merge) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		}
		return 0
	})
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.l + " " + m.r
	}
	return out, nil
}

// spmPiece says a token of this type can be one side of a merge.
func spmPiece(typ int32) bool {
	return typ == TokenNormal || typ == TokenUserDefined || typ == TokenUnused
}
