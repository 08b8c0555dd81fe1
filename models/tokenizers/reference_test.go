package tokenizers

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// refDir holds the reference script and its npm package (make deps
// installs it).
const refDir = "../testdata/tokref"

// refCase is a text, or a pair, to tokenize.
type refCase struct {
	Text string  `json:"text"`
	Pair *string `json:"pair,omitempty"`
}

// refTexts cover what the issue names: English, accents, Korean, Japanese,
// Chinese, emoji, punctuation, whitespace runs, special-token text, long
// words; and the corpus's own lines.
func refTexts(t *testing.T) []string {
	corpus, err := os.ReadFile(filepath.Join(testdata, "corpus.txt"))
	require.NoError(t, err)
	texts := []string{
		"Hello, world!", "The quick brown fox.", "", " ", "a", "don't stop, we're here; it's 3.14!",
		"Café naïve résumé Ångström Dvořák", "cafe\u0301 CAFÉ e\u0301le\u0300ve",
		"한국어 문장을 토큰으로 나눕니다.", "서울은 수도입니다", "日本語の文章もトークンに分けます。", "东京和北京是首都。",
		"emoji 🙂👍🎉 mixed🙂text", "👨‍👩‍👧 family", "arrows → ← and € £ ¥",
		"many    spaces   and\ttabs\nand newlines\n\n", "  leading and trailing  ",
		"<s> hello </s>", "hello <mask> world", "a<mask>b", "[CLS] [SEP] [MASK] [PAD]", "<pad><unk></s>",
		"<s", "mask>", "<<s>>", strings.Repeat("<s", 20),
		"extraordinarily antidisestablishmentarianism supercalifragilisticexpialidocious",
		strings.Repeat("abc", 60), strings.Repeat("x", 120), strings.Repeat("é", 110),
		"URLs like https://example.com/a?b=c&d=e and e-mail@example.org",
		"snake_case_names CamelCaseNames 2024-05-17 1,000,000",
		"ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３ ㈱ ﬁ ½", "Zürich straße ÜBER", "Ünïcödé",
		"\u00a0nbsp\u3000ideographic space",
		// Llama 3's and Qwen2's alternatives: contractions in any case,
		// digits in threes, punctuation with its newlines, newline runs.
		"IT'S ok, WE'LL see 'Re 'x \u0663'\u017f\u4e2de 'ſ", "1234567 and 12 and 3", "line1\r\n\r\n  line2\t\tx", "  \n  \n x  ", "end.\n\n\nnext!!\n",
		"\ttab\tword ,comma;semi", "½ ⅓ 4½ ٣٤٥ ᛮ",
	}
	for _, line := range strings.Split(string(corpus), "\n") {
		if line != "" {
			texts = append(texts, line)
		}
	}
	return texts
}

// TestAgreesWithTransformersJS tokenizes texts and pairs with each test
// tokenizer file here and with transformers.js, and wants the same ids
// (and token types, where the reference follows tokenizers' Rust).
func TestAgreesWithTransformersJS(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the transformers.js reference check is skipped (make deps installs its package; node comes from the system)")
	}
	if _, err := os.Stat(filepath.Join(refDir, "node_modules", "@huggingface", "tokenizers", "package.json")); err != nil {
		t.Skipf("@huggingface/tokenizers is not installed in %s: the transformers.js reference check is skipped; run make deps", refDir)
	}
	texts := refTexts(t)
	var cases []refCase
	for _, s := range texts {
		cases = append(cases, refCase{Text: s})
	}
	for i := 0; i+1 < len(texts); i += 3 {
		cases = append(cases, refCase{Text: texts[i], Pair: &texts[i+1]})
	}
	files := []string{"wordpiece.json", "unigram.json", "bpe.json", "bytefallback.json", "llama3.json", "qwen2.json"}
	type job struct {
		File  string    `json:"file"`
		Cases []refCase `json:"cases"`
	}
	var jobs []job
	for _, f := range files {
		abs, err := filepath.Abs(filepath.Join(testdata, f))
		require.NoError(t, err)
		jobs = append(jobs, job{abs, cases})
	}
	req := filepath.Join(t.TempDir(), "request.json")
	b, err := json.Marshal(jobs)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(req, b, 0o644))
	cmd := exec.Command(node, "tokref.mjs", req)
	cmd.Dir = refDir
	cmd.Stderr = os.Stderr
	outb, err := cmd.Output()
	require.NoError(t, err, "node tokref.mjs")
	var got [][]struct {
		IDs      []int64 `json:"ids"`
		TypeIDs  []int64 `json:"type_ids"`
		Text     string  `json:"text"`
		TextSkip string  `json:"text_skip"`
	}
	require.NoError(t, json.Unmarshal(outb, &got))
	require.Len(t, got, len(files))

	for k, f := range files {
		data, err := os.ReadFile(filepath.Join(testdata, f))
		require.NoError(t, err)
		tok, err := Parse(data)
		require.NoError(t, err)
		agree := 0
		for i, c := range cases {
			pair := ""
			if c.Pair != nil {
				pair = *c.Pair
			}
			toks, err := tok.Encode(c.Text, pair, c.Pair != nil, Options{})
			require.NoError(t, err)
			ids, types := make([]int64, len(toks)), make([]int64, len(toks))
			for j, tk := range toks {
				ids[j], types[j] = tk.ID, tk.TypeID
			}
			want := got[k][i]
			if fmt.Sprint(want.IDs) != fmt.Sprint(ids) {
				t.Errorf("%s: %q (pair %v): ids\nreference %v\ngot       %v", f, c.Text, c.Pair != nil, want.IDs, ids)
				continue
			}
			// transformers.js gives RoBERTa's second text type 1; tokenizers'
			// Rust (and the models) 0.
			if f != "bpe.json" && want.TypeIDs != nil && fmt.Sprint(want.TypeIDs) != fmt.Sprint(types) {
				t.Errorf("%s: %q: token types\nreference %v\ngot       %v", f, c.Text, want.TypeIDs, types)
				continue
			}
			// Decoding: whole, and streamed a token at a time.
			if text := tok.Decode(ids, false); text != want.Text {
				t.Errorf("%s: %q: decoded\nreference %q\ngot       %q", f, c.Text, want.Text, text)
				continue
			}
			if text := tok.Decode(ids, true); text != want.TextSkip {
				t.Errorf("%s: %q: decoded without special tokens\nreference %q\ngot       %q", f, c.Text, want.TextSkip, text)
				continue
			}
			if streamed := streamText(tok, ids, true); streamed != want.TextSkip {
				t.Errorf("%s: %q: streamed\nreference %q\ngot       %q", f, c.Text, want.TextSkip, streamed)
				continue
			}
			agree++
		}
		t.Logf("%s: %d of %d texts and pairs agree with transformers.js (ids, decoded, streamed)", f, agree, len(cases))
	}
}

// streamText is ids decoded through a Stream, its deltas and flush
// concatenated; every delta must be whole characters.
func streamText(tok *Tokenizer, ids []int64, skipSpecial bool) string {
	st := tok.NewStream(skipSpecial)
	var b strings.Builder
	for _, id := range ids {
		d := st.Next(id)
		if !utf8.ValidString(d) || strings.Contains(d, "\uFFFD") {
			return "a delta split a character: " + d
		}
		b.WriteString(d)
	}
	b.WriteString(st.Flush())
	return b.String()
}
