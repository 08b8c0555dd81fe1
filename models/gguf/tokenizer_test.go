package gguf_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/models/gguf"
)

var corpus = []string{
	"", "Hello, world!", "hello world", "  two  spaces and a trailing space ", "tabs\tand\nnew\n\nlines\r\n",
	"digits 0123456789 and 3.14159, 1,000,000", "don't we'll they're I'm he'd you've it's",
	"unicode: naïve café, Größe, Ελληνικά, русский, 日本語のテキスト、中文。", "emoji 😀👍🏽 and ZWJ 👩‍👩‍👧",
	"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>text after<|endoftext|>", "a<|im_end|>b",
	"punctuation!!! ??? ... --- (brackets) [x] {y}", "MiXeD CaSe WORDS", "\u00a0non-breaking\u2009thin space",
	strings.Repeat("long ", 50),
}

// The shipped tiny-llama tokenizer (byte-level BPE), written into GGUF
// metadata as llama.cpp's converter writes it and read back as a
// tokenizer.json, encodes every text of a varied corpus to the same ids
// and tokens as the original.
func TestTokenizerRoundTripByteLevel(t *testing.T) {
	orig, err := os.ReadFile("../../model_repository/tiny-llama/tokenizer.json")
	require.NoError(t, err)
	var doc struct {
		Model struct {
			Vocab  map[string]int    `json:"vocab"`
			Merges []json.RawMessage `json:"merges"`
		} `json:"model"`
		Added []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
	}
	require.NoError(t, json.Unmarshal(orig, &doc))
	n := 0
	for _, id := range doc.Model.Vocab {
		n = max(n, id+1)
	}
	for _, a := range doc.Added {
		n = max(n, a.ID+1)
	}
	tokens := make([]string, n)
	types := make([]int32, n)
	for tok, id := range doc.Model.Vocab {
		tokens[id], types[id] = tok, gguf.TokenNormal
	}
	for _, a := range doc.Added {
		tokens[a.ID], types[a.ID] = a.Content, gguf.TokenUserDefined
		if a.Special {
			types[a.ID] = gguf.TokenControl
		}
	}
	var merges []string
	for _, m := range doc.Model.Merges {
		var s string
		if json.Unmarshal(m, &s) != nil {
			var pair []string
			require.NoError(t, json.Unmarshal(m, &pair))
			s = strings.Join(pair, " ")
		}
		merges = append(merges, s)
	}
	tmpl := "{% for message in messages %}{{ '<|im_start|>' + message['role'] }}{% endfor %}"
	var w gguf.Writer
	w.String("general.architecture", "llama")
	w.String("tokenizer.ggml.model", "gpt2")
	w.String("tokenizer.ggml.pre", "gpt2")
	w.Strings("tokenizer.ggml.tokens", tokens)
	w.Int32s("tokenizer.ggml.token_type", types)
	w.Strings("tokenizer.ggml.merges", merges)
	w.Uint32("tokenizer.ggml.bos_token_id", 0)
	w.Uint32("tokenizer.ggml.eos_token_id", 2)
	w.Uint32("tokenizer.ggml.padding_token_id", 0)
	w.Bool("tokenizer.ggml.add_bos_token", false)
	w.String("tokenizer.chat_template", tmpl)
	var b bytes.Buffer
	_, err = w.WriteTo(&b)
	require.NoError(t, err)
	f, err := gguf.Parse(bytes.NewReader(b.Bytes()), int64(b.Len()))
	require.NoError(t, err)
	tk, err := gguf.ReadTokenizer(f)
	require.NoError(t, err)
	assert.Equal(t, tmpl, tk.ChatTemplate)
	assert.Equal(t, []int{0, 2, 0, -1}, []int{tk.BOS, tk.EOS, tk.PAD, tk.UNK})
	js, err := tk.HFJSON()
	require.NoError(t, err)

	want, err := models.ParseHFTokenizer(orig, "original", 0)
	require.NoError(t, err)
	got, err := models.ParseHFTokenizer(js, "from gguf", 0)
	require.NoError(t, err)
	for _, text := range corpus {
		for _, special := range []bool{true, false} {
			w, err := want.EncodeIDs(text, special)
			require.NoError(t, err)
			g, err := got.EncodeIDs(text, special)
			require.NoError(t, err)
			assert.Equal(t, w, g, "%q special=%v", text, special)
		}
		w, err := want.Tokenize(text)
		require.NoError(t, err)
		g, err := got.Tokenize(text)
		require.NoError(t, err)
		assert.Equal(t, w, g, "%q", text)
	}
}

// A SentencePiece ("llama") vocabulary by scores becomes BPE merges that
// encode as SentencePiece does: pieces merge highest score first, spaces
// are ▁ with one prefixed, and a character outside the vocabulary falls
// back to its UTF-8 bytes.
func TestTokenizerSentencePiece(t *testing.T) {
	tokens := []string{"<unk>", "<s>", "</s>"}
	types := []int32{gguf.TokenUnknown, gguf.TokenControl, gguf.TokenControl}
	scores := []float32{0, 0, 0}
	for b := range 256 {
		tokens = append(tokens, fmt.Sprintf("<0x%02X>", b))
		types = append(types, gguf.TokenByte)
		scores = append(scores, 0)
	}
	// ids 259..: the pieces, scores falling with id as SentencePiece
	// writes them.
	pieces := []string{"▁", "h", "e", "l", "o", "w", "r", "d", "a", "b", "ll", "▁h", "he", "llo", "▁he", "▁hello", "lo", "or", "▁w", "▁wor", "ld", "▁world", "ab", "é"}
	scored := map[string]float32{"ll": -1, "▁h": -2, "he": -1.5, "llo": -3, "▁he": -4, "▁hello": -5, "lo": -0.5, "or": -6, "▁w": -7, "▁wor": -8, "ld": -9, "▁world": -10, "ab": -11}
	for _, p := range pieces {
		tokens = append(tokens, p)
		types = append(types, gguf.TokenNormal)
		s, ok := scored[p]
		if !ok {
			s = -100 // single characters: never merged into, scores as SentencePiece gives them
		}
		scores = append(scores, s)
	}
	id := func(p string) int64 {
		for i, tok := range tokens {
			if tok == p {
				return int64(i)
			}
		}
		t.Fatalf("no %q", p)
		return -1
	}
	var w gguf.Writer
	w.String("tokenizer.ggml.model", "llama")
	w.Strings("tokenizer.ggml.tokens", tokens)
	w.Float32s("tokenizer.ggml.scores", scores)
	w.Int32s("tokenizer.ggml.token_type", types)
	w.Uint32("tokenizer.ggml.bos_token_id", 1)
	w.Uint32("tokenizer.ggml.eos_token_id", 2)
	w.Uint32("tokenizer.ggml.unknown_token_id", 0)
	var b bytes.Buffer
	_, err := w.WriteTo(&b)
	require.NoError(t, err)
	f, err := gguf.Parse(bytes.NewReader(b.Bytes()), int64(b.Len()))
	require.NoError(t, err)
	tk, err := gguf.ReadTokenizer(f)
	require.NoError(t, err)
	assert.True(t, tk.AddBOS, "a llama vocabulary adds BOS unless told")
	js, err := tk.HFJSON()
	require.NoError(t, err)
	h, err := models.ParseHFTokenizer(js, "spm", len(tokens))
	require.NoError(t, err)
	for _, c := range []struct {
		text string
		want []string
	}{
		// ▁ h e l l o: lo (-0.5) merges first, then he (-1.5), then
		// l+lo = llo (-3), ▁+he = ▁he (-4), ▁he+llo = ▁hello (-5).
		{"hello", []string{"<s>", "▁hello"}},
		// ▁ h e l l: ll (-1), he (-1.5), ▁he (-4); "▁hell" is no piece.
		{"hell", []string{"<s>", "▁he", "ll"}},
		// ▁ w o r l d: or -6 -> ▁ w or l d; ▁w -7 -> ▁w or l d; ▁wor -8;
		// ld -9 -> ▁wor ld; "▁world" needs ▁wor+ld: -10.
		{"world", []string{"<s>", "▁world"}},
		// A space is ▁ and the prefix space is one ▁: "▁▁" is not a piece.
		{" ab", []string{"<s>", "▁", "▁", "ab"}},
		// é is a piece; ü is not: its two UTF-8 bytes.
		{"éü", []string{"<s>", "▁", "é", "<0xC3>", "<0xBC>"}},
		{"</s>a", []string{"<s>", "</s>", "▁", "a"}},
	} {
		var want []int32
		for _, p := range c.want {
			want = append(want, int32(id(p)))
		}
		got, err := h.EncodeIDs(c.text, true)
		require.NoError(t, err)
		assert.Equal(t, want, got, "%q", c.text)
	}
}

// Refusals: no tokenizer, an unknown pre-tokenizer, lists of different
// lengths, a special id outside the vocabulary.
func TestTokenizerRefusals(t *testing.T) {
	for _, c := range []struct {
		set  func(w *gguf.Writer)
		want string
	}{
		{func(w *gguf.Writer) {}, `"tokenizer.ggml.model" is missing`},
		{func(w *gguf.Writer) {
			w.String("tokenizer.ggml.model", "gpt2")
			w.Strings("tokenizer.ggml.tokens", []string{"a"})
			w.Strings("tokenizer.ggml.merges", nil)
			w.String("tokenizer.ggml.pre", "made-up")
		}, `tokenizer.ggml.pre "made-up"; stepserve knows`},
		{func(w *gguf.Writer) {
			w.String("tokenizer.ggml.model", "gpt2")
			w.Strings("tokenizer.ggml.tokens", []string{"a"})
			w.Strings("tokenizer.ggml.merges", []string{"ab"})
		}, `merges[0] is "ab"`},
		{func(w *gguf.Writer) {
			w.String("tokenizer.ggml.model", "llama")
			w.Strings("tokenizer.ggml.tokens", []string{"a", "b"})
			w.Float32s("tokenizer.ggml.scores", []float32{0})
		}, "one for each of the 2 tokens (has 1)"},
		{func(w *gguf.Writer) {
			w.String("tokenizer.ggml.model", "gpt2")
			w.Strings("tokenizer.ggml.tokens", []string{"a"})
			w.Strings("tokenizer.ggml.merges", nil)
			w.Uint32("tokenizer.ggml.eos_token_id", 5)
		}, "eos_token_id is 5; the vocabulary has 1 tokens"},
		{func(w *gguf.Writer) {
			w.String("tokenizer.ggml.model", "bert")
		}, `tokenizer.ggml.model "bert"`},
	} {
		var w gguf.Writer
		c.set(&w)
		var b bytes.Buffer
		_, err := w.WriteTo(&b)
		require.NoError(t, err)
		f, err := gguf.Parse(bytes.NewReader(b.Bytes()), int64(b.Len()))
		require.NoError(t, err)
		_, err = gguf.ReadTokenizer(f)
		assert.ErrorContains(t, err, c.want)
	}
}

// Llama 3's and Qwen2's tokenizers (byte-level BPE after a Split by their
// regexes; Llama 3's ignore_merges) written by the project's writer read
// back as tokenizers that encode as the originals do.
func TestTokenizerRoundTripSplitPretokenizers(t *testing.T) {
	corpus := []string{"Hello, world! IT'S 12345 and 3.14\n\nnext\tline ünïcödé 🙂", "  spaced   out  \r\n", "don't", "<s>hi"}
	for _, name := range []string{"llama3.json", "qwen2.json"} {
		orig, err := os.ReadFile("../testdata/tokenizers/" + name)
		require.NoError(t, err)
		var w gguf.Writer
		w.String("general.architecture", "llama")
		require.NoError(t, w.WriteHFTokenizer(orig, "", 0, 2, false))
		var b bytes.Buffer
		_, err = w.WriteTo(&b)
		require.NoError(t, err)
		f, err := gguf.Parse(bytes.NewReader(b.Bytes()), int64(b.Len()))
		require.NoError(t, err)
		tk, err := gguf.ReadTokenizer(f)
		require.NoError(t, err)
		js, err := tk.HFJSON()
		require.NoError(t, err)
		want, err := models.ParseHFTokenizer(orig, name, 0)
		require.NoError(t, err)
		got, err := models.ParseHFTokenizer(js, name+" from gguf", 0)
		require.NoError(t, err, "%s", js[:min(len(js), 400)])
		for _, text := range corpus {
			w, err := want.EncodeIDs(text, false)
			require.NoError(t, err)
			g, err := got.EncodeIDs(text, false)
			require.NoError(t, err)
			assert.Equal(t, w, g, "%s: %q", name, text)
		}
	}
}

// A SentencePiece vocabulary of long tokens, which would take hours to
// build merges from, is refused at once.
func TestTokenizerLongTokensRefused(t *testing.T) {
	var w gguf.Writer
	w.String("general.architecture", "llama")
	w.String("tokenizer.ggml.model", "llama")
	long := strings.Repeat("a", 40000)
	w.Strings("tokenizer.ggml.tokens", []string{"<unk>", long})
	w.Float32s("tokenizer.ggml.scores", []float32{0, 0})
	w.Int32s("tokenizer.ggml.token_type", []int32{gguf.TokenUnknown, gguf.TokenNormal})
	w.Bool("tokenizer.ggml.add_bos_token", false)
	var b bytes.Buffer
	_, err := w.WriteTo(&b)
	require.NoError(t, err)
	f, err := gguf.Parse(bytes.NewReader(b.Bytes()), int64(b.Len()))
	require.NoError(t, err)
	tk, err := gguf.ReadTokenizer(f)
	require.NoError(t, err)
	_, err = tk.HFJSON()
	require.ErrorIs(t, err, gguf.ErrMalformed)
	assert.Contains(t, err.Error(), "too long")
}
