package grammar

import (
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestUnsupportedSchemasRefusedByName(t *testing.T) {
	for schema, want := range map[string]string{
		`{"type":"object","properties":{"a":{"type":"object","patternProperties":{"x":{}}}}}`: `unsupported keyword "patternProperties" at /properties/a`,
		`{"type":"number","minimum":0}`:                                                       `unsupported keyword "minimum" on a number`,
		`{"type":"integer","minimum":5,"exclusiveMaximum":5}`:                                 `no integer between`,
		`{"type":"array","items":{"type":"string","foo":1}}`:                                  `unsupported keyword "foo" at /items`,
		`{"allOf":[{"type":"string"},{"type":"integer"}]}`:                                    `unsupported keyword "allOf" (of more than one schema) at /`,
		`{"type":"string","format":"hostname"}`:                                               `unsupported format "hostname" at /format`,
		`{"type":"decimal"}`:                                                                  `unsupported type "decimal" at /type`,
		`{"$ref":"#/$defs/missing"}`:                                                          `$ref "#/$defs/missing" at /`,
		`{"$ref":"other.json#/a"}`:                                                            `$ref "other.json#/a" at /`,
		`{"$ref":"#/$defs/a","$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"null"}]}}}`: `left-recursive`,
		`{"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/a"}}}`:                             `matches nothing`,
		`{"anyOf":[{"type":"string"}],"type":"string"}`:                                       `keyword "type" beside "anyOf" at /`,
		`{"type":"array","minItems":3,"maxItems":2}`:                                          `minItems above maxItems at /`,
		`{"type":"string","pattern":"\\bx"}`:                                                  `word boundaries`,
		`{"type":"object","required":["a"],"additionalProperties":false}`:                     `names "a", not in properties`,
		`{"type":"object","properties":{"a":false},"required":["a"]}`:                         `schema false at /properties/a`,
		`{"type":"object","properties":{"a/b":{"not":{}}}}`:                                   `unsupported keyword "not" at /properties/a~1b`,
		`{"type":"string","pattern":"a","maxLength":3}`:                                       `pattern beside format, minLength or maxLength`,
		`[1]`:      `schema at / is not an object`,
		`{"type":`: `not JSON`,
	} {
		_, err := FromJSONSchema([]byte(schema))
		if assert.Error(t, err, schema) {
			assert.Contains(t, err.Error(), want, schema)
		}
	}
}

// accepts feeds s token by token and reports whether it is accepted whole.
func accepts(c *Compiled, s string) bool {
	ids, _ := tokenize(c.v, s)
	m := c.NewMatcher()
	for _, id := range ids {
		if m.Accept(id) != nil {
			return false
		}
	}
	return m.Done()
}

func TestRegex(t *testing.T) {
	v, _ := testVocab()
	for pattern, cases := range map[string]map[string]bool{
		`[a-z]+@[a-z]+\.(com|org)`: {"ab@cd.com": true, "a@b.org": true, "ab@cd.net": false, "@cd.com": false, "ab@cd.com ": false},
		`\d{3}-\d{2,4}`:            {"123-45": true, "123-4567": true, "123-4": false, "12-45": false, "123-45678": false},
		`^(yes|no)$`:               {"yes": true, "no": true, "yesno": false, "": false},
		`[^a-c]\w\s?.`:             {"dx y": true, "ax y": false, "d_é": true, "d_\n": false},
		`日本+`:                      {"日本": true, "日本本本": true, "日": false},
		`(?i)ok`:                   {"OK": true, "oK": true, "no": false},
		`a*`:                       {"": true, "aaa": true, "b": false},
	} {
		g, err := FromRegex(pattern)
		require.NoError(t, err, pattern)
		c := Compile(g, v)
		for s, want := range cases {
			assert.Equal(t, want, accepts(c, s), "%q on %q", pattern, s)
		}
		for _, s := range []string{"ab@cd.com", "123-45", "日本本", "dx y"} {
			ids, _ := tokenize(v, s)
			m := c.NewMatcher()
			for _, id := range ids {
				checkMask(t, m, pattern+" on "+s)
				if m.Accept(id) != nil {
					break
				}
			}
		}
	}
	_, err := FromRegex(`a\bb`)
	assert.ErrorContains(t, err, "word boundaries")
	_, err = FromRegex(`a{2000}`)
	assert.Error(t, err)
	_, err = FromRegex(`a^b`)
	assert.ErrorContains(t, err, "^ only at the start")
}

func TestChoice(t *testing.T) {
	v, eos := testVocab()
	g, err := Choice([]string{"red", "green", "blue", "日本"})
	require.NoError(t, err)
	c := Compile(g, v)
	for _, s := range []string{"red", "green", "blue", "日本"} {
		assert.True(t, accepts(c, s), s)
	}
	for _, s := range []string{"re", "redd", "Red", "日"} {
		assert.False(t, accepts(c, s), s)
	}
	m := c.NewMatcher()
	mask := make([]uint32, v.MaskWords())
	m.Mask(mask)
	var firsts []string
	for id := range v.Size() {
		if allowed(mask, int32(id)) {
			firsts = append(firsts, string(v.tokens[id]))
		}
	}
	assert.ElementsMatch(t, []string{"r", "g", "b", "red", "green", "blue", "\xe6", "日本", "\xe6\x97"}, firsts)
	assert.False(t, allowed(mask, eos))
	_, err = Choice(nil)
	assert.Error(t, err)
}

func TestJSONObject(t *testing.T) {
	v, _ := testVocab()
	c := Compile(JSONObject(), v)
	for s, want := range map[string]bool{
		`{}`: true, `{"a":1}`: true, ` { "a" : [ 1 , { } ] , "b" : "é" }`: true, `{"a":{"b":{"c":[null,true,false,-0.5e-7]}}}`: true,
		`[]`: false, `1`: false, `{"a"}`: false, `{"a":1,}`: false, `{"a":01}`: false, `{}{}`: false,
	} {
		assert.Equal(t, want, accepts(c, s), s)
	}
}

func TestWhitespaceBounded(t *testing.T) {
	v, _ := testVocab()
	g, err := FromJSONSchemaWith([]byte(`{"type":"array","items":{"type":"null"}}`), JSONOptions{MaxWhitespace: 3})
	require.NoError(t, err)
	c := Compile(g, v)
	assert.True(t, accepts(c, "[   null   ]"))
	assert.False(t, accepts(c, "[    null]"))
	g, err = FromJSONSchemaWith([]byte(`{"type":"array","items":{"type":"null"}}`), JSONOptions{MaxWhitespace: -1})
	require.NoError(t, err)
	c = Compile(g, v)
	assert.True(t, accepts(c, "[null,null]"))
	assert.False(t, accepts(c, "[null, null]"))
}

func TestMatcherEdges(t *testing.T) {
	v, eos := testVocab()
	g, err := Choice([]string{"ab"})
	require.NoError(t, err)
	c := Compile(g, v)
	m := c.NewMatcher()
	assert.Error(t, m.Accept(eos), "EOS before the end")
	assert.Error(t, m.Accept(int32(v.Size())), "outside the vocabulary")
	assert.Error(t, m.Accept(int32(v.Size()-2)), "a special token")
	require.NoError(t, m.Accept('a'))
	assert.Error(t, m.Accept('c'))
	require.NoError(t, m.Accept('b'))
	assert.True(t, m.Done())
	mask := make([]uint32, v.MaskWords())
	m.Mask(mask)
	for id := range v.Size() {
		assert.Equal(t, int32(id) == eos, allowed(mask, int32(id)), "token %d", id)
	}
	require.NoError(t, m.Accept(eos))
	assert.True(t, m.Ended())
	m.Mask(mask)
	assert.Equal(t, make([]uint32, len(mask)), mask)
	assert.Error(t, m.Accept('a'))
}

func TestIntegerRanges(t *testing.T) {
	v, _ := testVocab()
	for _, r := range [][2]int64{{0, 0}, {-5, 5}, {7, 123}, {-123, -7}, {-100, 99}, {10, 19}, {1, 100}, {-1, 0}, {95, 105}} {
		var b builder
		rule := b.rule("range")
		b.define(rule, intRange(r[0], r[1]))
		g, err := b.build(rule)
		require.NoError(t, err)
		c := Compile(g, v)
		for x := int64(-150); x <= 150; x++ {
			assert.Equal(t, r[0] <= x && x <= r[1], accepts(c, strconv.FormatInt(x, 10)), "%d in %v", x, r)
		}
		assert.False(t, accepts(c, "-0"), "-0 in %v", r)
		assert.False(t, accepts(c, "007"), "007 in %v", r)
	}
	g, err := FromJSONSchema([]byte(`{"type":"integer","exclusiveMinimum":-2.5,"maximum":1e12}`))
	require.NoError(t, err)
	c := Compile(g, v)
	for s, want := range map[string]bool{"-2": true, "-3": false, "1000000000000": true, "1000000000001": false, "999999999999": true, "12": true} {
		assert.Equal(t, want, accepts(c, s), s)
	}
	g, err = FromJSONSchema([]byte(`{"type":"integer","minimum":0}`))
	require.NoError(t, err)
	c = Compile(g, v)
	for s, want := range map[string]bool{"0": true, "-1": false, "999999999999999999": true, "1000000000000000000": false} {
		assert.Equal(t, want, accepts(c, s), s)
	}
}

// TestRegexAgreesWithGo compares whole-string matching with Go's regexp
// on random strings over each pattern's alphabet.
func TestRegexAgreesWithGo(t *testing.T) {
	v, _ := testVocab()
	rng := rand.New(rand.NewPCG(9, 10))
	for _, tc := range []struct{ pattern, alphabet string }{
		{`[a-c]+(x|yz)?`, "abcxyz"},
		{`(ab|a)*b{1,3}`, "ab"},
		{`\d{2,3}(-\d+)*`, "019-"},
		{`[^b]?[é日]{0,2}.`, "abé日\n"},
		{`(a|b)*a(a|b){2}`, "ab"},
		{`\w+\s\W`, "a_ \t!"},
	} {
		g, err := FromRegex(tc.pattern)
		require.NoError(t, err, tc.pattern)
		c := Compile(g, v)
		re := regexp.MustCompile(`^(?:` + tc.pattern + `)$`)
		alpha := []rune(tc.alphabet)
		for range 300 {
			var sb strings.Builder
			for range rng.IntN(7) {
				sb.WriteRune(alpha[rng.IntN(len(alpha))])
			}
			s := sb.String()
			assert.Equal(t, re.MatchString(s), accepts(c, s), "%q on %q", tc.pattern, s)
		}
	}
}
