package tokenizers

// Decoding: ids back to text, as tokenizers' decoders do it (the
// tokenizer.json "decoder"), and streaming decoding for generated text,
// whose deltas never split a character.

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// decoder turns a list of tokens into a list of strings (tokenizers'
// decode_chain); the text is their concatenation.
type decoder interface {
	chain(tokens []string) []string
}

type decoderConfig struct {
	Type           string          `json:"type"`
	Replacement    string          `json:"replacement"`
	PrependScheme  string          `json:"prepend_scheme"`
	AddPrefixSpace *bool           `json:"add_prefix_space"`
	Prefix         string          `json:"prefix"`
	Cleanup        *bool           `json:"cleanup"`
	Suffix         string          `json:"suffix"`
	Content        string          `json:"content"`
	Start          int             `json:"start"`
	Stop           int             `json:"stop"`
	Pattern        json.RawMessage `json:"pattern"`
	Decoders       []json.RawMessage
}

// parseDecoder reads tokenizer.json's decoder; nil when it has none.
func parseDecoder(raw json.RawMessage, depth int) (decoder, error) {
	if isNull(raw) {
		return nil, nil
	}
	if depth > maxNesting {
		return nil, fmt.Errorf("Sequence nested more than %d deep", maxNesting)
	}
	var c decoderConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	switch c.Type {
	case "ByteLevel":
		return byteLevelDecoder{}, nil
	case "Metaspace":
		r, n := utf8.DecodeRuneInString(c.Replacement)
		if c.Replacement == "" || n != len(c.Replacement) {
			return nil, fmt.Errorf("Metaspace: replacement %q; want one character", c.Replacement)
		}
		strip := c.PrependScheme != "never"
		if c.PrependScheme == "" && c.AddPrefixSpace != nil {
			strip = *c.AddPrefixSpace
		}
		return metaspaceDecoder{replacement: string(r), strip: strip}, nil
	case "WordPiece":
		prefix := c.Prefix
		if prefix == "" {
			prefix = "##"
		}
		return wordPieceDecoder{prefix: prefix, cleanup: c.Cleanup == nil || *c.Cleanup}, nil
	case "BPEDecoder":
		suffix := c.Suffix
		if suffix == "" {
			suffix = "</w>"
		}
		return bpeDecoder{suffix: suffix}, nil
	case "ByteFallback":
		return byteFallbackDecoder{}, nil
	case "Fuse":
		return fuseDecoder{}, nil
	case "Strip":
		if c.Start < 0 || c.Stop < 0 || utf8.RuneCountInString(c.Content) != 1 {
			return nil, fmt.Errorf("Strip: content %q, start %d, stop %d; want one character and counts of 0 or more", c.Content, c.Start, c.Stop)
		}
		return stripDecoder{content: c.Content, start: c.Start, stop: c.Stop}, nil
	case "Replace":
		var p struct {
			String *string `json:"String"`
			Regex  *string `json:"Regex"`
		}
		if err := json.Unmarshal(c.Pattern, &p); err != nil {
			return nil, fmt.Errorf("Replace: pattern: %w", err)
		}
		switch {
		case p.String != nil:
			return replaceDecoder{re: regexp.MustCompile(regexp.QuoteMeta(*p.String)), content: c.Content}, nil
		case p.Regex != nil:
			re, err := regexp.Compile(*p.Regex)
			if err != nil {
				return nil, fmt.Errorf("Replace: pattern %q: %w", *p.Regex, err)
			}
			return replaceDecoder{re: re, content: c.Content}, nil
		}
		return nil, fmt.Errorf("Replace: pattern wants String or Regex")
	case "Sequence":
		var seq sequenceDecoder
		for i, d := range c.Decoders {
			dd, err := parseDecoder(d, depth+1)
			if err != nil {
				return nil, fmt.Errorf("Sequence %d: %w", i, err)
			}
			if dd != nil {
				seq = append(seq, dd)
			}
		}
		return seq, nil
	}
	return nil, fmt.Errorf("decoder type %q is not supported (ByteLevel, Metaspace, WordPiece, BPEDecoder, ByteFallback, Fuse, Strip, Replace and Sequence are)", c.Type)
}

// Decode is the text of ids, as tokenizers' decode gives it; special
// tokens are left out when skipSpecial is set. Bytes that do not make a
// whole character are each rendered as U+FFFD.
func (t *Tokenizer) Decode(ids []int64, skipSpecial bool) string {
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		if skipSpecial && t.specialTokens[id] {
			continue
		}
		if tok := t.TokenText(id); tok != "" {
			tokens = append(tokens, tok)
		}
	}
	if t.decoder == nil {
		return strings.Join(tokens, " ")
	}
	return strings.Join(t.decoder.chain(tokens), "")
}

type byteLevelDecoder struct{}

// byteOf inverts byteChars.
var byteOf = func() map[rune]byte {
	m := make(map[rune]byte, 256)
	for b, r := range byteChars {
		m[r] = byte(b)
	}
	return m
}()

func (byteLevelDecoder) chain(tokens []string) []string {
	var b []byte
	for _, tok := range tokens {
		n := len(b)
		for _, r := range tok {
			c, ok := byteOf[r]
			if !ok {
				// Not in the byte alphabet (an added token's text): the
				// token as it is, as tokenizers does.
				b = append(b[:n], tok...)
				break
			}
			b = append(b, c)
		}
	}
	return []string{lossy(b)}
}

// lossy is b as text, each ill-formed part (a maximal subpart, as
// Unicode and Rust's from_utf8_lossy count them) rendered as U+FFFD.
func lossy(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r != utf8.RuneError || n > 1 {
			sb.Write(b[:n])
			b = b[n:]
			continue
		}
		sb.WriteRune(utf8.RuneError)
		b = b[maximalSubpart(b):]
	}
	return sb.String()
}

// maximalSubpart is how many bytes at b's start are an incomplete but
// well-formed beginning of a character (at least 1): one U+FFFD for all.
func maximalSubpart(b []byte) int {
	lead := b[0]
	lo, hi, need := byte(0x80), byte(0xBF), 0
	switch {
	case lead >= 0xC2 && lead <= 0xDF:
		need = 2
	case lead == 0xE0:
		lo, need = 0xA0, 3
	case lead == 0xED:
		hi, need = 0x9F, 3
	case lead >= 0xE1 && lead <= 0xEF:
		need = 3
	case lead == 0xF0:
		lo, need = 0x90, 4
	case lead == 0xF4:
		hi, need = 0x8F, 4
	case lead >= 0xF1 && lead <= 0xF3:
		need = 4
	default:
		return 1
	}
	k := 1
	for k < need && k < len(b) {
		c := b[k]
		if k == 1 && (c < lo || c > hi) || k > 1 && (c < 0x80 || c > 0xBF) {
			break
		}
		k++
	}
	return k
}

type metaspaceDecoder struct {
	replacement string
	strip       bool // the first token's replacements are dropped (the prefix the encoder added)
}

func (d metaspaceDecoder) chain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, tok := range tokens {
		with := " "
		if i == 0 && d.strip {
			with = "" // the first token's are the space the encoder prepended
		}
		out[i] = strings.ReplaceAll(tok, d.replacement, with)
	}
	return out
}

type wordPieceDecoder struct {
	prefix  string
	cleanup bool
}

func (d wordPieceDecoder) chain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, tok := range tokens {
		if i > 0 {
			if s, ok := strings.CutPrefix(tok, d.prefix); ok {
				tok = s
			} else {
				tok = " " + tok
			}
		}
		if d.cleanup {
			tok = cleanupSpaces.Replace(tok)
		}
		out[i] = tok
	}
	return out
}

// cleanupSpaces is tokenizers' clean-up of the spaces WordPiece puts
// before punctuation and contractions.
var cleanupSpaces = strings.NewReplacer(" .", ".", " ?", "?", " !", "!", " ,", ",", " ' ", "'",
	" n't", "n't", " 'm", "'m", " do not", " don't", " 's", "'s", " 've", "'ve", " 're", "'re")

type bpeDecoder struct{ suffix string }

func (d bpeDecoder) chain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, tok := range tokens {
		sep := " "
		if i == len(tokens)-1 {
			sep = ""
		}
		out[i] = strings.ReplaceAll(tok, d.suffix, sep)
	}
	return out
}

type byteFallbackDecoder struct{}

// byteToken is the byte a <0xXX> token stands for.
func byteToken(tok string) (byte, bool) {
	if len(tok) != 6 || !strings.HasPrefix(tok, "<0x") || tok[5] != '>' {
		return 0, false
	}
	v, err := strconv.ParseUint(tok[3:5], 16, 8)
	return byte(v), err == nil
}

func (byteFallbackDecoder) chain(tokens []string) []string {
	var out []string
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if utf8.Valid(pending) {
			out = append(out, string(pending))
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, tok := range tokens {
		if b, ok := byteToken(tok); ok {
			pending = append(pending, b)
			continue
		}
		flush()
		out = append(out, tok)
	}
	flush()
	return out
}

type fuseDecoder struct{}

func (fuseDecoder) chain(tokens []string) []string { return []string{strings.Join(tokens, "")} }

type stripDecoder struct {
	content     string
	start, stop int
}

func (d stripDecoder) chain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, tok := range tokens {
		for range d.start {
			s, ok := strings.CutPrefix(tok, d.content)
			if !ok {
				break
			}
			tok = s
		}
		for range d.stop {
			s, ok := strings.CutSuffix(tok, d.content)
			if !ok {
				break
			}
			tok = s
		}
		out[i] = tok
	}
	return out
}

type replaceDecoder struct {
	re      *regexp.Regexp
	content string
}

func (d replaceDecoder) chain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, tok := range tokens {
		out[i] = d.re.ReplaceAllLiteralString(tok, d.content)
	}
	return out
}

type sequenceDecoder []decoder

func (s sequenceDecoder) chain(tokens []string) []string {
	for _, d := range s {
		tokens = d.chain(tokens)
	}
	return tokens
}

// A Stream decodes generated ids one at a time into text deltas: each
// delta ends on a whole character, and the deltas together, with Flush's,
// are Decode of all the ids, byte for byte.
//
// It decodes a small window: the ids since the last delta, and the few
// before them (a decoder's output for a token can depend on the one
// before it: a space it adds or strips, a byte it completes).
type Stream struct {
	t           *Tokenizer
	skipSpecial bool
	ids         []int64
	prefix      int    // the window's first id
	read        int    // the ids up to here are in the deltas given out
	prefixText  string // Decode(ids[prefix:read])
}

// NewStream is a stream of t's decoding, leaving special tokens out with
// skipSpecial.
func (t *Tokenizer) NewStream(skipSpecial bool) *Stream {
	return &Stream{t: t, skipSpecial: skipSpecial}
}

// Next takes the next id and returns the text it completes: "" while it
// ends inside a character (or adds nothing).
func (s *Stream) Next(id int64) string {
	s.ids = append(s.ids, id)
	text := s.t.Decode(s.ids[s.prefix:], s.skipSpecial)
	if len(text) <= len(s.prefixText) || !strings.HasPrefix(text, s.prefixText) || strings.HasSuffix(text, "\uFFFD") {
		return "" // the window's text is not settled yet
	}
	delta := text[len(s.prefixText):]
	s.prefix, s.read = s.read, len(s.ids)
	s.prefixText = s.t.Decode(s.ids[s.prefix:s.read], s.skipSpecial)
	return delta
}

// Flush returns the text not given out yet, once the ids end: bytes that
// do not make a whole character are rendered as U+FFFD, as Decode renders
// them.
func (s *Stream) Flush() string {
	text := s.t.Decode(s.ids[s.prefix:], s.skipSpecial)
	s.prefix, s.read = len(s.ids), len(s.ids)
	rest := ""
	if len(text) > len(s.prefixText) {
		rest = text[len(s.prefixText):]
	}
	s.prefixText = ""
	return rest
}

// TokenBytes is the bytes token id stands for on its own: a byte-level
// or byte-fallback token's raw bytes even where they are part of a
// character (Decode renders those as U+FFFD, and OpenAI's logprobs carry
// the raw bytes so that a client can join them), else its decoded text.
func (t *Tokenizer) TokenBytes(id int64) []byte {
	if raw := rawBytes(t.decoder, t.TokenText(id)); raw != nil {
		return raw
	}
	return []byte(t.Decode([]int64{id}, false))
}

// rawBytes is what d makes of tok alone before it renders bytes as text;
// nil where d keeps no bytes apart from text.
func rawBytes(d decoder, tok string) []byte {
	switch d := d.(type) {
	case byteLevelDecoder:
		b := make([]byte, 0, len(tok))
		for _, r := range tok {
			c, ok := byteOf[r]
			if !ok {
				return []byte(tok) // an added token's text, as chain keeps it
			}
			b = append(b, c)
		}
		return b
	case byteFallbackDecoder:
		if b, ok := byteToken(tok); ok {
			return []byte{b}
		}
	case sequenceDecoder:
		for _, x := range d {
			if raw := rawBytes(x, tok); raw != nil {
				return raw
			}
		}
	}
	return nil
}
