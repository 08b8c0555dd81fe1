package grammar

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// schemaCase is a schema with documents it accepts, and documents it
// refuses: § marks the first byte that cannot fit (at the end: the text
// is a prefix, but not complete).
type schemaCase struct {
	name    string
	schema  string
	valid   []string
	invalid []string
}

var schemaCorpus = []schemaCase{
	{"flat object", `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"],"additionalProperties":false}`,
		[]string{`{"name":"ab","age":12}`, `{ "name" : "日本", "age" : -1 }`, "{\n  \"name\": \"é\\\"😀\",\n  \"age\": 0\n}", ` {"name":"","age":345}`},
		[]string{`{"§age":12,"name":"x"}`, `{"name":"x"§}`, `{"name":"x","age":1.§5}`, `{"name":"x","age":0§1}`, `{"name":"x","age":1§`, `{"name":"x","age":1§,"b":1}`, `{"name":"x","age":1}§ `, `§[]`, `{"name":"a§` + "\x01" + `"}`}},
	{"optional properties", `{"type":"object","properties":{"a":{"type":"boolean"},"b":{"type":"null"},"c":{"type":"number"}},"required":["c"],"additionalProperties":false}`,
		[]string{`{"c":1}`, `{"a":true,"c":0.5}`, `{"b":null,"c":-12e+3}`, `{"a":false,"b":null,"c":2E5}`},
		[]string{`{"b":null,"§a":true,"c":1}`, `{"a":true§}`, `{"c":1.§}`, `{"a":tru§x,"c":1}`}},
	{"extra members allowed", `{"type":"object","properties":{"id":{"type":"integer"}},"required":["id"]}`,
		[]string{`{"id":1}`, `{"id":1,"x":[1,{"y":null}],"z":"w"}`},
		[]string{`{"§x":1,"id":1}`, `{"id":1,§}`}},
	{"nested object and array", `{"type":"object","properties":{"tags":{"type":"array","items":{"type":"string"},"minItems":1,"maxItems":3},"kind":{"type":"object","properties":{"value":{"type":"number"}},"required":["value"],"additionalProperties":false}},"required":["tags","kind"],"additionalProperties":false}`,
		[]string{`{"tags":["a"],"kind":{"value":1}}`, `{"tags":["a","b","c"],"kind":{"value":0.25}}`, `{"tags": [ "hello" , "world" ], "kind": {"value": 3}}`},
		[]string{`{"tags":[§],"kind":{"value":1}}`, `{"tags":["a","b","c"§,"d"],"kind":{"value":1}}`, `{"tags":["a"],"kind":{"value":1§,"x":2}}`}},
	{"recursive $ref", `{"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{"value":{"type":"integer"},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["value","children"],"additionalProperties":false}}}`,
		[]string{`{"value":1,"children":[]}`, `{"value":1,"children":[{"value":2,"children":[{"value":3,"children":[]}]},{"value":4,"children":[]}]}`},
		[]string{`{"value":1,"children":[{"value":2§}]}`, `{"value":1,"children":[{"§children":[]}]}`}},
	{"root recursion", `{"type":"object","properties":{"id":{"type":"string"},"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},"required":["id","next"],"additionalProperties":false}`,
		[]string{`{"id":"a","next":null}`, `{"id":"a","next":{"id":"b","next":null}}`},
		[]string{`{"id":"a","next":{"id":"b"§}}`, `{"id":"a","next":n§ope}`}},
	{"anyOf and oneOf", `{"anyOf":[{"type":"integer"},{"type":"array","items":{"oneOf":[{"type":"boolean"},{"type":"string"}]}}]}`,
		[]string{`12`, `[true,"x",false]`, `[]`},
		[]string{`1§.5`, `[§1]`, `§{}`}},
	{"enum and const", `{"type":"object","properties":{"color":{"enum":["red","green","blue",1,null]},"v":{"const":{"a":[1,"x"]}}},"required":["color","v"],"additionalProperties":false}`,
		[]string{`{"color":"red","v":{"a":[1,"x"]}}`, `{"color":1,"v":{"a":[1,"x"]}}`, `{"color":null,"v":{"a":[1,"x"]}}`},
		[]string{`{"color":"re§x","v":{"a":[1,"x"]}}`, `{"color":"red","v":{"a":[1,§ "x"]}}`}},
	{"nullable types", `{"type":"object","properties":{"a":{"type":["string","null"]},"b":{"type":["integer","boolean"]}},"required":["a","b"],"additionalProperties":false}`,
		[]string{`{"a":null,"b":true}`, `{"a":"x","b":-7}`},
		[]string{`{"a":§1,"b":1}`, `{"a":null,"b":1§.0}`}},
	{"integer versus number", `{"type":"array","items":{"type":"integer"}}`,
		[]string{`[1,-2,0,1234567890123456789]`, `[]`},
		[]string{`[1§.0]`, `[-§]`, `[1§e5]`, `[1234567890123456789§0]`}},
	{"string lengths", `{"type":"array","items":{"type":"string","minLength":2,"maxLength":3}}`,
		[]string{`["ab","abc","日本","é\"x","\u00e9x"]`},
		[]string{`["a§"]`, `["abc§d"]`, `["日本é§x"]`}},
	{"patterns", `{"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"},"any":{"type":"string","pattern":"a"}},"required":["code","any"],"additionalProperties":false}`,
		[]string{`{"code":"AB-123","any":"xxabyy"}`, `{"code":"ZZ-000","any":"ab"}`},
		[]string{`{"code":"A§1-123","any":"ab"}`, `{"code":"AB-123§4","any":"ab"}`, `{"code":"AB-123","any":"xy§"}`}},
	{"formats", `{"type":"array","items":{"anyOf":[{"type":"string","format":"date-time"},{"type":"string","format":"uuid"}]}}`,
		[]string{`["2024-01-15T12:30:00Z","123e4567-e89b-12d3-a456-426614174000","2024-02-28T00:00:00.5+01:00"]`},
		[]string{`["2024-1§3-01T00:00:00Z"]`, `["2024-02-§30T00:00:00Z"]`}},
	{"any value", `{}`,
		[]string{`1`, `"x"`, `{"a":[1,2,{"b":null}],"c":true}`, `[[],[[]],{}]`},
		[]string{`{"a" §1}`, `[1,§]`, `true§1`}},
	{"unicode keys and strings", `{"type":"object","properties":{"日本":{"type":"string"}},"required":["日本"],"additionalProperties":false}`,
		[]string{`{"日本":"😀é"}`, `{"日本":"\u65e5"}`},
		[]string{"{\"日\xe6§\x97\xa5\":\"\"}"}},
	{"additional properties by schema", `{"type":"object","properties":{"id":{"type":"string","const":"x\"y"}},"required":["id"],"additionalProperties":{"type":"array","items":{"type":"integer"},"maxItems":2}}`,
		[]string{`{"id":"x\"y"}`, `{"id":"x\"y","a":[1,2],"b":[]}`},
		[]string{`{"id":"x\"y","a":[1,2§,3]}`, `{"id":"x\"y","a":§1}`}},
	{"untyped and true", `{"type":"object","properties":{"a":true,"b":{"type":"object"},"c":{"type":"array"}},"required":["a","b","c"],"additionalProperties":false}`,
		[]string{`{"a":[1,"x"],"b":{"k":{}},"c":[null,{}]}`, `{"a":null,"b":{},"c":[]}`},
		[]string{`{"a":1,"b":§[],"c":[]}`}},
	{"more formats", `{"type":"object","properties":{"mail":{"type":"string","format":"email"},"ip":{"type":"string","format":"ipv4"},"d":{"type":"string","format":"date"},"t":{"type":"string","format":"time"}},"required":["mail","ip","d","t"],"additionalProperties":false}`,
		[]string{`{"mail":"ab.cd@ex-ample.com","ip":"192.168.0.1","d":"2024-12-31","t":"23:59:59.5-05:00"}`},
		[]string{`{"mail":"§@x.com","ip":"1.1.1.1","d":"2024-01-01","t":"00:00:00Z"}`, `{"mail":"a@b.co","ip":"25§6.1.1.1","d":"2024-01-01","t":"00:00:00Z"}`}},
	{"integer ranges", `{"type":"object","properties":{"age":{"type":"integer","minimum":0,"maximum":150},"delta":{"type":["integer","null"],"exclusiveMinimum":-10,"exclusiveMaximum":10}},"required":["age","delta"],"additionalProperties":false}`,
		[]string{`{"age":0,"delta":null}`, `{"age":150,"delta":-9}`, `{"age":42,"delta":9}`},
		[]string{`{"age":15§1,"delta":0}`, `{"age":-§1,"delta":0}`, `{"age":1,"delta":-1§0}`, `{"age":1,"delta":1§0}`}},
	{"array bounds exact", `{"type":"array","items":{"type":"boolean"},"minItems":2,"maxItems":2}`,
		[]string{`[true,false]`, `[ true , true ]`},
		[]string{`[true§]`, `[true,false§,true]`}},
}

// feed accepts doc's tokens; it returns the index of the first refused
// (len(tokens) for the end of sequence) or -1 when all and EOS pass.
func feed(t *testing.T, c *Compiled, eos int32, doc string) (int, []int) {
	t.Helper()
	ids, offs := tokenize(c.v, doc)
	m := c.NewMatcher()
	for i, id := range ids {
		if err := m.Accept(id); err != nil {
			return i, offs
		}
	}
	mask := make([]uint32, c.v.MaskWords())
	m.Mask(mask)
	if !m.Done() {
		assert.False(t, allowed(mask, eos), "EOS allowed before the end of %q", doc)
		return len(ids), offs
	}
	assert.True(t, allowed(mask, eos), "EOS refused after %q", doc)
	require.NoError(t, m.Accept(eos))
	return -1, offs
}

func TestSchemaCorpus(t *testing.T) {
	v, eos := testVocab()
	for _, tc := range schemaCorpus {
		t.Run(tc.name, func(t *testing.T) {
			g, err := FromJSONSchema([]byte(tc.schema))
			require.NoError(t, err)
			c := Compile(g, v)
			for _, doc := range tc.valid {
				bad, _ := feed(t, c, eos, doc)
				assert.Equal(t, -1, bad, "valid document %q refused at token %d", doc, bad)
			}
			for _, marked := range tc.invalid {
				at := strings.Index(marked, "§")
				require.GreaterOrEqual(t, at, 0, marked)
				doc := marked[:at] + marked[at+len("§"):]
				bad, offs := feed(t, c, eos, doc)
				want := len(offs) // the first token that holds byte at
				for i, o := range offs {
					if o > at {
						want = i - 1
						break
					}
				}
				if at < len(doc) && want == len(offs) {
					want = len(offs) - 1
				}
				assert.Equal(t, want, bad, "invalid document %q", marked)
			}
		})
	}
}

func TestSchemaCorpusMaskMatchesAccept(t *testing.T) {
	v, _ := testVocab()
	for _, tc := range schemaCorpus {
		t.Run(tc.name, func(t *testing.T) {
			g, err := FromJSONSchema([]byte(tc.schema))
			require.NoError(t, err)
			c := Compile(g, v)
			for _, doc := range tc.valid {
				ids, _ := tokenize(v, doc)
				m := c.NewMatcher()
				for i, id := range ids {
					checkMask(t, m, tc.name+": "+doc[:min(len(doc), 40)]+" before token "+string(rune('0'+i%10)))
					require.NoError(t, m.Accept(id))
				}
				checkMask(t, m, tc.name+": at the end of "+doc)
			}
		})
	}
}

// TestLargeSchemas compiles schemas that a naive expansion would blow
// up: many optional properties, a long enum, a long bounded string.
func TestLargeSchemas(t *testing.T) {
	v, eos := testVocab()
	var props, enum []string
	for i := range 100 {
		props = append(props, fmt.Sprintf(`"p%d":{"type":"integer"}`, i))
	}
	for i := range 1000 {
		enum = append(enum, fmt.Sprintf(`"value %d"`, i))
	}
	for _, tc := range []schemaCase{
		{"100 optional properties", `{"type":"object","properties":{` + strings.Join(props, ",") + `},"additionalProperties":false}`,
			[]string{`{}`, `{"p3":1,"p50":2,"p99":3}`, `{"p0":0}`},
			[]string{`{"p50":1,"p§3":2}`, `{"p10§0":1}`}},
		{"long enum", `{"enum":[` + strings.Join(enum, ",") + `]}`,
			[]string{`"value 0"`, `"value 999"`, `"value 500"`},
			[]string{`"value 100§0"`, `"value §x"`}},
		{"long string", `{"type":"string","maxLength":300}`,
			[]string{`"` + strings.Repeat("ab", 150) + `"`, `""`},
			[]string{`"` + strings.Repeat("é", 300) + `§x"`}},
	} {
		g, err := FromJSONSchema([]byte(tc.schema))
		require.NoError(t, err, tc.name)
		c := Compile(g, v)
		for _, doc := range tc.valid {
			bad, _ := feed(t, c, eos, doc)
			assert.Equal(t, -1, bad, "%s: %q", tc.name, doc)
		}
		for _, marked := range tc.invalid {
			doc := strings.Replace(marked, "§", "", 1)
			bad, offs := feed(t, c, eos, doc)
			at := strings.Index(marked, "§")
			require.GreaterOrEqual(t, bad, 0, "%s: %q accepted", tc.name, marked)
			assert.LessOrEqual(t, offs[bad], at, "%s: %q", tc.name, marked)
			if bad+1 < len(offs) {
				assert.Greater(t, offs[bad+1], at, "%s: %q", tc.name, marked)
			}
		}
	}
}
