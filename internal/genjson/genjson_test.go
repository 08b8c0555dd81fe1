package genjson

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMarshal(t *testing.T) {
	b, err := Marshal(map[string]any{"expr": "a > 0 && b < 1", "n": []int{1}})
	require.NoError(t, err)
	assert.Equal(t, "{\n  \"expr\": \"a > 0 && b < 1\",\n  \"n\": [\n    1\n  ]\n}\n", string(b))
}
