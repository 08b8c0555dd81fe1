package tokenizers

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var fileNames = []string{"wordpiece.json", "unigram.json", "bpe.json"}

func loadAll(t testing.TB) map[string]*Tokenizer {
	out := map[string]*Tokenizer{}
	for _, f := range fileNames {
		data, err := os.ReadFile(filepath.Join(testdata, f))
		require.NoError(t, err)
		tok, err := Parse(data)
		require.NoError(t, err)
		out[f] = tok
	}
	return out
}

func pieceStrings(t text, pieces []text) []string {
	var out []string
	for _, p := range pieces {
		out = append(out, string(p.s))
	}
	return out
}

func TestSplitBehaviors(t *testing.T) {
	// tokenizers' documentation example for each behavior.
	s := newText("the-final--countdown", 0)
	m := literal("-").findAll(s.s)
	for b, want := range map[splitBehavior][]string{
		splitRemoved:            {"the", "final", "countdown"},
		splitIsolated:           {"the", "-", "final", "-", "-", "countdown"},
		splitMergedWithPrevious: {"the-", "final-", "-", "countdown"},
		splitMergedWithNext:     {"the", "-final", "-", "-countdown"},
		splitContiguous:         {"the", "-", "final", "--", "countdown"},
	} {
		assert.Equal(t, want, pieceStrings(s, splitByMatches(nil, s, m, b, false)), "behavior %d", b)
	}
}

func TestGPT2Pattern(t *testing.T) {
	s := newText("Hello  world's 42x!! \t\nend  ", 0)
	got := pieceStrings(s, splitByMatches(nil, s, gpt2Matcher{}.findAll(s.s), splitIsolated, false))
	assert.Equal(t, []string{"Hello", " ", " world", "'s", " 42", "x", "!!", " \t", "\n", "end", "  "}, got)
}

func TestOnigurumaShorthandsAreUnicode(t *testing.T) {
	m, err := compilePattern(patternConfig{Regex: ptr(`\s+`)})
	require.NoError(t, err)
	assert.Equal(t, [][2]int{{1, 4}}, m.findAll([]byte("a\u3000b")), "an ideographic space is \\s")
	_, err = compilePattern(patternConfig{Regex: ptr(`\s+(?!\S)`)})
	assert.ErrorContains(t, err, "is not supported")
}

// TestPrecompiledCharsmap decodes a hand-built darts-clone trie mapping
// "a" to "b" and the fullwidth "Ａ" to "A".
func TestPrecompiledCharsmap(t *testing.T) {
	// Root unit 0: offset 1. "a" (0x61) is at 1^0x61 = 0x60: label 0x61,
	// a leaf, offset 1 to its value at 0x61: 0 (the first string).
	units := make([]uint32, 0x62)
	units[0] = 1 << 10
	units[0x60] = 0x61 | 1<<8 | 1<<10
	units[0x61] = 1 << 31 // leaf flag, value offset 0
	blob := []byte("b\x00")
	charsmap := binary.LittleEndian.AppendUint32(nil, uint32(4*len(units)))
	for _, u := range units {
		charsmap = binary.LittleEndian.AppendUint32(charsmap, u)
	}
	charsmap = append(charsmap, blob...)
	n := newPrecompiled(charsmap)
	require.IsType(t, &precompiled{}, n)
	got := n.normalize(newText("xay a", 0))
	assert.Equal(t, "xby b", string(got.s))
	assert.Equal(t, span{1, 2}, got.al[1])

	assert.IsType(t, nmtFallback{}, newPrecompiled(nil), "no charsmap: the nmt_nfkc rules")
	assert.Equal(t, "A1 x", string(newPrecompiled(nil).normalize(newText("Ａ１\u3000x\u0001", 0)).s))
}

func TestTruncationStrategies(t *testing.T) {
	tok := loadAll(t)["wordpiece.json"]
	a, b := strings.Repeat("the ", 20), strings.Repeat("fox ", 5)
	for _, c := range []struct {
		strategy string
		n1, n2   int
	}{{"LongestFirst", 20 - 9, 5}, {"OnlyFirst", 11, 5}, {"OnlySecond", 20, -1}} {
		tok.strategy = c.strategy
		toks, err := tok.Encode(a, b, true, Options{MaxLen: 19, Truncate: true})
		if c.n2 < 0 {
			assert.Error(t, err, "only_second cannot cut enough")
			continue
		}
		require.NoError(t, err)
		n := [2]int{}
		for _, tk := range toks {
			if tk.Seq >= 0 {
				n[tk.Seq]++
			}
		}
		assert.Equal(t, [2]int{c.n1, c.n2}, n, c.strategy)
		assert.Len(t, toks, 19)
	}
	tok.strategy = "LongestFirst"
	_, err := tok.Encode(a, b, true, Options{MaxLen: 19})
	assert.Equal(t, &TooLongError{28, 19}, err)
}

// hostile are texts that would make a quadratic stage crawl: 1 MB each,
// or 64 KB under -short (make test; make test-long runs the 1 MB ones).
func hostile() map[string]string {
	mb := 1 << 20
	if testing.Short() {
		mb = 64 << 10
	}
	return map[string]string{
		"one word":          strings.Repeat("a", mb),
		"one word of runs":  strings.Repeat("abcdefghij", mb/10),
		"emoji":             strings.Repeat("🙂", mb/4),
		"emoji ZWJ":         strings.Repeat("👨\u200d", mb/7),
		"combining marks":   "e" + strings.Repeat("\u0301", mb/2),
		"marks and bases":   strings.Repeat("e\u0301\u0316", mb/5),
		"special lookalike": strings.Repeat("<s", mb/2),
		"mask lookalike":    strings.Repeat("<mask", mb/5),
		"almost specials":   strings.Repeat("</s<mask<pad", mb/12),
		"spaces":            strings.Repeat(" ", mb),
		"CJK":               strings.Repeat("東", mb/3),
		"digits":            strings.Repeat("9", mb),
		"invalid UTF-8":     strings.Repeat("\xff\xfe", mb/2),
	}
}

// TestHostileTextIsLinear tokenizes each hostile text whole with each
// tokenizer (a quadratic stage would not finish in the test's time), and
// truncated, where it must stop at the limit.
func TestHostileTextIsLinear(t *testing.T) {
	for name, tok := range loadAll(t) {
		for kind, s := range hostile() {
			toks, err := tok.Encode(s, "", false, Options{})
			require.NoError(t, err, "%s: %s", name, kind)
			require.NotEmpty(t, toks)
			checkOffsets(t, toks, [2]string{s})
			toks, err = tok.Encode(s, s, true, Options{MaxLen: 512, Truncate: true})
			require.NoError(t, err, "%s: %s", name, kind)
			assert.LessOrEqual(t, len(toks), 512, "%s: %s", name, kind)
		}
	}
}

// checkOffsets holds every token's offsets inside its text, in order.
func checkOffsets(t testing.TB, toks []Token, texts [2]string) {
	last := [2]int{}
	for i, tk := range toks {
		if tk.Seq < 0 {
			if tk.Start != tk.Stop {
				t.Fatalf("inserted token %d: %+v is not empty", i, tk)
			}
			continue
		}
		s := texts[tk.Seq]
		if tk.Start < 0 || tk.Start > tk.Stop || tk.Stop > len(s) || tk.Start < last[tk.Seq] {
			t.Fatalf("token %d: %+v out of order or outside the text of %d bytes (last start %d)", i, tk, len(s), last[tk.Seq])
		}
		last[tk.Seq] = tk.Start
	}
}

// FuzzEncode tokenizes any text (and pair) with each test tokenizer: no
// panic, offsets in the text and in order, truncation keeping to its
// limit and to a prefix of the whole encoding.
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"Hello, world!", "Café 🙂 <mask> 서울 東京", "<s></s><pad>", "a\u0301\u0301b", " \t\n ", "\xff", "'s'll 42"} {
		f.Add(s, "pair text")
	}
	toks := loadAll(f)
	f.Fuzz(func(t *testing.T, s, pair string) {
		for name, tok := range toks {
			whole, err := tok.Encode(s, pair, true, Options{})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			checkOffsets(t, whole, [2]string{s, pair})
			single, err := tok.Encode(s, "", false, Options{})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			checkOffsets(t, single, [2]string{s})
			cut, err := tok.Encode(s, "", false, Options{MaxLen: 8, Truncate: true})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if len(cut) > 8 {
				t.Fatalf("%s: %d tokens truncated to 8", name, len(cut))
			}
			for i := 1; i < len(cut)-1; i++ { // the content tokens are the whole's first
				if cut[i].ID != single[i].ID {
					t.Fatalf("%s: truncated %v is not a prefix of %v", name, cut, single)
				}
			}
		}
	})
}

// TestNormalizersThatExplodeAreRefused: a tokenizer.json whose normalizers
// could make much more text than they are given is refused at load, with
// the growth named; the chains real tokenizers use load.
func TestNormalizersThatExplodeAreRefused(t *testing.T) {
	wordPiece := `"model":{"type":"WordPiece","unk_token":"[UNK]","vocab":{"[UNK]":0,"a":1}}`
	rep := func(pattern, content string) string {
		return `{"type":"Replace","pattern":` + pattern + `,"content":"` + content + `"}`
	}
	hundred := strings.Repeat("a", 100)
	for _, tc := range []struct {
		normalizer string
		ok         bool
	}{
		{`{"type":"Sequence","normalizers":[` + strings.Repeat(rep(`{"String":"a"}`, hundred)+",", 3) + rep(`{"String":"a"}`, hundred) + `]}`, false},
		{rep(`{"Regex":"x*"}`, strings.Repeat("b", 300)), false}, // matches the empty string: content at every position
		{rep(`{"String":"a"}`, strings.Repeat("b", 300)), false},
		{`{"type":"BertNormalizer"}`, true},
		{`{"type":"Sequence","normalizers":[{"type":"NFKC"},` + rep(`{"Regex":" {2,}"}`, "\u2581") + `]}`, true},
		{`{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"\u2581"},` + rep(`{"String":" "}`, "\u2581") + `]}`, true},
	} {
		_, err := Parse([]byte(`{"normalizer":` + tc.normalizer + `,` + wordPiece + `}`))
		if tc.ok {
			assert.NoError(t, err, tc.normalizer)
		} else {
			assert.ErrorContains(t, err, "could make up to", tc.normalizer)
		}
	}
	_, err := Parse([]byte(`{"added_tokens":[{"id":2,"content":"` + strings.Repeat("x", 5000) + `","special":true}],` + wordPiece + `}`))
	assert.ErrorContains(t, err, "added_tokens[0]: content of 5000 bytes; want at most 1024")
}
