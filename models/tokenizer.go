package models

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/stepserve/stepserve/models/tokenizers"
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
type tooLongError struct {
	tokens, limit int
	specials      string // what the count includes: "[CLS] and [SEP]"
}

func (e *tooLongError) Error() string {
	return fmt.Sprintf("%s: %d tokens with %s, the limit is %d", tooLong, e.tokens, e.specials, e.limit)
}

func (e *tooLongError) Is(target error) bool { return target == ErrTooLong }

// Tokenizer is BERT's tokenizer: basic tokenization (cleanup, CJK and
// punctuation splitting, optional lowercasing and accent stripping) followed
// by greedy longest-match-first WordPiece with "##" continuations. It reads
// text once, front to back, holding at most one word: its memory is bounded
// by maxWordChars, and by the tokens kept, whatever the text's length. It
// is safe for concurrent use.
type Tokenizer struct {
	ids   map[string]int64
	vocab []string // by id
	// longest is the longest token's length in bytes: no WordPiece
	// candidate is longer, so none longer is looked up.
	longest   int
	lowercase bool
	scanners  sync.Pool // of *scanner
	// hf is the same tokenizer as a tokenizer.json pipeline, for pairs
	// and offsets.
	hf *tokenizers.Tokenizer
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
	return ParseTokenizer(f, path, lowercase, vocabSize)
}

// ParseTokenizer reads a vocabulary from r as [ReadTokenizer] does; path
// names it in errors.
func ParseTokenizer(r io.Reader, path string, lowercase bool, vocabSize int) (*Tokenizer, error) {
	t := &Tokenizer{ids: map[string]int64{}, lowercase: lowercase}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		tok := strings.TrimRight(sc.Text(), "\r")
		if !utf8.ValidString(tok) {
			return nil, fmt.Errorf("%s: line %d is not UTF-8", path, len(t.vocab)+1)
		}
		if _, dup := t.ids[tok]; !dup {
			t.ids[tok] = int64(len(t.vocab))
		}
		t.vocab = append(t.vocab, tok)
		t.longest = max(t.longest, len(tok))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if vocabSize > 0 && len(t.vocab) > vocabSize {
		return nil, fmt.Errorf("%s: %d tokens, more than encoder.vocab_size %d", path, len(t.vocab), vocabSize)
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
	var err error
	if t.hf, err = bert(t.vocab, lowercase); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// Tokens splits text into WordPiece tokens, without [CLS] and [SEP]. It
// keeps every token of text; [Tokenizer.Encode] is the bounded way.
func (t *Tokenizer) Tokens(text string) []string {
	ids, _, _ := t.encode(nil, text, math.MaxInt, false)
	var out []string
	for _, id := range ids[1 : len(ids)-1] {
		out = append(out, t.vocab[id])
	}
	return out
}

// Encode tokenizes text into ids framed by [CLS] and [SEP], at most maxLen
// long: longer text is truncated when truncate is set and is ErrTooLong
// otherwise. Truncating, it stops reading text at the word that fills
// maxLen; refusing, it reads on only to count the tokens for the error.
// Either way it keeps at most maxLen ids.
func (t *Tokenizer) Encode(text string, maxLen int, truncate bool) ([]int64, error) {
	ids, _, err := t.encode(make([]int64, 0, min(maxLen, 2+len(text))), text, maxLen, truncate)
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// AppendEncode is Encode appending the ids to dst, which it returns
// unchanged on error: a caller encoding many texts keeps them in one slice.
func (t *Tokenizer) AppendEncode(dst []int64, text string, maxLen int, truncate bool) ([]int64, error) {
	dst, _, err := t.encode(dst, text, maxLen, truncate)
	return dst, err
}

// encode is AppendEncode, also returning how many bytes of text it read.
func (t *Tokenizer) encode(dst []int64, text string, maxLen int, truncate bool) ([]int64, int, error) {
	start := len(dst)
	dst = append(dst, t.CLS)
	sep := start + maxLen - 1
	if truncate && len(dst) >= sep {
		return append(dst, t.SEP), 0, nil
	}
	s, _ := t.scanners.Get().(*scanner)
	if s == nil {
		s = &scanner{}
		s.basic.word = s.pieces
	}
	s.basic.lowercase, s.wordPiece.t = t.lowercase, t
	s.ids, s.sep, s.over, s.truncate = dst, sep, 0, truncate
	read := s.scan(text)
	dst, over := s.ids, s.over
	s.ids = nil
	t.scanners.Put(s)
	if over > 0 {
		return dst[:start], read, &tooLongError{maxLen + over, maxLen, "[CLS] and [SEP]"}
	}
	return append(dst, t.SEP), read, nil
}

// scanner is encode's state, pooled: the basic tokenizer's and WordPiece's
// buffers, and where the ids go.
type scanner struct {
	basic
	wordPiece
	ids      []int64 // the ids so far, [CLS] first
	sep      int     // the length of ids at which [SEP] is due
	over     int     // ids past sep, counted for the error
	truncate bool    // stop at sep
}

// pieces takes a word's ids.
func (s *scanner) pieces(word []byte, runes int) bool {
	for _, id := range s.split(word, runes) {
		if len(s.ids) == s.sep {
			s.over++
			continue
		}
		if s.ids = append(s.ids, id); s.truncate && len(s.ids) == s.sep {
			return false
		}
	}
	return true
}

// basic is BERT's BasicTokenizer. It drops control characters and splits on
// whitespace and around CJK ideographs; with lowercase it then lowercases
// each whitespace-separated field, decomposes it (NFD) and drops the
// accents (Mn); and it makes each punctuation character a word of its own.
//
// BERT does these over the whole text, one step after another; basic does
// them rune by rune, holding only the word being read: the same words,
// because each step but NFD maps runes one at a time, and NFD is applied
// to one segment (a character and its combining marks) at a time.
type basic struct {
	lowercase bool
	// word takes each word and its length in runes; past maxWordChars runes
	// only the first maxWordChars are kept. It returns false to stop.
	word    func(word []byte, runes int) bool
	stopped bool

	seg   []byte // lowercased text since the last NFD segment boundary
	nfd   norm.Iter
	buf   []byte // the word being read, up to maxWordChars runes
	runes int    // its length in runes
}

// maxSegment bounds the text basic holds back for NFD, which is a
// character and its combining marks. Only a run of more than 30 marks
// reaches it: there NFD itself cuts, inserting a CGJ every 30 marks
// (Unicode's Stream-Safe Text Format), and basic's cut elsewhere may order
// differently the rare marks accent stripping keeps (Mc with a combining
// class), never anything else.
const maxSegment = 256

// scan reads text until the end or until word returns false, and returns
// how many bytes it read.
func (b *basic) scan(text string) int {
	b.stopped, b.seg, b.buf, b.runes = false, b.seg[:0], b.buf[:0], 0
	for i, r := range text {
		switch {
		case r == 0 || r == utf8.RuneError || isControl(r):
			continue
		case isWhitespace(r) || unicode.IsSpace(r): // and what Python's str.split() splits on
			b.space()
		case isCJK(r):
			b.space()
			b.char(r)
			b.space()
		default:
			b.char(r)
		}
		if b.stopped {
			return i + utf8.RuneLen(r)
		}
	}
	b.space()
	return len(text)
}

// space ends a whitespace-separated field.
func (b *basic) space() {
	b.flush()
	b.endWord()
}

// char takes a rune of a field: lowercased and held back for NFD, or, for a
// cased vocabulary, as it is.
func (b *basic) char(r rune) {
	if !b.lowercase {
		b.add(r)
		return
	}
	r = unicode.ToLower(r)
	if r < utf8.RuneSelf { // ASCII: a segment of its own, without accents
		b.flush()
		b.add(r)
		return
	}
	if len(b.seg) >= maxSegment || startsSegment(r) {
		b.flush()
	}
	b.seg = utf8.AppendRune(b.seg, r)
}

// startsSegment reports whether r's decomposition starts with a starter
// (combining class 0): NFD neither reorders across it nor carries its
// Stream-Safe count past it, so the text before it decomposes alone.
func startsSegment(r rune) bool {
	var enc [utf8.UTFMax]byte
	return norm.NFD.Properties(enc[:utf8.EncodeRune(enc[:], r)]).LeadCCC() == 0
}

// flush decomposes the held-back segment and adds its runes but accents.
func (b *basic) flush() {
	if len(b.seg) == 0 {
		return
	}
	b.nfd.Init(norm.NFD, b.seg) // an Iter, unlike NFD.Append, allocates nothing
	for !b.nfd.Done() {
		for rest := b.nfd.Next(); len(rest) > 0; {
			r, size := utf8.DecodeRune(rest)
			rest = rest[size:]
			if !unicode.Is(unicode.Mn, r) {
				b.add(r)
			}
		}
	}
	b.seg = b.seg[:0]
}

// add takes a normalized rune: punctuation is a word of its own; anything
// else continues the word.
func (b *basic) add(r rune) {
	if isPunctuation(r) {
		b.endWord()
		b.buf, b.runes = utf8.AppendRune(b.buf[:0], r), 1
		b.endWord()
		return
	}
	if b.runes++; b.runes <= maxWordChars {
		b.buf = utf8.AppendRune(b.buf, r)
	}
}

func (b *basic) endWord() {
	if b.runes == 0 || b.stopped {
		return
	}
	b.stopped = !b.word(b.buf, b.runes)
	b.buf, b.runes = b.buf[:0], 0
}

// wordPiece splits words greedily, longest match first, reusing its
// buffers from word to word.
type wordPiece struct {
	t     *Tokenizer
	ids   []int64
	piece []byte // a candidate, with its "##"
}

// split returns the word's ids, valid until the next call. A word longer
// than maxWordChars runes, or with a part no token matches, is one [UNK].
// A match is at most the vocabulary's longest token, so each step looks up
// at most that many candidates, whatever the word's length.
func (w *wordPiece) split(word []byte, runes int) []int64 {
	t := w.t
	unk := func() []int64 {
		w.ids = append(w.ids[:0], t.UNK)
		return w.ids
	}
	if runes > maxWordChars {
		return unk()
	}
	w.ids = w.ids[:0]
	for start := 0; start < len(word); {
		end := min(len(word), start+t.longest)
		for end < len(word) && !utf8.RuneStart(word[end]) {
			end--
		}
		w.piece = w.piece[:0]
		if start > 0 {
			w.piece = append(w.piece, "##"...)
		}
		w.piece = append(w.piece, word[start:end]...)
		found := false
		for end > start {
			var id int64
			if id, found = t.ids[string(w.piece)]; found {
				w.ids = append(w.ids, id)
				break
			}
			_, size := utf8.DecodeLastRune(word[start:end])
			end -= size
			w.piece = w.piece[:len(w.piece)-size]
		}
		if !found {
			return unk()
		}
		start = end
	}
	return w.ids
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
