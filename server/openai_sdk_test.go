package server

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The official OpenAI Node SDK (npm openai, pinned in
// testdata/openai-sdk; make deps installs it) works unchanged against the
// generation APIs: models, completions and chat, whole and streamed, its
// stream helper, and its error type.
func TestOpenAINodeSDK(t *testing.T) {
	f := newGenFixture(t, "")
	b := nodeScript(t, "openai-sdk", "openai", "client.mjs", f.srv.URL)
	var out struct {
		Models     []string `json:"models"`
		Completion struct {
			Text   string         `json:"text"`
			Finish string         `json:"finish"`
			Usage  map[string]int `json:"usage"`
		} `json:"completion"`
		CompletionStream string `json:"completionStream"`
		Chat             struct {
			Content, Role, Finish string
			Usage                 map[string]int `json:"usage"`
		} `json:"chat"`
		ChatStream struct {
			Content string
			Finish  string
			Usage   map[string]int `json:"usage"`
		} `json:"chatStream"`
		ChatHelper string `json:"chatHelper"`
		Error      struct {
			Status int
			Param  string
			Type   string
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(b, &out), string(b))
	assert.Contains(t, out.Models, "tiny-llama")
	assert.NotEmpty(t, out.Completion.Text)
	assert.Equal(t, "length", out.Completion.Finish)
	assert.Equal(t, 24, out.Completion.Usage["completion_tokens"])
	assert.Equal(t, out.Completion.Text, out.CompletionStream)
	assert.Equal(t, "assistant", out.Chat.Role)
	assert.Equal(t, out.Chat.Content, out.ChatStream.Content)
	assert.Equal(t, out.Chat.Content, out.ChatHelper)
	assert.Equal(t, "length", out.ChatStream.Finish)
	assert.Equal(t, out.Chat.Usage, out.ChatStream.Usage)
	assert.Equal(t, 400, out.Error.Status)
	assert.Equal(t, "n", out.Error.Param)
	assert.Equal(t, "invalid_request_error", out.Error.Type)
}

// Structured output through the SDK, 50 of 50 on the random-weight
// tiny-llama (only the constraint can make its output valid): the
// whole answers and the streamed ones of response_format json_schema
// validate against the schema, and the SDK's parse helper with a zod
// schema parses every answer.
func TestOpenAINodeSDKStructuredOutput(t *testing.T) {
	f := newGenFixture(t, "")
	b := nodeScript(t, "openai-sdk", "zod", "structured.mjs", f.srv.URL, "RUNS=50", "SCHEMA="+structuredSchema)
	type answer struct {
		Content string          `json:"content"`
		Finish  string          `json:"finish"`
		Parsed  json.RawMessage `json:"parsed"`
	}
	var out struct{ Whole, Streamed, Parsed []answer }
	require.NoError(t, json.Unmarshal(b, &out), string(b))
	for name, answers := range map[string][]answer{"whole": out.Whole, "streamed": out.Streamed, "parsed": out.Parsed} {
		require.Len(t, answers, 50, name)
		for i, a := range answers {
			assert.Equal(t, "stop", a.Finish, "%s %d: %q", name, i, a.Content)
			validStructured(t, a.Content)
			if name == "parsed" {
				assert.JSONEq(t, a.Content, string(a.Parsed), "the SDK parsed the answer with zod")
			}
		}
	}
}

// Tool calling through the SDK on the random-weight tiny-llama:
// tool_choice required gives a call of an offered function with valid
// arguments 50 of 50 (and through the SDK's stream helper), auto gives
// text or a call but never a malformed one, and a call's result goes
// back in the history.
func TestOpenAINodeSDKTools(t *testing.T) {
	f := newGenFixture(t, "")
	b := nodeScript(t, "openai-sdk", "openai", "tools.mjs", f.srv.URL, "RUNS=50", "TOOLS="+string(testTools))
	type call struct{ ID, Type, Name, Arguments string }
	type answer struct {
		Calls   []call
		Content *string
		Finish  string
	}
	var out struct {
		Required, Streamed, Auto []answer
		Answered                 string
	}
	require.NoError(t, json.Unmarshal(b, &out), string(b))
	require.Len(t, out.Required, 50)
	require.Len(t, out.Streamed, 10)
	for name, answers := range map[string][]answer{"required": out.Required, "streamed": out.Streamed} {
		for i, a := range answers {
			assert.Equal(t, "tool_calls", a.Finish, "%s %d", name, i)
			require.Len(t, a.Calls, 1, "%s %d", name, i)
			assert.Equal(t, "function", a.Calls[0].Type)
			assert.NotEmpty(t, a.Calls[0].ID)
			validCall(t, a.Calls[0].Name, a.Calls[0].Arguments)
		}
	}
	for i, a := range out.Auto {
		if len(a.Calls) == 0 {
			assert.NotNil(t, a.Content, "auto %d: text", i)
			continue
		}
		for _, c := range a.Calls {
			validCall(t, c.Name, c.Arguments)
		}
	}
	assert.NotEmpty(t, out.Answered)
}

// nodeScript runs script in testdata/dir with node against url (and env),
// and returns what it printed; it skips the test where node or the
// package (a path under the dir's node_modules) is not installed.
func nodeScript(t *testing.T, dir, pkg, script, url string, env ...string) []byte {
	t.Helper()
	if _, err := os.Stat(filepath.Join("testdata", dir, "node_modules", pkg, "package.json")); err != nil {
		t.Skipf("%s is not installed (make deps: npm ci in server/testdata/%s)", pkg, dir)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node")
	}
	cmd := exec.Command(node, script)
	cmd.Dir = filepath.Join("testdata", dir)
	cmd.Env = append(append(os.Environ(), "STEPSERVE_URL="+url), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	require.NoError(t, err, stderr.String())
	return b
}

// The OpenAI Node SDK's n, prompt arrays, echo and penalties: n greedy
// choices equal, seeded ones different and reproducible, an array of
// four prompts four choices in order (each what the prompt alone gets),
// echo the prompt first, penalties a different text, chat's n.
func TestOpenAINodeSDKChoices(t *testing.T) {
	f := newGenFixture(t, "")
	b := nodeScript(t, "openai-sdk", "openai", "choices.mjs", f.srv.URL)
	var out struct {
		Greedy, Seeded, SeededAgain, Alone, Chat []string
		Array                                    []struct {
			Index int
			Text  string
		}
		Echo, Plain, Penalized string
	}
	require.NoError(t, json.Unmarshal(b, &out), string(b))
	require.Len(t, out.Greedy, 3)
	assert.Equal(t, out.Greedy[0], out.Greedy[1])
	assert.Equal(t, out.Greedy[1], out.Greedy[2])
	assert.Equal(t, out.Seeded, out.SeededAgain)
	assert.False(t, out.Seeded[0] == out.Seeded[1] && out.Seeded[1] == out.Seeded[2], "%q", out.Seeded)
	require.Len(t, out.Array, 4)
	for i, c := range out.Array {
		assert.Equal(t, i, c.Index)
		assert.Equal(t, out.Alone[i], c.Text)
	}
	assert.True(t, strings.HasPrefix(out.Echo, "Once upon a time"), out.Echo)
	assert.Equal(t, "Once upon a time"+out.Plain[:len(out.Echo)-len("Once upon a time")], out.Echo)
	assert.NotEqual(t, out.Plain, out.Penalized)
	assert.Len(t, out.Chat, 2)
}

// OpenAI's Responses API through the Node SDK: text (the SDK's
// output_text), the stream's documented events accumulated by the SDK's
// helper into the same response, json_schema output that validates, a
// function call of an offered function with valid arguments and its
// output sent back, previous_response_id carrying the conversation, and
// a stored response retrieved and deleted.
func TestOpenAINodeSDKResponses(t *testing.T) {
	f := newGenFixture(t, "")
	b := nodeScript(t, "openai-sdk", "openai", "responses.mjs", f.srv.URL, "SCHEMA="+structuredSchema, "TOOLS="+string(testTools))
	var out struct {
		Text struct {
			Text, Status, ID, Object string
			Usage                    map[string]any
		}
		Events, CompletedEvents []string
		Streamed                struct{ Text, Deltas string }
		Completed               struct {
			Text, Status, Whole string
			Usage, WholeUsage   map[string]any
		}
		Structured struct{ Text, Status string }
		Call       struct {
			Types                   []string
			Name, Arguments, CallID string
		}
		Back struct {
			Status string
			Types  []string
		}
		FollowUp struct {
			Status, Previous        string
			InputTokens, FirstInput int
		}
		Stored  string
		Deleted any
		Error   struct {
			Status int
			Param  string
		}
	}
	require.NoError(t, json.Unmarshal(b, &out), string(b))
	assert.Equal(t, "response", out.Text.Object)
	assert.True(t, strings.HasPrefix(out.Text.ID, "resp_"))
	assert.Contains(t, []string{"completed", "incomplete"}, out.Text.Status)
	assert.NotEmpty(t, out.Text.Text)
	assert.Equal(t, out.Text.Text, out.Streamed.Text)
	assert.Equal(t, out.Streamed.Text, out.Streamed.Deltas)
	assert.Equal(t, "completed", out.Completed.Status)
	assert.Equal(t, out.Completed.Whole, out.Completed.Text)
	assert.Equal(t, out.Completed.WholeUsage, out.Completed.Usage)
	validStructured(t, out.Completed.Text)
	assert.Equal(t, "response.completed", out.CompletedEvents[len(out.CompletedEvents)-1])
	assert.Equal(t, []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}, out.Events[:4])
	last := out.Events[len(out.Events)-4:]
	assert.Equal(t, []string{"response.output_text.done", "response.content_part.done", "response.output_item.done"}, last[:3])
	assert.Contains(t, []string{"response.completed", "response.incomplete"}, last[3])
	assert.Equal(t, "completed", out.Structured.Status)
	validStructured(t, out.Structured.Text)
	assert.Contains(t, out.Call.Types, "function_call")
	assert.Contains(t, []string{"get_weather", "add"}, out.Call.Name)
	var args map[string]any
	require.NoError(t, json.Unmarshal([]byte(out.Call.Arguments), &args), out.Call.Arguments)
	assert.Contains(t, []string{"completed", "incomplete"}, out.Back.Status)
	assert.Equal(t, out.Text.ID, out.FollowUp.Previous)
	assert.Greater(t, out.FollowUp.InputTokens, out.FollowUp.FirstInput, "the previous response's conversation came first")
	assert.Equal(t, out.Text.Text, out.Stored)
	assert.Equal(t, float64(404), out.Deleted)
	assert.Equal(t, 400, out.Error.Status)
	assert.Equal(t, "previous_response_id", out.Error.Param)
}
