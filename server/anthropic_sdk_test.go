package server

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Anthropic's official TypeScript SDK (@anthropic-ai/sdk, pinned in
// testdata/anthropic-sdk; make deps installs it), unchanged, with its
// x-api-key: messages.create and messages.stream with a system prompt
// and turns, a tool call round trip, countTokens, and its error types.
func TestAnthropicSDK(t *testing.T) {
	f := newGenFixture(t, "")
	f.s.SetTokens([]string{"sk-ant-test"}, nil)
	schema := `{"type":"object","properties":{"a":{"enum":[1,2,3]},"b":{"type":"boolean"}},"required":["a","b"],"additionalProperties":false}`
	b := nodeScript(t, "anthropic-sdk", "@anthropic-ai/sdk", "client.mjs", f.srv.URL, "API_KEY=sk-ant-test", "SCHEMA="+schema)
	type usage struct {
		Input  int `json:"input_tokens"`
		Output int `json:"output_tokens"`
	}
	var out struct {
		Create struct {
			ID, Type, Role, Text, Stop string
			Usage                      usage
		}
		Stream struct {
			Text, Deltas, Stop string
			Usage              usage
		}
		Tool struct {
			Stop, Name, ID string
			Input          json.RawMessage
		}
		RoundTrip  string
		StreamTool struct {
			Stop, Name string
			Input      json.RawMessage
		}
		Count int
		Error struct {
			Status     int
			Type, Name string
		}
	}
	require.NoError(t, json.Unmarshal(b, &out), string(b))
	assert.Equal(t, "message", out.Create.Type)
	assert.Equal(t, "assistant", out.Create.Role)
	assert.Equal(t, "max_tokens", out.Create.Stop)
	assert.Equal(t, 16, out.Create.Usage.Output)
	assert.Equal(t, out.Count, out.Create.Usage.Input, "countTokens counts the prompt create ran on")
	assert.Equal(t, out.Create.Text, out.Stream.Text, "the stream assembles the greedy answer")
	assert.Equal(t, out.Stream.Text, out.Stream.Deltas)
	assert.Equal(t, "max_tokens", out.Stream.Stop)
	assert.Equal(t, out.Create.Usage, out.Stream.Usage)
	assert.Equal(t, "tool_use", out.Tool.Stop)
	validCall(t, out.Tool.Name, string(out.Tool.Input))
	assert.NotEmpty(t, out.RoundTrip)
	assert.Equal(t, "tool_use", out.StreamTool.Stop)
	assert.Equal(t, "add", out.StreamTool.Name)
	validCall(t, "add", string(out.StreamTool.Input))
	assert.Equal(t, 404, out.Error.Status)
	assert.Equal(t, "not_found_error", out.Error.Type)
	assert.Equal(t, "NotFoundError", out.Error.Name)
}
