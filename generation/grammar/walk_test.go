package grammar

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func compileValidator(t *testing.T, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	require.NoError(t, err)
	jc := jsonschema.NewCompiler()
	jc.AssertFormat()
	require.NoError(t, jc.AddResource("schema.json", doc))
	sch, err := jc.Compile("schema.json")
	require.NoError(t, err)
	return sch
}

// TestRandomWalksValidate samples documents through the mask alone and
// checks each is JSON valid against its schema, the mask agreeing with
// Accept on every state of the first walks.
func TestRandomWalksValidate(t *testing.T) {
	v, _ := testVocab()
	rng := rand.New(rand.NewPCG(1, 2))
	walks := 40
	if testing.Short() {
		walks = 10
	}
	for _, tc := range schemaCorpus {
		t.Run(tc.name, func(t *testing.T) {
			g, err := FromJSONSchema([]byte(tc.schema))
			require.NoError(t, err)
			c := Compile(g, v)
			sch := compileValidator(t, tc.schema)
			ended := 0
			for w := range walks {
				doc, ok := walk(t, c, rng, 300, w < 3)
				if !ok {
					continue
				}
				ended++
				require.True(t, utf8.ValidString(doc), "%q", doc)
				require.True(t, json.Valid([]byte(doc)), "%q", doc)
				inst, err := jsonschema.UnmarshalJSON(strings.NewReader(doc))
				require.NoError(t, err, doc)
				require.NoError(t, sch.Validate(inst), "%q", doc)
			}
			assert.Greater(t, ended, walks/2, "walks that ended")
		})
	}
}

func TestRandomWalksRegex(t *testing.T) {
	v, _ := testVocab()
	rng := rand.New(rand.NewPCG(3, 4))
	for _, pattern := range []string{`[a-z]{2,5}@[a-z]+\.(com|org)`, `(\d{1,3}\.){3}\d{1,3}`, `"[^"\\]{0,8}"`, `(日本|é+)x?`} {
		g, err := FromRegex(pattern)
		require.NoError(t, err)
		c := Compile(g, v)
		for w := range 20 {
			doc, ok := walk(t, c, rng, 200, w < 2)
			if !ok {
				continue
			}
			assert.Regexp(t, "^(?:"+pattern+")$", doc, pattern)
		}
	}
}

// TestConcurrentMatchers runs matchers of one Compiled on many
// goroutines (the per-state entries are computed once, under a lock).
func TestConcurrentMatchers(t *testing.T) {
	v, _ := testVocab()
	g, err := FromJSONSchema([]byte(schemaCorpus[4].schema))
	require.NoError(t, err)
	c := Compile(g, v)
	doc := schemaCorpus[4].valid[1]
	ids, _ := tokenize(v, doc)
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			m := c.NewMatcher()
			mask := make([]uint32, v.MaskWords())
			for _, id := range ids {
				m.Mask(mask)
				if !allowed(mask, id) {
					errs <- fmt.Errorf("token %d masked out", id)
					return
				}
				if err := m.Accept(id); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		assert.NoError(t, <-errs)
	}
}

// TestMaskMatchesAcceptLargeVocab checks the mask against Accept on a
// generated vocabulary of random words, punctuation, whitespace runs,
// UTF-8 and random bytes.
func TestMaskMatchesAcceptLargeVocab(t *testing.T) {
	if testing.Short() {
		t.Skip("brute force over a large vocabulary")
	}
	v := bigVocab(20000)
	rng := rand.New(rand.NewPCG(5, 6))
	for _, schema := range []string{benchSchema, schemaCorpus[4].schema, schemaCorpus[13].schema} {
		g, err := FromJSONSchema([]byte(schema))
		require.NoError(t, err)
		c := Compile(g, v)
		sch := compileValidator(t, schema)
		for range 2 {
			doc, ok := walk(t, c, rng, 60, true)
			if ok {
				inst, err := jsonschema.UnmarshalJSON(strings.NewReader(doc))
				require.NoError(t, err, doc)
				require.NoError(t, sch.Validate(inst), "%q", doc)
			}
		}
	}
	g, err := FromJSONSchema([]byte(benchSchema))
	require.NoError(t, err)
	c := Compile(g, v)
	c.Warm()
	m := c.NewMatcher()
	for i, id := range greedy(v, benchDoc) {
		if i%4 == 0 {
			checkMask(t, m, fmt.Sprintf("benchDoc token %d", i))
		}
		require.NoError(t, m.Accept(id))
	}
}

// TestMaskDoesNotAllocate: once a state's entry is learnt, Mask and
// Accept reuse the matcher's scratch space.
func TestMaskDoesNotAllocate(t *testing.T) {
	v, _ := testVocab()
	g, err := FromJSONSchema([]byte(benchSchema))
	require.NoError(t, err)
	c := Compile(g, v)
	c.Warm()
	mask := make([]uint32, v.MaskWords())
	for _, prefix := range []string{`{"name": "The quick`, `{"name": "x", "age": 42, "tags": ["alpha", "bet`, `{"name": "x", "age": 4`} {
		m := c.NewMatcher()
		for _, id := range greedy(v, prefix) {
			require.NoError(t, m.Accept(id))
		}
		m.Mask(mask)
		assert.Zero(t, testing.AllocsPerRun(100, func() { m.Mask(mask) }), prefix)
	}
}
