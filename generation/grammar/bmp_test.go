package grammar

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A bounded string holds characters of the Basic Multilingual Plane
// only, so that its bound holds counted in code points and in UTF-16
// units alike (zod's .max(n) counts a character past U+FFFF as two); an
// unbounded string takes any.
func TestBoundedStringsStayInTheBMP(t *testing.T) {
	v, eos := testVocab()
	feed := func(schema, doc string) error {
		g, err := FromJSONSchema([]byte(schema))
		require.NoError(t, err)
		m := Compile(g, v).NewMatcher()
		ids, _ := tokenize(v, doc)
		for _, id := range ids {
			if err := m.Accept(id); err != nil {
				return err
			}
		}
		return m.Accept(eos)
	}
	assert.NoError(t, feed(`{"type":"string","maxLength":3}`, `"é本x"`), "BMP characters, one each")
	assert.Error(t, feed(`{"type":"string","maxLength":3}`, `"🙂"`), "a character past U+FFFF in a bounded string")
	assert.Error(t, feed(`{"type":"string","minLength":1}`, `"🙂"`))
	assert.NoError(t, feed(`{"type":"string"}`, `"🙂 é"`), "any character in an unbounded string")
}
