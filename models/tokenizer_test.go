package models

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func tokenizer(t *testing.T, lowercase bool, vocab ...string) *Tokenizer {
	t.Helper()
	path := filepath.Join(t.TempDir(), VocabFile)
	all := append([]string{"[PAD]", "[UNK]", "[CLS]", "[SEP]"}, vocab...)
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(all, "\n")+"\n"), 0o644))
	tok, err := ReadTokenizer(path, lowercase, 0)
	require.NoError(t, err)
	return tok
}

// The cases follow the reference BERT tokenizer's own tests
// (tokenization_test.py) and the WordPiece definition.
// basicWords is the basic tokenizer's words of text.
func basicWords(lowercase bool, text string) []string {
	var words []string
	b := basic{lowercase: lowercase, word: func(word []byte, _ int) bool {
		words = append(words, string(word))
		return true
	}}
	b.scan(text)
	return words
}

func TestBasicTokenization(t *testing.T) {
	assert.Equal(t, []string{"hello", "!", "how", "are", "you", "?"}, basicWords(true, " \tHeLLo!how  \n Are yoU?  "))
	assert.Equal(t, []string{"hello"}, basicWords(true, "H\u00E9llo"), "accents are stripped when lowercasing")
	assert.Equal(t, []string{"hallo", "!", "how", "are", "you", "?"}, basicWords(true, " \tHäLLo!how  \n Are yoU?  "))

	assert.Equal(t, []string{"HeLLo", "!", "how", "Are", "yoU", "?"}, basicWords(false, " \tHeLLo!how  \n Are yoU?  "))
	assert.Equal(t, []string{"HäLLo"}, basicWords(false, "HäLLo"), "a cased vocabulary keeps accents")

	assert.Equal(t, []string{"ah", "\u535A", "\u63A8", "zz"}, basicWords(true, "ah\u535A\u63A8zz"), "CJK characters are split")
	assert.Equal(t, []string{"ab", "c"}, basicWords(true, "a\u0000b\u200b c\ufffd"), "NUL, control and format characters and U+FFFD are dropped")
	assert.Equal(t, []string{"don", "'", "t", "-", "-", "3", ".", "5", "¿", "x"}, basicWords(true, "don't --3.5 ¿x"), "ASCII and Unicode punctuation")
	assert.Equal(t, []string{"$", "5", "^", "a"}, basicWords(true, "$5^a"), "every non-alphanumeric ASCII symbol splits, as BERT does")
	assert.Empty(t, basicWords(true, "  \u3000\t "))
}

func TestWordPiece(t *testing.T) {
	tok := tokenizer(t, true, "want", "##want", "##ed", "wa", "un", "runn", "##ing", ",", "ü")
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"unwanted running", []string{"un", "##want", "##ed", "runn", "##ing"}},
		{"unwantedX running", []string{"[UNK]", "runn", "##ing"}},
		{"UNwant\u00E9d,running", []string{"un", "##want", "##ed", ",", "runn", "##ing"}},
		{strings.Repeat("a", 101), []string{"[UNK]"}},
	} {
		assert.Equal(t, tc.want, tok.Tokens(tc.in), "%q", tc.in)
	}
}

func TestEncodeFramesAndTruncates(t *testing.T) {
	tok := tokenizer(t, true, "a", "b", "c")
	ids, err := tok.Encode("a b c", 8, false)
	require.NoError(t, err)
	assert.Equal(t, []int64{2, 4, 5, 6, 3}, ids, "[CLS] a b c [SEP]")

	ids, err = tok.Encode("a b c a b c", 5, true)
	require.NoError(t, err)
	assert.Equal(t, []int64{2, 4, 5, 6, 3}, ids, "truncated to 5 with [SEP] kept")

	_, err = tok.Encode("a b c a b c", 5, false)
	assert.True(t, errors.Is(err, ErrTooLong))
	assert.ErrorContains(t, err, "8 tokens with [CLS] and [SEP], the limit is 5")

	ids, err = tok.Encode("zzz", 8, false)
	require.NoError(t, err)
	assert.Equal(t, []int64{2, 1, 3}, ids, "unknown words are [UNK]")
}

func TestEncodeIsBoundedByMaxLen(t *testing.T) {
	letters := []string{}
	for c := 'a'; c <= 'z'; c++ {
		letters = append(letters, string(c), "##"+string(c))
	}
	tok := tokenizer(t, true, letters...)

	ids, err := tok.Encode(strings.Repeat("a", 1<<20), 64, false)
	require.NoError(t, err)
	assert.Equal(t, []int64{tok.CLS, tok.UNK, tok.SEP}, ids, "a word over 100 characters is [UNK], however long")

	// 100-letter words split letter by letter: the most WordPiece work a
	// word can ask for.
	word := strings.Repeat("abcdefghij", 10)
	text := strings.Repeat(word+" ", 1<<20/101)
	ids, read, err := tok.encode(nil, text, 64, true)
	require.NoError(t, err)
	require.Len(t, ids, 64)
	assert.Equal(t, tok.ids["a"], ids[1])
	assert.Equal(t, tok.ids["##b"], ids[2])
	assert.Equal(t, 101, read, "truncating stops at the word that fills maxLen: the first, and the space that ends it")

	_, read, err = tok.encode(nil, text, 64, false)
	assert.ErrorContains(t, err, fmt.Sprintf("%d tokens with [CLS] and [SEP], the limit is 64", 100*(1<<20/101)+2))
	assert.Equal(t, len(text), read, "refusing reads on to count the tokens")

	// Memory is one word's and maxLen ids', not the text's.
	for _, truncate := range []bool{true, false} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		tok.Encode(text, 64, truncate)
		runtime.ReadMemStats(&after)
		assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(16<<10), "truncate %v: allocated for a 1 MiB text", truncate)
	}
}

func TestWordPieceLooksUpNoCandidateLongerThanTheLongestToken(t *testing.T) {
	// The longest token is "##éé", 6 bytes: a candidate is cut to 6 bytes,
	// back to a rune boundary, before it is looked up.
	tok := tokenizer(t, false, "é", "##é", "##éé", "abcd", "##c")
	require.Equal(t, 6, tok.longest)
	assert.Equal(t, []string{"é", "##éé", "##éé", "##éé"}, tok.Tokens("ééééééé"))
	assert.Equal(t, []string{"é", "##éé", "##éé", "##é"}, tok.Tokens("éééééé"))
	assert.Equal(t, []string{"abcd", "##c", "##c"}, tok.Tokens("abcdcc"))
	assert.Equal(t, []string{"[UNK]"}, tok.Tokens("abcde"))
}

func TestReadTokenizerErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), VocabFile)
	require.NoError(t, os.WriteFile(path, []byte("[PAD]\n[UNK]\n[CLS]\n"), 0o644))
	_, err := ReadTokenizer(path, true, 0)
	assert.ErrorContains(t, err, "the special token [SEP] is missing")

	require.NoError(t, os.WriteFile(path, []byte("[PAD]\n[UNK]\n[CLS]\n[SEP]\nx\n"), 0o644))
	_, err = ReadTokenizer(path, true, 4)
	assert.ErrorContains(t, err, "5 tokens, more than encoder.vocab_size 4")

	require.NoError(t, os.WriteFile(path, []byte("[PAD]\n\xff\n"), 0o644))
	_, err = ReadTokenizer(path, true, 0)
	assert.ErrorContains(t, err, "line 2 is not UTF-8")
}

// FuzzTokenizer checks that no text panics the tokenizer and that every id
// it yields is in the vocabulary.
func FuzzTokenizer(f *testing.F) {
	for _, s := range []string{"Hello, world!", "ah\u535A\u63A8zz", "\xff\xfe", "unwanted running", strings.Repeat("x", 200)} {
		f.Add(s)
	}
	vocab := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "##lo", "un", "##want", "##ed", "x", "##x"}
	path := filepath.Join(f.TempDir(), VocabFile)
	require.NoError(f, os.WriteFile(path, []byte(strings.Join(vocab, "\n")), 0o644))
	tok, err := ReadTokenizer(path, true, 0)
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := tok.Encode(s, 64, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) > 64 || ids[0] != tok.CLS || ids[len(ids)-1] != tok.SEP {
			t.Fatalf("bad framing: %v", ids)
		}
		for _, id := range ids {
			if id < 0 || int(id) >= len(vocab) {
				t.Fatalf("id %d outside the vocabulary", id)
			}
		}
	})
}
