package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestChartSchemaIsCurrent fails when a configuration key was added or
// changed and the chart's values.schema.json was not regenerated: the
// chart would then refuse a key the server takes, or pass one it refuses.
func TestChartSchemaIsCurrent(t *testing.T) {
	path := "../../deploy/helm/stepserve/values.schema.json"
	have, err := os.ReadFile(path)
	require.NoError(t, err)
	want, err := render(have)
	require.NoError(t, err)
	assert.Equal(t, string(want), string(have), "%s is not current: run make schema", path)
}
