package server

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// The Vercel AI SDK (generateObject, streamObject, tool calls) and
// LangChain.js (withStructuredOutput by function calling and by JSON
// schema, bindTools with tool_choice required), pinned in
// testdata/js-frameworks (make deps installs them), run unchanged
// against the random-weight tiny-llama and get valid objects and calls.
func TestJSFrameworksStructuredOutputAndTools(t *testing.T) {
	f := newGenFixture(t, "")
	b := nodeScript(t, "js-frameworks", "ai", "frameworks.mjs", f.srv.URL, "RUNS=10")
	type call struct {
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	}
	var out struct {
		AIObject, AIStream, LCStructured, LCJSONSchema []json.RawMessage
		AITools, LCTools                               [][]call
	}
	require.NoError(t, json.Unmarshal(b, &out), string(b))
	for name, objects := range map[string][]json.RawMessage{"generateObject": out.AIObject, "streamObject": out.AIStream,
		"withStructuredOutput": out.LCStructured, "withStructuredOutput jsonSchema": out.LCJSONSchema} {
		require.Len(t, objects, 10, name)
		for _, o := range objects {
			validStructured(t, string(o))
		}
	}
	for name, calls := range map[string][][]call{"AI SDK tools": out.AITools, "bindTools": out.LCTools} {
		require.Len(t, calls, 10, name)
		for i, cs := range calls {
			require.Len(t, cs, 1, "%s %d", name, i)
			validCall(t, cs[0].Name, string(cs[0].Input))
		}
	}
}
