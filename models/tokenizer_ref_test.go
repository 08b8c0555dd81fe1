package models

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"golang.org/x/text/unicode/norm"
)

// refTokens is BERT's tokenizer as the reference (tokenization.py) writes
// it, one whole-text step after another: the oracle the streaming
// Tokenizer is held to.
func refTokens(t *Tokenizer, text string) []string {
	var out []string
	for _, word := range refWords(t.lowercase, text) {
		out = append(out, refWordPiece(t, word)...)
	}
	return out
}

// refWords is the reference's basic tokenizer.
func refWords(lowercase bool, text string) []string {
	var b strings.Builder
	for _, r := range text {
		switch {
		case r == 0 || r == utf8.RuneError || isControl(r):
		case isWhitespace(r):
			b.WriteByte(' ')
		case isCJK(r):
			b.WriteString(" " + string(r) + " ")
		default:
			b.WriteRune(r)
		}
	}
	var out []string
	for _, field := range strings.Fields(b.String()) {
		if lowercase {
			var s strings.Builder
			for _, r := range norm.NFD.String(strings.ToLower(field)) {
				if !unicode.Is(unicode.Mn, r) {
					s.WriteRune(r)
				}
			}
			field = s.String()
		}
		out = append(out, refSplitPunctuation(field)...)
	}
	return out
}

func refSplitPunctuation(s string) []string {
	var out []string
	start := 0
	for i, r := range s {
		if isPunctuation(r) {
			if start < i {
				out = append(out, s[start:i])
			}
			out = append(out, string(r))
			start = i + utf8.RuneLen(r)
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

func refWordPiece(t *Tokenizer, word string) []string {
	if utf8.RuneCountInString(word) > maxWordChars {
		return []string{"[UNK]"}
	}
	var out []string
	for start := 0; start < len(word); {
		end, found := len(word), ""
		for ; end > start; end -= utf8.RuneLen(lastRune(word[start:end])) {
			sub := word[start:end]
			if start > 0 {
				sub = "##" + sub
			}
			if _, ok := t.ids[sub]; ok {
				found = sub
				break
			}
		}
		if found == "" {
			return []string{"[UNK]"}
		}
		out = append(out, found)
		start = end
	}
	return out
}

func lastRune(s string) rune {
	r, _ := utf8.DecodeLastRuneInString(s)
	return r
}

// refVocab has whole words, continuations, multi-byte and CJK tokens, and
// a long token, so that WordPiece's bound on candidates is exercised.
var refVocab = []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "##lo", "he", "##l", "un", "##want", "##ed", "want",
	"x", "##x", "a", "##a", "ab", "##ab", "abc", "café", "cafe", "é", "##é", "e", "##e", "i", "##i", "ß", "##ß", "σ", "##σ", "ς",
	"\u535A", "\u63A8", "\u8C48", "한", "##국", "ᄒ", "##ᅡ", "##ᆫ", "extraordinarily", "##extraordinarily", "ǆ", "ǅ", "a\u0301", "I", "İ",
	".", ",", "!", "'", "-", "##-", "¿", "é", "Ä", "ä", "##ä", "ㄱ"}

var refSeeds = []string{
	"Hello, world!", "ah\u535A\u63A8zz", "\xff\xfe", "unwanted running", strings.Repeat("x", 200), strings.Repeat("x", 100), strings.Repeat("x", 101),
	"HeLLo!how  \n Are yoU?", "Caf\u00E9 cafe\u0301 CAFÉ", "a\u0000b\u200b c\ufffd", "don't --3.5 ¿x", "$5^a", "  \u3000\t ",
	"İstanbul ǅemal ǄEMAL ß ΣΑΣ σας", "한국어 한국 \u1112\u1161\u11ab", "\uF900\uF901 \u2F800", "line\u2028sep\u2029para\u0085nel",
	"e" + strings.Repeat("\u0301", 40) + "x" + strings.Repeat("\u0316\u0301", 300) + "a", "\u0F73\u0F71\u0F72 \u0344\u0308",
	"extraordinarilyextraordinarily abcabcab", strings.Repeat("ab", 50) + " " + strings.Repeat("ab", 51), strings.Repeat("é", 101),
	"A\u0301\u0302\u0323B", "\u1E9B\u0323", "x" + strings.Repeat("\U0001D165", 40) + "x", "x" + strings.Repeat("\U0001D16D\U0001D165\u0301", 10) + "y", strings.Repeat("\u1161", 100) + " ᄒ" + strings.Repeat("\u1161\u11ab", 60), strings.Repeat("a.", 100),
}

func refTokenizers(t testing.TB) []*Tokenizer {
	path := filepath.Join(t.TempDir(), VocabFile)
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(refVocab, "\n")), 0o644))
	var out []*Tokenizer
	for _, lowercase := range []bool{true, false} {
		tok, err := ReadTokenizer(path, lowercase, 0)
		require.NoError(t, err)
		out = append(out, tok)
	}
	return out
}

func TestTokensMatchTheReference(t *testing.T) {
	for _, tok := range refTokenizers(t) {
		for _, s := range refSeeds {
			require.Equal(t, refTokens(tok, s), tok.Tokens(s), "lowercase %v: %q", tok.lowercase, s)
			require.Equal(t, heads(refWords(tok.lowercase, s)), basicWords(tok.lowercase, s), "lowercase %v: %q", tok.lowercase, s)
		}
	}
}

// FuzzTokensMatchTheReference holds the streaming tokenizer to the
// reference on any text, cased and uncased.
func FuzzTokensMatchTheReference(f *testing.F) {
	for _, s := range refSeeds {
		f.Add(s)
	}
	toks := refTokenizers(f)
	f.Fuzz(func(t *testing.T, s string) {
		if streamSafeCut(s) {
			t.Skip("more than 30 combining marks in a row: NFD cuts them where the tokenizer may not (maxSegment)")
		}
		for _, tok := range toks {
			if want, got := refTokens(tok, s), tok.Tokens(s); !slices.Equal(want, got) {
				t.Fatalf("lowercase %v: %q: reference %q, got %q", tok.lowercase, s, want, got)
			}
			if want, got := heads(refWords(tok.lowercase, s)), basicWords(tok.lowercase, s); !slices.Equal(want, got) {
				t.Fatalf("lowercase %v: %q: reference words %q, got %q", tok.lowercase, s, want, got)
			}
			assertSamePipeline(t, tok, s) // pairs and offsets go through it
		}
	})
}

// streamSafeCut reports whether NFD inserts a CGJ into s, lowercased, to
// cut a run of more than 30 combining marks.
func streamSafeCut(s string) bool {
	lower := strings.ToLower(s)
	return strings.Count(norm.NFD.String(lower), norm.GraphemeJoiner) > strings.Count(lower, norm.GraphemeJoiner)
}

// heads cuts each word to the maxWordChars runes the basic tokenizer keeps
// of it.
func heads(words []string) []string {
	for i, w := range words {
		if r := []rune(w); len(r) > maxWordChars {
			words[i] = string(r[:maxWordChars])
		}
	}
	return words
}
