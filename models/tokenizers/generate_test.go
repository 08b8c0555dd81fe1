package tokenizers

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"golang.org/x/text/unicode/norm"
)

//go:generate go test -run TestGeneratedFilesAreCurrent -update

var update = flag.Bool("update", false, "rewrite the generated tokenizer files under models/testdata/tokenizers")

// testdata is where the generated tokenizer files and their corpus live.
const testdata = "../testdata/tokenizers"

// generated are the test tokenizer files, by name, built from the corpus.
var generated = map[string]func(corpus string) any{
	"wordpiece.json": genWordPiece,
	"unigram.json":   genUnigram,
	"bpe.json":       genBPE,
	// Llama 2 and Mistral's kind: SentencePiece BPE over ▁-joined text,
	// bytes the vocabulary lacks as <0xXX> tokens (byte_fallback).
	"bytefallback.json": genByteFallback,
	// Llama 3's and Qwen2's kind: byte-level BPE after a Split by their
	// regexes (digits in threes, or one by one).
	"llama3.json": func(corpus string) any { return genSplitBPE(corpus, llama3Pattern, true) },
	"qwen2.json":  func(corpus string) any { return genSplitBPE(corpus, qwen2Pattern, false) },
}

// TestGeneratedFilesAreCurrent regenerates each test tokenizer file from
// the corpus and holds it to the committed bytes; -update rewrites them.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	corpus, err := os.ReadFile(filepath.Join(testdata, "corpus.txt"))
	require.NoError(t, err)
	for name, gen := range generated {
		got := encodeJSON(t, gen(string(corpus)))
		path := filepath.Join(testdata, name)
		if *update {
			require.NoError(t, os.WriteFile(path, got, 0o644))
			continue
		}
		want, err := os.ReadFile(path)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got), "%s differs from what the generator writes; run go generate ./models/tokenizers", name)
		_, err = Parse(got)
		require.NoError(t, err, name)
	}
}

func encodeJSON(t *testing.T, v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	require.NoError(t, enc.Encode(v))
	return b.Bytes()
}

// orderedVocab is a token: id object written in id order.
type orderedVocab []string

func (v orderedVocab) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, tok := range v {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(tok)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteString(":")
		b.WriteString(strings.TrimSpace(string(must(json.Marshal(i)))))
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

type obj = map[string]any

func added(id int, content string, special, lstrip bool) obj {
	return obj{"id": id, "content": content, "single_word": false, "lstrip": lstrip, "rstrip": false, "normalized": !special, "special": special}
}

// words pre-tokenizes the corpus as a tokenizer's own stages would.
func words(corpus string, n normalizer, p preTokenizer) []string {
	t := newText(corpus, 0)
	if n != nil {
		t = n.normalize(t)
	}
	var out []string
	for _, w := range p.preTokenize([]text{t}) {
		out = append(out, string(w.s))
	}
	return out
}

// counted is strings by how often they occur, most first, ties in
// byte order.
func counted(counts map[string]int) []string {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if counts[a] != counts[b] {
			return counts[b] - counts[a]
		}
		return strings.Compare(a, b)
	})
	return keys
}

// genWordPiece is an uncased BERT tokenizer: the special tokens, every
// character alone and as a continuation, words seen twice, and frequent
// prefixes and suffixes.
func genWordPiece(corpus string) any {
	ws := words(corpus, bertNormalizer{clean: true, chinese: true, strip: true, lower: true}, bertPreTokenizer{})
	vocab := orderedVocab{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
	seen := map[string]bool{}
	addTok := func(s string) {
		if !seen[s] {
			seen[s] = true
			vocab = append(vocab, s)
		}
	}
	for _, s := range vocab {
		seen[s] = true
	}
	chars := map[string]int{}
	wordCounts := map[string]int{}
	affixes := map[string]int{}
	for _, w := range ws {
		wordCounts[w]++
		r := []rune(w)
		for _, c := range r {
			chars[string(c)]++
		}
		for n := 2; n <= 4 && n < len(r); n++ {
			affixes[string(r[:n])]++
			affixes["##"+string(r[len(r)-n:])]++
		}
	}
	for _, c := range counted(chars) {
		addTok(c)
		addTok("##" + c)
	}
	for _, w := range counted(wordCounts) {
		if wordCounts[w] >= 2 {
			addTok(w)
		}
	}
	for _, a := range counted(affixes) {
		if affixes[a] >= 3 {
			addTok(a)
		}
	}
	return obj{
		"version":    "1.0",
		"truncation": nil,
		"padding":    nil,
		"added_tokens": []obj{
			added(0, "[PAD]", true, false), added(1, "[UNK]", true, false), added(2, "[CLS]", true, false),
			added(3, "[SEP]", true, false), added(4, "[MASK]", true, false),
		},
		"normalizer":    obj{"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": nil, "lowercase": true},
		"pre_tokenizer": obj{"type": "BertPreTokenizer"},
		"post_processor": obj{
			"type": "TemplateProcessing",
			"single": []obj{
				{"SpecialToken": obj{"id": "[CLS]", "type_id": 0}}, {"Sequence": obj{"id": "A", "type_id": 0}}, {"SpecialToken": obj{"id": "[SEP]", "type_id": 0}},
			},
			"pair": []obj{
				{"SpecialToken": obj{"id": "[CLS]", "type_id": 0}}, {"Sequence": obj{"id": "A", "type_id": 0}}, {"SpecialToken": obj{"id": "[SEP]", "type_id": 0}},
				{"Sequence": obj{"id": "B", "type_id": 1}}, {"SpecialToken": obj{"id": "[SEP]", "type_id": 1}},
			},
			"special_tokens": obj{
				"[CLS]": obj{"id": "[CLS]", "ids": []int{2}, "tokens": []string{"[CLS]"}},
				"[SEP]": obj{"id": "[SEP]", "ids": []int{3}, "tokens": []string{"[SEP]"}},
			},
		},
		"decoder": obj{"type": "WordPiece", "prefix": "##", "cleanup": true},
		"model": obj{"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
			"max_input_chars_per_word": 100, "vocab": vocab},
	}
}

// genUnigram is an XLM-R-like SentencePiece tokenizer (NFKC in place of
// the precompiled charsmap): every character of the corpus, and its
// frequent substrings of words, scored by their log frequency.
func genUnigram(corpus string) any {
	n := sequenceNormalizer{unicodeForm{norm.NFKC}, replace{must(compilePattern(patternConfig{Regex: ptr(" {2,}")})), " "}}
	ws := words(corpus, n, metaspace{replacement: "▁", prepend: "always", split: true})
	counts := map[string]int{}
	total := 0
	for _, w := range ws {
		r := []rune(w)
		for i := range r {
			for j := i + 1; j <= len(r) && j-i <= 8; j++ {
				counts[string(r[i:j])]++
				total++
			}
		}
	}
	var pieces []string
	for _, p := range counted(counts) {
		if utf8.RuneCountInString(p) == 1 || counts[p] >= 3 {
			pieces = append(pieces, p)
		}
	}
	score := func(p string) float64 {
		return math.Round(math.Log(float64(counts[p])/float64(total))*1e4) / 1e4
	}
	vocab := []any{[]any{"<s>", 0.0}, []any{"<pad>", 0.0}, []any{"</s>", 0.0}, []any{"<unk>", 0.0}}
	for _, p := range pieces {
		vocab = append(vocab, []any{p, score(p)})
	}
	mask := len(vocab)
	vocab = append(vocab, []any{"<mask>", 0.0})
	return obj{
		"version":    "1.0",
		"truncation": nil,
		"padding":    nil,
		"added_tokens": []obj{
			added(0, "<s>", true, false), added(1, "<pad>", true, false), added(2, "</s>", true, false),
			added(3, "<unk>", true, false), added(mask, "<mask>", true, true),
		},
		"normalizer": obj{"type": "Sequence", "normalizers": []obj{
			{"type": "NFKC"},
			{"type": "Replace", "pattern": obj{"Regex": " {2,}"}, "content": " "},
		}},
		"pre_tokenizer": obj{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
		"post_processor": obj{
			"type": "TemplateProcessing",
			"single": []obj{
				{"SpecialToken": obj{"id": "<s>", "type_id": 0}}, {"Sequence": obj{"id": "A", "type_id": 0}}, {"SpecialToken": obj{"id": "</s>", "type_id": 0}},
			},
			"pair": []obj{
				{"SpecialToken": obj{"id": "<s>", "type_id": 0}}, {"Sequence": obj{"id": "A", "type_id": 0}}, {"SpecialToken": obj{"id": "</s>", "type_id": 0}},
				{"SpecialToken": obj{"id": "</s>", "type_id": 0}}, {"Sequence": obj{"id": "B", "type_id": 0}}, {"SpecialToken": obj{"id": "</s>", "type_id": 0}},
			},
			"special_tokens": obj{
				"<s>":  obj{"id": "<s>", "ids": []int{0}, "tokens": []string{"<s>"}},
				"</s>": obj{"id": "</s>", "ids": []int{2}, "tokens": []string{"</s>"}},
			},
		},
		"decoder": obj{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
		"model":   obj{"type": "Unigram", "unk_id": 3, "byte_fallback": false, "vocab": vocab},
	}
}

func ptr[T any](v T) *T { return &v }

// genBPE is a RoBERTa-like byte-level BPE: the 256 byte characters and
// merges learned from the corpus, most frequent pair first (ties in byte
// order).
func genBPE(corpus string) any {
	ws := words(corpus, nil, byteLevelPre{prefixSpace: false, regex: true})
	wordCounts := map[string]int{}
	for _, w := range ws {
		wordCounts[w]++
	}
	vocab := orderedVocab{"<s>", "<pad>", "</s>", "<unk>"}
	for b := range 256 {
		vocab = append(vocab, string(byteChars[b]))
	}
	vocab, merges := learnMerges(wordCounts, vocab, 600)
	mask := len(vocab)
	vocab = append(vocab, "<mask>")
	return obj{
		"version":    "1.0",
		"truncation": nil,
		"padding":    nil,
		"added_tokens": []obj{
			added(0, "<s>", true, false), added(1, "<pad>", true, false), added(2, "</s>", true, false),
			added(3, "<unk>", true, false), added(mask, "<mask>", true, true),
		},
		"normalizer":     nil,
		"pre_tokenizer":  obj{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"post_processor": obj{"type": "RobertaProcessing", "sep": []any{"</s>", 2}, "cls": []any{"<s>", 0}, "trim_offsets": true, "add_prefix_space": false},
		"decoder":        obj{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": obj{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": "", "end_of_word_suffix": "",
			"fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges},
	}
}

// genSplitBPE is genBPE's vocabulary behind Llama 3's pre-tokenizer: a
// Split by pattern (isolated), then ByteLevel without its own regex; a
// word in the vocabulary is one token with ignoreMerges (Llama 3's).
func genSplitBPE(corpus, pattern string, ignoreMerges bool) any {
	doc := genBPE(corpus).(obj)
	doc["model"].(obj)["ignore_merges"] = ignoreMerges
	doc["pre_tokenizer"] = obj{"type": "Sequence", "pretokenizers": []any{
		obj{"type": "Split", "pattern": obj{"Regex": pattern}, "behavior": "Isolated", "invert": false},
		obj{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
	}}
	// Llama 3's: the begin-of-text token first, each text after it.
	bos := obj{"SpecialToken": obj{"id": "<s>", "type_id": 0}}
	doc["post_processor"] = obj{"type": "TemplateProcessing",
		"single":         []any{bos, obj{"Sequence": obj{"id": "A", "type_id": 0}}},
		"pair":           []any{bos, obj{"Sequence": obj{"id": "A", "type_id": 0}}, bos, obj{"Sequence": obj{"id": "B", "type_id": 1}}},
		"special_tokens": obj{"<s>": obj{"id": "<s>", "ids": []int{0}, "tokens": []string{"<s>"}}}}
	return doc
}

// genByteFallback is a Llama-2-like SentencePiece BPE: the text's spaces
// are ▁ (with one before it), no pre-tokenizer, the printable ASCII
// characters and merges learned from the corpus's ASCII words, and
// <0x00>..<0xFF> for every other byte; decoded by Replace, ByteFallback,
// Fuse and Strip, as Llama 2's tokenizer.json decodes.
func genByteFallback(corpus string) any {
	counts := map[string]int{}
	for _, w := range strings.Fields(corpus) {
		ascii := true
		for _, r := range w {
			ascii = ascii && r > ' ' && r <= '~'
		}
		if ascii {
			counts["▁"+w]++
		}
	}
	vocab := orderedVocab{"<unk>", "<s>", "</s>"}
	for b := range 256 {
		vocab = append(vocab, fmt.Sprintf("<0x%02X>", b))
	}
	vocab = append(vocab, "▁")
	for c := '!'; c <= '~'; c++ {
		vocab = append(vocab, string(c))
	}
	vocab, merges := learnMerges(counts, vocab, 400)
	return obj{
		"version":    "1.0",
		"truncation": nil,
		"padding":    nil,
		"added_tokens": []obj{
			added(0, "<unk>", true, false), added(1, "<s>", true, false), added(2, "</s>", true, false),
		},
		"normalizer": obj{"type": "Sequence", "normalizers": []obj{
			{"type": "Prepend", "prepend": "▁"},
			{"type": "Replace", "pattern": obj{"String": " "}, "content": "▁"},
		}},
		"pre_tokenizer": nil,
		"post_processor": obj{
			"type":   "TemplateProcessing",
			"single": []obj{{"SpecialToken": obj{"id": "<s>", "type_id": 0}}, {"Sequence": obj{"id": "A", "type_id": 0}}},
			"pair": []obj{
				{"SpecialToken": obj{"id": "<s>", "type_id": 0}}, {"Sequence": obj{"id": "A", "type_id": 0}},
				{"SpecialToken": obj{"id": "<s>", "type_id": 1}}, {"Sequence": obj{"id": "B", "type_id": 1}},
			},
			"special_tokens": obj{"<s>": obj{"id": "<s>", "ids": []int{1}, "tokens": []string{"<s>"}}},
		},
		"decoder": obj{"type": "Sequence", "decoders": []obj{
			{"type": "Replace", "pattern": obj{"String": "▁"}, "content": " "},
			{"type": "ByteFallback"},
			{"type": "Fuse"},
			{"type": "Strip", "content": " ", "start": 1, "stop": 0},
		}},
		"model": obj{"type": "BPE", "dropout": nil, "unk_token": "<unk>", "continuing_subword_prefix": nil, "end_of_word_suffix": nil,
			"fuse_unk": true, "byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": merges},
	}
}

// learnMerges learns up to limit BPE merges from words and their counts
// (each word split into its characters), the most frequent pair first,
// ties in byte order, until no pair occurs twice. It returns vocab with
// each merged token added once, and the merges as "a b".
func learnMerges(counts map[string]int, vocab orderedVocab, limit int) (orderedVocab, []string) {
	type word struct {
		syms  []string
		count int
	}
	var list []word
	for _, w := range counted(counts) {
		var syms []string
		for _, r := range w {
			syms = append(syms, string(r))
		}
		list = append(list, word{syms, counts[w]})
	}
	var merges []string
	for len(merges) < limit {
		pairs := map[[2]string]int{}
		for _, w := range list {
			for i := 0; i+1 < len(w.syms); i++ {
				pairs[[2]string{w.syms[i], w.syms[i+1]}] += w.count
			}
		}
		var best [2]string
		bestN := 0
		for p, n := range pairs {
			if n > bestN || n == bestN && (p[0] < best[0] || p[0] == best[0] && p[1] < best[1]) {
				best, bestN = p, n
			}
		}
		if bestN < 2 {
			break
		}
		merges = append(merges, best[0]+" "+best[1])
		if !slices.Contains(vocab, best[0]+best[1]) {
			vocab = append(vocab, best[0]+best[1])
		}
		for k, w := range list {
			var syms []string
			for i := 0; i < len(w.syms); i++ {
				if i+1 < len(w.syms) && w.syms[i] == best[0] && w.syms[i+1] == best[1] {
					syms = append(syms, best[0]+best[1])
					i++
				} else {
					syms = append(syms, w.syms[i])
				}
			}
			list[k].syms = syms
		}
	}
	return vocab, merges
}
