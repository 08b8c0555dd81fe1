package models

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// textModel copies the tiny encoder into a repository of its own, with
// the test tokenizer file tok (wordpiece, unigram or bpe; "" for none)
// as its tokenizer.json, and with pairs a text_pair input.
func textModel(t *testing.T, tok string, pairs bool) *Model {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "m")
	require.NoError(t, os.Mkdir(dir, 0o755))
	for _, f := range []string{ConfigFile, WeightsFile, VocabFile} {
		b, err := os.ReadFile(filepath.Join("../model_repository/tiny-encoder", f))
		require.NoError(t, err)
		if f == ConfigFile && pairs {
			b = []byte(strings.Replace(string(b), "inputs:\n  - name: text\n    datatype: BYTES\n    shape: [-1]\n",
				"inputs:\n  - name: text\n    datatype: BYTES\n    shape: [-1]\n  - name: text_pair\n    datatype: BYTES\n    shape: [-1]\n", 1))
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	if tok != "" {
		b, err := os.ReadFile(filepath.Join("testdata/tokenizers", tok+".json"))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, TokenizerFile), b, 0o644))
	}
	m, err := Load(dir)
	require.NoError(t, err)
	return m
}

func TestTokenizerJSONComesBeforeVocabTxt(t *testing.T) {
	m := textModel(t, "unigram", false)
	require.IsType(t, &HFTokenizer{}, m.Tokenizer)
	toks, err := m.Tokenizer.Tokenize("Hello world")
	require.NoError(t, err)
	assert.Equal(t, "<s>", toks[0].Text)
	assert.Equal(t, "</s>", toks[len(toks)-1].Text)

	m = textModel(t, "", false)
	require.IsType(t, &Tokenizer{}, m.Tokenizer, "without tokenizer.json, vocab.txt")
}

func TestTokenizerJSONIdsMustFitTheVocabulary(t *testing.T) {
	b, err := os.ReadFile("testdata/tokenizers/bpe.json")
	require.NoError(t, err)
	_, err = ParseHFTokenizer(b, "m/tokenizer.json", 100)
	assert.ErrorContains(t, err, "m/tokenizer.json: token ids up to 490, beyond encoder.vocab_size 100")
	_, err = ParseHFTokenizer([]byte(`{"model": {"type": "Nope"}}`), "m/tokenizer.json", 0)
	assert.ErrorContains(t, err, `m/tokenizer.json: tokenizer.json: model: type "Nope" is not supported; want WordPiece, Unigram or BPE`)
}

// TestTokenizeGivesOffsets holds every tokenizer's offsets to the text:
// a token's bytes are in the text, in order; inserted special tokens are
// empty.
func TestTokenizeGivesOffsets(t *testing.T) {
	text := "Café, naïve 서울 東京 🙂 don't  <mask> stop"
	for _, name := range []string{"", "wordpiece", "unigram", "bpe"} {
		m := textModel(t, name, false)
		toks, err := m.Tokenizer.Tokenize(text)
		require.NoError(t, err)
		ids, err := m.Tokenizer.AppendEncode(nil, text, math.MaxInt, false)
		require.NoError(t, err)
		require.Len(t, toks, len(ids), name)
		last := 0
		for i, tok := range toks {
			assert.Equal(t, ids[i], tok.ID, "%s: Tokenize and AppendEncode agree", name)
			require.True(t, tok.Start <= tok.Stop && tok.Stop <= len(text) && tok.Start >= last-4, "%s: token %d %+v", name, i, tok)
			if i == 0 || i == len(toks)-1 {
				assert.True(t, tok.Special && tok.Start == tok.Stop, "%s: inserted special token %+v", name, tok)
				continue
			}
			assert.Less(t, tok.Start, tok.Stop, "%s: %+v covers text", name, tok)
			last = tok.Start
		}
		cafe := toks[1]
		assert.True(t, strings.HasPrefix(text[cafe.Start:cafe.Stop], "C") || strings.HasPrefix(text[cafe.Start:cafe.Stop], "c"), "%s: %+v", name, cafe)
	}
}

func TestPairsAreFramedByTheFamily(t *testing.T) {
	texts, pairs := []string{"what is a fox", "hi"}, []string{"a fox is an animal", "hello there"}
	in := []Input{{Shape: []int64{2}, Strings: texts}, {Shape: []int64{2}, Strings: pairs}}
	for _, c := range []struct {
		tok         string
		first, last string
		secondType  int64
		sepsBetween int
	}{
		{"", "[CLS]", "[SEP]", 1, 1}, // vocab.txt: BERT
		{"wordpiece", "[CLS]", "[SEP]", 1, 1},
		{"unigram", "<s>", "</s>", 0, 2}, // XLM-R: <s> A </s></s> B </s>, types 0
		{"bpe", "<s>", "</s>", 0, 2},     // RoBERTa
	} {
		m := textModel(t, c.tok, true)
		got, seq, err := m.PrepareInputs(nil, in)
		require.NoError(t, err, c.tok)
		ids, mask, types := int64sOf(got[EncoderInputIDs]), int64sOf(got[EncoderAttentionMask]), int64sOf(got[EncoderTokenTypeIDs])
		vocab := tokenTexts(t, m)
		for row := range texts {
			n := 0
			for j := range seq {
				n += int(mask[row*seq+j])
			}
			r, ty := ids[row*seq:row*seq+n], types[row*seq:row*seq+n]
			assert.Equal(t, c.first, vocab[r[0]], c.tok)
			assert.Equal(t, c.last, vocab[r[n-1]], c.tok)
			// The separators between the texts, and the types after them.
			firstSep := slices.Index(r, r[n-1])
			for k := range c.sepsBetween {
				assert.Equal(t, r[n-1], r[firstSep+k], "%s: row %d: %d separators between the texts", c.tok, row, c.sepsBetween)
			}
			assert.Equal(t, make([]int64, firstSep+1), ty[:firstSep+1], "%s: the first text is type 0", c.tok)
			for _, tt := range ty[firstSep+c.sepsBetween:] {
				assert.Equal(t, c.secondType, tt, "%s: the second text's type", c.tok)
			}
			for j := n; j < seq; j++ {
				assert.Equal(t, m.Tokenizer.PadID(), ids[row*seq+j], "%s: padded with the pad id", c.tok)
				assert.Zero(t, types[row*seq+j])
			}
		}
		pad := vocab[m.Tokenizer.PadID()]
		assert.True(t, pad == "[PAD]" || pad == "<pad>", "%s: pad token %q", c.tok, pad)

		// Texts alone still go alone; a pair list of another length is refused.
		_, _, err = m.PrepareInputs(nil, []Input{in[0], {}})
		require.NoError(t, err, "text_pair is optional")
		_, _, err = m.PrepareInputs(nil, []Input{in[0], {Shape: []int64{1}, Strings: pairs[:1]}})
		assert.True(t, errors.Is(err, ErrInput))
		assert.ErrorContains(t, err, `input "text_pair": 1 elements for the 2 of "text"; send one per text`)
	}
}

// tokenTexts is the model's tokens by id, from Tokenize of each
// vocabulary entry's own ids.
func tokenTexts(t *testing.T, m *Model) map[int64]string {
	out := map[int64]string{}
	switch tok := m.Tokenizer.(type) {
	case *Tokenizer:
		for i, s := range tok.vocab {
			out[int64(i)] = s
		}
	case *HFTokenizer:
		for i := range tok.t.VocabSize() {
			out[int64(i)] = tok.t.TokenText(int64(i))
		}
	}
	return out
}

func TestLongPairsAreTruncatedOrRefused(t *testing.T) {
	for _, name := range []string{"", "unigram", "bpe"} {
		m := textModel(t, name, true)
		long := strings.Repeat("word ", 300)
		in := []Input{{Shape: []int64{1}, Strings: []string{long}}, {Shape: []int64{1}, Strings: []string{"short pair"}}}
		m.Config.Encoder.Truncate = false
		_, _, err := m.PrepareInputs(nil, in)
		require.Error(t, err)
		assert.True(t, errors.Is(err, ErrTooLong), name)
		assert.Contains(t, err.Error(), `input "text": element 0 with its text_pair: text is longer than the largest sequence bucket: `)
		assert.Contains(t, err.Error(), "the limit is 128 (the largest seq bucket); shorten it, or set encoder.truncate: true")

		m.Config.Encoder.Truncate = true
		got, seq, err := m.PrepareInputs(nil, in)
		require.NoError(t, err, name)
		assert.Equal(t, 128, seq)
		// Longest first: the short pair is kept whole, at the end.
		ids := int64sOf(got[EncoderInputIDs])
		short, err := m.Tokenizer.AppendEncode(nil, "short pair", 128, false)
		require.NoError(t, err)
		inner := short[1 : len(short)-1]
		assert.Equal(t, inner, ids[127-len(inner):127], name)
	}
}

// TestVocabTxtPipelineMatchesTheStreamingTokenizer holds the tokenizer.json
// pipeline a vocab.txt stands for (used for pairs and offsets) to the
// streaming tokenizer used for single texts.
func TestVocabTxtPipelineMatchesTheStreamingTokenizer(t *testing.T) {
	for _, tok := range refTokenizers(t) {
		for _, s := range refSeeds {
			assertSamePipeline(t, tok, s)
		}
	}
}

func assertSamePipeline(t testing.TB, tok *Tokenizer, s string) {
	want, err := tok.AppendEncode(nil, s, math.MaxInt, false)
	require.NoError(t, err)
	toks, err := tok.Tokenize(s)
	require.NoError(t, err)
	got := make([]int64, len(toks))
	for i, tk := range toks {
		got[i] = tk.ID
	}
	if !slices.Equal(want, got) {
		t.Fatalf("lowercase %v: %q: streaming %v, pipeline %v", tok.lowercase, s, want, got)
	}
}
