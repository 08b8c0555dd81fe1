package models

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// VocabFile is the WordPiece vocabulary an encoder model directory may hold;
// with it, the model can take text.
const VocabFile = "vocab.txt"

// maxWordChars is BERT's limit: a longer whitespace-separated word becomes
// [UNK] rather than being split.
const maxWordChars = 100

// tooLong says why Encode refused text; request errors embed it, so its
// own message leaves the package prefix out.
const tooLong = "text is longer than the largest sequence bucket"

// ErrTooLong is matched by Encode's error when text does not fit and
// truncation is off.
var ErrTooLong = errors.New("models: " + tooLong)

// tooLongError is ErrTooLong with the counts a user needs to fix the text.
type tooLongError struct{ tokens, limit int }

func (e *tooLongError) Error() string {
	return fmt.Sprintf("%s: %d tokens with [CLS] and [SEP], the limit is %d", tooLong, e.tokens, e.limit)
}

func (e *tooLongError) Is(target error) bool { return target == ErrTooLong }

// Tokenizer is BERT's tokenizer: basic tokenization (cleanup, CJK and
// punctuation splitting, optional lowercasing and accent stripping) followed
// by greedy longest-match-first WordPiece with "##" continuations. It is
// safe for concurrent use.
type Tokenizer struct {
	ids       map[string]int64
	lowercase bool
	// The special tokens' ids.
	CLS, SEP, UNK, PAD int64
}

// ReadTokenizer reads a vocab.txt (one token per line, the line number is
// the id) and checks that it holds [CLS], [SEP], [UNK] and [PAD].
func ReadTokenizer(path string, lowercase bool, vocabSize int) (*Tokenizer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	defer f.Close()
	t := &Tokenizer{ids: map[string]int64{}, lowercase: lowercase}
	sc := bufio.NewScanner(f)
	var n int64
	for sc.Scan() {
		tok := strings.TrimRight(sc.Text(), "\r")
		if !utf8.ValidString(tok) {
			return nil, fmt.Errorf("%s: line %d is not UTF-8", path, n+1)
		}
		if _, dup := t.ids[tok]; !dup {
			t.ids[tok] = n
		}
		n++
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if vocabSize > 0 && int(n) > vocabSize {
		return nil, fmt.Errorf("%s: %d tokens, more than encoder.vocab_size %d", path, n, vocabSize)
	}
	for _, sp := range []struct {
		name string
		id   *int64
	}{{"[CLS]", &t.CLS}, {"[SEP]", &t.SEP}, {"[UNK]", &t.UNK}, {"[PAD]", &t.PAD}} {
		id, ok := t.ids[sp.name]
		if !ok {
			return nil, fmt.Errorf("%s: the special token %s is missing", path, sp.name)
		}
		*sp.id = id
	}
	return t, nil
}

// Tokens splits text into WordPiece tokens, without [CLS] and [SEP].
func (t *Tokenizer) Tokens(text string) []string {
	var out []string
	for _, word := range t.basic(text) {
		out = append(out, t.wordPiece(word)...)
	}
	return out
}

// Encode tokenizes text into ids framed by [CLS] and [SEP], at most maxLen
// long: longer text is truncated when truncate is set and is ErrTooLong
// otherwise.
func (t *Tokenizer) Encode(text string, maxLen int, truncate bool) ([]int64, error) {
	toks := t.Tokens(text)
	if len(toks)+2 > maxLen {
		if !truncate {
			return nil, &tooLongError{len(toks) + 2, maxLen}
		}
		toks = toks[:maxLen-2]
	}
	ids := make([]int64, 0, len(toks)+2)
	ids = append(ids, t.CLS)
	for _, tok := range toks {
		ids = append(ids, t.ids[tok]) // wordPiece only yields known tokens or [UNK]
	}
	return append(ids, t.SEP), nil
}

// basic is BERT's BasicTokenizer.
func (t *Tokenizer) basic(text string) []string {
	var b strings.Builder
	for _, r := range text {
		switch {
		case r == 0 || r == utf8.RuneError || isControl(r):
			continue
		case isWhitespace(r):
			b.WriteByte(' ')
		case isCJK(r):
			b.WriteByte(' ')
			b.WriteRune(r)
			b.WriteByte(' ')
		default:
			b.WriteRune(r)
		}
	}
	var words []string
	for _, tok := range strings.Fields(b.String()) {
		if t.lowercase {
			tok = stripAccents(strings.ToLower(tok))
		}
		words = append(words, splitPunctuation(tok)...)
	}
	return words
}

func stripAccents(s string) string {
	var b strings.Builder
	for _, r := range norm.NFD.String(s) {
		if !unicode.Is(unicode.Mn, r) {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// splitPunctuation makes every punctuation character a word of its own.
func splitPunctuation(s string) []string {
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

// wordPiece splits one word greedily, longest match first.
func (t *Tokenizer) wordPiece(word string) []string {
	if utf8.RuneCountInString(word) > maxWordChars {
		return []string{"[UNK]"}
	}
	var out []string
	for start := 0; start < len(word); {
		end := len(word)
		found := ""
		for end > start {
			sub := word[start:end]
			if start > 0 {
				sub = "##" + sub
			}
			if _, ok := t.ids[sub]; ok {
				found = sub
				break
			}
			_, size := utf8.DecodeLastRuneInString(word[start:end])
			end -= size
		}
		if found == "" {
			return []string{"[UNK]"}
		}
		out = append(out, found)
		start = end
	}
	return out
}

func isWhitespace(r rune) bool {
	return r == ' ' || r == '\t' || r == '\n' || r == '\r' || unicode.Is(unicode.Zs, r)
}

func isControl(r rune) bool {
	if r == '\t' || r == '\n' || r == '\r' {
		return false
	}
	return unicode.In(r, unicode.C) // as BERT: every category starting with C
}

// isPunctuation follows BERT: every non-alphanumeric ASCII printable
// character, and Unicode punctuation.
func isPunctuation(r rune) bool {
	if (r >= 33 && r <= 47) || (r >= 58 && r <= 64) || (r >= 91 && r <= 96) || (r >= 123 && r <= 126) {
		return true
	}
	return unicode.IsPunct(r)
}

// isCJK covers the CJK Unified Ideographs blocks BERT splits per character
// (not Hangul or kana, which are written with spaces).
func isCJK(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) ||
		(r >= 0x20000 && r <= 0x2A6DF) || (r >= 0x2A700 && r <= 0x2B73F) ||
		(r >= 0x2B740 && r <= 0x2B81F) || (r >= 0x2B820 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) || (r >= 0x2F800 && r <= 0x2FA1F)
}
