package grammar

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

const benchSchema = `{"type":"object","properties":{
	"name":{"type":"string"},"age":{"type":"integer"},
	"tags":{"type":"array","items":{"type":"string"},"maxItems":8},
	"address":{"type":"object","properties":{"street":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["street","zip"],"additionalProperties":false},
	"score":{"type":["number","null"]},"status":{"enum":["active","inactive"]}},
	"required":["name","age","tags","address","score","status"],"additionalProperties":false}`

const benchDoc = `{"name": "The quick brown fox jumps over the lazy dog, again and again, é 日本", "age": 42, ` +
	`"tags": ["alpha", "beta gamma", "delta"], "address": {"street": "1600 Amphitheatre Parkway", "zip": "94043"}, ` +
	`"score": 0.875, "status": "active"}`

// bigVocab is a vocabulary of Llama 3's size: the 256 single bytes, then
// random tokens of 2 to 16 bytes, mostly ASCII words (often after a
// space), punctuation, whitespace runs and digits, some UTF-8.
func bigVocab(n int) *Vocab {
	rng := rand.New(rand.NewPCG(7, 8))
	seen := map[string]bool{}
	var toks [][]byte
	for b := range 256 {
		toks = append(toks, []byte{byte(b)})
		seen[string([]byte{byte(b)})] = true
	}
	word := func(k int) string {
		var sb strings.Builder
		for range k {
			sb.WriteByte(byte('a' + rng.IntN(26)))
		}
		return sb.String()
	}
	const punct = `{}[]",:.;!?()-_'/\#*`
	for len(toks) < n-1 {
		var s string
		switch r := rng.IntN(100); {
		case r < 40:
			s = " " + word(1+rng.IntN(10))
		case r < 65:
			s = word(2 + rng.IntN(10))
		case r < 77:
			k := 2 + rng.IntN(3)
			var sb strings.Builder
			for range k {
				sb.WriteByte(punct[rng.IntN(len(punct))])
			}
			s = sb.String()
		case r < 85:
			s = strings.Repeat(" ", 1+rng.IntN(12))
			if rng.IntN(2) == 0 {
				s = "\n" + s
			}
		case r < 92:
			b := make([]byte, 2+rng.IntN(3))
			for i := range b {
				b[i] = byte('0' + rng.IntN(10))
			}
			s = string(b)
		case r < 97:
			s = []string{"é", "日本", "ü", "中文", "ñ", "ö"}[rng.IntN(6)] + word(rng.IntN(4))
		default:
			b := make([]byte, 2+rng.IntN(4))
			for i := range b {
				b[i] = byte(rng.IntN(256))
			}
			s = string(b)
		}
		if len(s) < 2 || len(s) > 16 || seen[s] {
			continue
		}
		seen[s] = true
		toks = append(toks, []byte(s))
	}
	toks = append(toks, nil) // EOS: a special token with no text
	return NewVocab(toks, []int32{int32(len(toks) - 1)})
}

// greedy splits s into v's longest tokens (up to 16 bytes).
func greedy(v *Vocab, s string) []int32 {
	byText := make(map[string]int32, v.Size())
	for id, t := range v.tokens {
		if len(t) > 0 && !v.isEOS[id] {
			if _, ok := byText[string(t)]; !ok {
				byText[string(t)] = int32(id)
			}
		}
	}
	var ids []int32
	for i := 0; i < len(s); {
		for k := min(16, len(s)-i); k > 0; k-- {
			if id, ok := byText[s[i:i+k]]; ok {
				ids = append(ids, id)
				i += k
				break
			}
		}
	}
	return ids
}

// matcherAt is a matcher past the tokens of prefix.
func matcherAt(b *testing.B, c *Compiled, prefix string) *Matcher {
	m := c.NewMatcher()
	for _, id := range greedy(c.v, prefix) {
		if err := m.Accept(id); err != nil {
			b.Fatalf("prefix %q: %v", prefix, err)
		}
	}
	return m
}

// reportQuantiles reports the median and 99th percentile of d.
func reportQuantiles(b *testing.B, d []time.Duration) {
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(d[len(d)*99/100].Nanoseconds())/1e3, "p99-µs")
}

func benchMask(b *testing.B, v *Vocab) {
	g, err := FromJSONSchema([]byte(benchSchema))
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct{ name, prefix string }{
		{"in-string", `{"name": "The quick brown fox jum`},
		{"between-values", `{"name": "x", "age": 42, "tags": ["alpha", `},
		{"after-key", `{"name": "x", "age": `},
		{"in-array-string", `{"name": "x", "age": 42, "tags": ["alpha", "bet`},
		{"in-number", `{"name": "x", "age": 4`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := Compile(g, v)
			m := matcherAt(b, c, tc.prefix)
			mask := make([]uint32, v.MaskWords())
			m.Mask(mask) // the state's entries, once
			d := make([]time.Duration, 0, 1<<16)
			for b.Loop() {
				t0 := time.Now()
				m.Mask(mask)
				d = append(d, time.Since(t0))
			}
			reportQuantiles(b, d)
		})
	}
	// Every state of a whole document, warm: the entries met on a first
	// pass (whose total is reported as cold-ms) are reused. warm-ms is
	// what Warm takes to learn every state's entry.
	b.Run("document", func(b *testing.B) {
		c := Compile(g, v)
		ids := greedy(v, benchDoc)
		mask := make([]uint32, v.MaskWords())
		pass := func(d []time.Duration) []time.Duration {
			m := c.NewMatcher()
			for _, id := range ids {
				t0 := time.Now()
				m.Mask(mask)
				d = append(d, time.Since(t0))
				if mask[id>>5]&(1<<(id&31)) == 0 {
					b.Fatalf("token %d (%q) masked out", id, v.tokens[id])
				}
				if err := m.Accept(id); err != nil {
					b.Fatal(err)
				}
			}
			return d
		}
		t0 := time.Now()
		pass(nil)
		cold := time.Since(t0)
		var d []time.Duration
		for b.Loop() {
			d = pass(d)
		}
		b.ReportMetric(float64(cold.Microseconds())/1e3, "cold-ms/doc")
		t0 = time.Now()
		Compile(g, v).Warm()
		b.ReportMetric(float64(time.Since(t0).Microseconds())/1e3, "warm-ms")
		b.ReportMetric(float64(g.NumStates()), "states")
		b.ReportMetric(float64(len(ids)), "tokens/doc")
		reportQuantiles(b, d)
	})
}

func BenchmarkMaskTiny(b *testing.B) {
	v, _ := testVocab()
	benchMask(b, v)
}

func BenchmarkMask128k(b *testing.B) { benchMask(b, bigVocab(128256)) }
