package grammar

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// testPieces are the test vocabulary's tokens past the 256 single bytes:
// JSON punctuation that crosses values, words, and UTF-8 characters whole,
// cut in the middle, and glued across a character boundary.
var testPieces = []string{
	`{"`, `"}`, `":`, `": "`, `",`, `", "`, `"]`, `["`, `[{`, `}]`, `},`, `],`, `[]`, `{}`, `{ "`, `" }`,
	` "`, `  `, "\n  ", "\n", `, `, `: `, `":"`, `":{`, `":[`, `":1`, `,"`, `"},{"`,
	`true`, `false`, `null`, `tr`, `ue`, `fal`, `nu`, `ll`,
	`12`, `345`, `0.`, `.5`, `e+`, `-1`, `00`, `1,`, `2]`, `0}`,
	`\"`, `\\`, `\n`, `\u00`, `\u`,
	`name`, `age`, `tags`, `id`, `"name`, `"age`, `children`, `value`, `kind`, `hello`, `world`, ` world`,
	`ab`, `abc`, `cd`, `red`, `green`, `blue`, `ok`, `error`, `2024`, `-01`, `-15`, `T12`, `:30`, `:00Z`,
	"é", "日本", "\xe6\x97", "\xa5\xe6", "\xa9t", "😀", "\x9f\x98", "\x80\"", "é\"", `"日`,
}

// testVocab is the 256 single bytes, testPieces, a special token (nil)
// and an end-of-sequence token whose bytes must not count as text.
func testVocab() (*Vocab, int32) {
	var toks [][]byte
	for b := range 256 {
		toks = append(toks, []byte{byte(b)})
	}
	for _, p := range testPieces {
		toks = append(toks, []byte(p))
	}
	toks = append(toks, nil, []byte("</s>"))
	eos := int32(len(toks) - 1)
	return NewVocab(toks, []int32{eos}), eos
}

// tokenize splits s greedily, the longest token first, returning the
// tokens and the byte offset each starts at.
func tokenize(v *Vocab, s string) ([]int32, []int) {
	var ids []int32
	var offs []int
	for i := 0; i < len(s); {
		best, bestLen := int32(-1), 0
		for id, t := range v.tokens {
			if v.isEOS[id] || len(t) <= bestLen || len(t) > len(s)-i || string(t) != s[i:i+len(t)] {
				continue
			}
			best, bestLen = int32(id), len(t)
		}
		ids = append(ids, best)
		offs = append(offs, i)
		i += bestLen
	}
	return ids, offs
}

func allowed(mask []uint32, id int32) bool { return mask[id>>5]&(1<<(id&31)) != 0 }

// checkMask asserts that m's mask allows exactly the tokens m accepts.
func checkMask(t *testing.T, m *Matcher, where string) {
	t.Helper()
	v := m.c.v
	mask := make([]uint32, v.MaskWords())
	m.Mask(mask)
	for id := range v.Size() {
		ok := m.clone().Accept(int32(id)) == nil
		if ok != allowed(mask, int32(id)) {
			t.Fatalf("%s: token %d (%q): mask says %v, Accept says %v", where, id, v.tokens[id], allowed(mask, int32(id)), ok)
		}
	}
}

// walk samples a document from g, only tokens the mask allows, leaning
// towards closing as it grows; it returns the text and whether it ended.
func walk(t *testing.T, c *Compiled, rng *rand.Rand, maxTokens int, brute bool) (string, bool) {
	t.Helper()
	v := c.v
	m := c.NewMatcher()
	mask := make([]uint32, v.MaskWords())
	var out []byte
	for step := range maxTokens {
		if brute {
			checkMask(t, m, fmt.Sprintf("walk step %d after %q", step, out))
		}
		m.Mask(mask)
		var cands, quotes, brackets []int32
		for id := range v.Size() {
			if !allowed(mask, int32(id)) {
				continue
			}
			cands = append(cands, int32(id))
			if b := v.tokens[id]; v.isEOS[id] || b[0] == '"' {
				quotes = append(quotes, int32(id))
			} else if b[0] == '}' || b[0] == ']' {
				brackets = append(brackets, int32(id))
			}
		}
		require.NotEmpty(t, cands, "no token allowed after %q", out)
		pick := cands[rng.IntN(len(cands))]
		closing := quotes
		if len(closing) == 0 {
			closing = brackets
		}
		if len(closing) > 0 && rng.IntN(100) < min(70, 20+step) {
			pick = closing[rng.IntN(len(closing))]
		}
		if m.Done() && rng.IntN(3) == 0 {
			pick = v.eos[0]
		}
		require.NoError(t, m.Accept(pick), "after %q", out)
		if v.isEOS[pick] {
			return string(out), true
		}
		out = append(out, v.tokens[pick]...)
	}
	return string(out), false
}
