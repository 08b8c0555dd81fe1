package tokenizers

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Bytes that do not make a whole character: one U+FFFD per maximal
// ill-formed part, as Rust's from_utf8_lossy renders them.
func TestLossy(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		want string
	}{
		{[]byte("ok é"), "ok é"},
		{[]byte{0xF0, 0x9F, 0x99}, "\uFFFD"},              // an emoji cut short
		{[]byte{'a', 0xFF, 0xFE, 'b'}, "a\uFFFD\uFFFDb"},  // bytes no character starts with
		{[]byte{0xE0, 0x80, 'x'}, "\uFFFD\uFFFDx"},        // E0 is not followed by 80
		{[]byte{0xED, 0xA0, 0x80}, "\uFFFD\uFFFD\uFFFD"},  // a surrogate
		{[]byte{0xE6, 0x97, 0xA5, 0xE6, 0x9C}, "日\uFFFD"}, // whole, then cut short
	} {
		assert.Equal(t, tc.want, lossy(tc.in), "% x", tc.in)
	}
}

// Streaming a byte-fallback tokenizer's ids: no delta splits a character
// (a character's bytes arrive as several tokens), the deltas are the
// whole text, and ids that end inside a character flush as U+FFFD, as
// Decode renders them.
func TestStreamNeverSplitsACharacter(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testdata, "bytefallback.json"))
	require.NoError(t, err)
	tok, err := Parse(data)
	require.NoError(t, err)
	text := "the 日本 🙂 end"
	toks, err := tok.Encode(text, "", false, Options{})
	require.NoError(t, err)
	ids := make([]int64, len(toks))
	for i, tk := range toks {
		ids[i] = tk.ID
	}
	assert.Greater(t, len(ids), utf8.RuneCountInString(text), "multibyte characters fall back to byte tokens")
	st := tok.NewStream(true)
	var b strings.Builder
	empty := 0
	for _, id := range ids {
		d := st.Next(id)
		require.True(t, utf8.ValidString(d) && !strings.Contains(d, "\uFFFD"), "delta %q", d)
		if d == "" {
			empty++
		}
		b.WriteString(d)
	}
	b.WriteString(st.Flush())
	assert.Equal(t, text, b.String())
	assert.Positive(t, empty, "the tokens inside a character add nothing until it is whole")

	// The ids end inside 🙂 (its last byte token dropped).
	cut := ids[:len(ids)-4]
	st = tok.NewStream(true)
	b.Reset()
	for _, id := range cut {
		b.WriteString(st.Next(id))
	}
	b.WriteString(st.Flush())
	assert.Equal(t, tok.Decode(cut, true), b.String())
	assert.True(t, strings.HasSuffix(b.String(), "\uFFFD"), "%q", b.String())
}

// Decoders where tokenizers' Rust has a rule of its own: a byte-level
// token outside the byte alphabet (an added token's text) is kept as it
// is; Metaspace drops every replacement in the first token.
func TestDecoderRules(t *testing.T) {
	bl, err := parseDecoder([]byte(`{"type": "ByteLevel"}`), 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"café x hi"}, bl.chain([]string{"café x", "Ġhi"}))
	ms, err := parseDecoder([]byte(`{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"}`), 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "  b"}, ms.chain([]string{"▁▁▁a", "▁▁b"}))
	never, err := parseDecoder([]byte(`{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never"}`), 0)
	require.NoError(t, err)
	assert.Equal(t, []string{" a", " b"}, never.chain([]string{"▁a", "▁b"}))
	_, err = parseDecoder([]byte(`{"type": "CTC"}`), 0)
	assert.ErrorContains(t, err, `decoder type "CTC" is not supported`)
}

// TokenBytes is a token's raw bytes: a byte-fallback token's byte and a
// byte-level token's bytes, even where alone they make no character.
func TestTokenBytes(t *testing.T) {
	for _, c := range []struct{ file, token string }{
		{"bytefallback.json", "<0xE2>"},
		{"bpe.json", "Ġ"},
	} {
		b, err := os.ReadFile(filepath.Join("../testdata/tokenizers", c.file))
		require.NoError(t, err)
		tok, err := Parse(b)
		require.NoError(t, err)
		id, ok := tok.ID(c.token)
		require.True(t, ok, "%s has %q", c.file, c.token)
		want := map[string][]byte{"<0xE2>": {0xE2}, "Ġ": {' '}}[c.token]
		assert.Equal(t, want, tok.TokenBytes(id), c.file)
	}
}
