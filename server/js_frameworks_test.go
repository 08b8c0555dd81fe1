package server

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

// The Vercel AI SDK (generateObject, streamObject, tool calls) and
// LangChain.js (withStructuredOutput by function calling and by JSON
// schema, bindTools with tool_choice required), pinned in
// testdata/js-frameworks (make deps installs them), run unchanged
// against the random-weight tiny-llama and get valid objects and calls.
func TestJSFrameworksStructuredOutputAndTools(t *testing.T) {
	if _, err := os.Stat("testdata/js-frameworks/node_modules/ai/package.json"); err != nil {
		t.Skip("the AI SDK and LangChain.js are not installed (make deps: npm ci in server/testdata/js-frameworks)")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node")
	}
	f := newGenFixture(t, "")
	cmd := exec.Command(node, "frameworks.mjs")
	cmd.Dir = "testdata/js-frameworks"
	cmd.Env = append(os.Environ(), "STEPSERVE_URL="+f.srv.URL, "RUNS=10")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	require.NoError(t, err, stderr.String())
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
