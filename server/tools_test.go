package server

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testTools are two functions whose arguments are bounded, so that a
// constrained call of the random-weight model ends.
var testTools = json.RawMessage(`[
	{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
		"parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
			"required": ["city", "unit"], "additionalProperties": false}}},
	{"type": "function", "function": {"name": "add", "parameters": {"type": "object",
		"properties": {"a": {"enum": [1, 2, 3]}, "b": {"type": "boolean"}}, "required": ["a", "b"], "additionalProperties": false}}}
]`)

// chatToolAnswer is a chat completion's message with its calls.
type chatToolAnswer struct {
	Choices []struct {
		Message struct {
			Role      string  `json:"role"`
			Content   *string `json:"content"`
			ToolCalls []struct {
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
}

// validCall checks a call against testTools' schemas.
func validCall(t *testing.T, name, args string) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(args))
	dec.DisallowUnknownFields()
	switch name {
	case "get_weather":
		var a struct {
			City *string `json:"city"`
			Unit *string `json:"unit"`
		}
		require.NoError(t, dec.Decode(&a), args)
		require.NotNil(t, a.City, args)
		assert.LessOrEqual(t, len([]rune(*a.City)), 8, args)
		require.NotNil(t, a.Unit, args)
		assert.Contains(t, []string{"c", "f"}, *a.Unit, args)
	case "add":
		var a struct {
			A *int  `json:"a"`
			B *bool `json:"b"`
		}
		require.NoError(t, dec.Decode(&a), args)
		require.NotNil(t, a.A, args)
		assert.Contains(t, []int{1, 2, 3}, *a.A, args)
		require.NotNil(t, a.B, args)
	default:
		t.Errorf("a call of %q, which the tools do not offer", name)
	}
}

// tool_choice required and a named function: the answer is a call of an
// offered function (the one named), with arguments valid for its
// schema, finish_reason tool_calls; streamed, the deltas add up to one.
func TestChatToolChoice(t *testing.T) {
	f := newGenFixture(t, "")
	ask := func(choice any, seed int) chatToolAnswer {
		t.Helper()
		st, b := f.post(t, "/v1/chat/completions", map[string]any{"model": "tiny-llama", "max_tokens": 200, "temperature": 1.0, "seed": seed,
			"messages": []map[string]any{{"role": "user", "content": "weather in Paris?"}}, "tools": testTools, "tool_choice": choice})
		require.Equal(t, 200, st, string(b))
		var a chatToolAnswer
		require.NoError(t, json.Unmarshal(b, &a), string(b))
		require.Len(t, a.Choices, 1)
		return a
	}
	names := map[string]bool{}
	for seed := range 12 {
		a := ask("required", seed)
		c := a.Choices[0]
		assert.Equal(t, "tool_calls", c.FinishReason)
		require.Len(t, c.Message.ToolCalls, 1, "seed %d", seed)
		call := c.Message.ToolCalls[0]
		assert.True(t, strings.HasPrefix(call.ID, "call_"), call.ID)
		assert.Equal(t, "function", call.Type)
		validCall(t, call.Function.Name, call.Function.Arguments)
		names[call.Function.Name] = true
		assert.Nil(t, c.Message.Content)
	}
	assert.Len(t, names, 2, "both functions were called")
	for seed := range 4 {
		a := ask(map[string]any{"type": "function", "function": map[string]any{"name": "add"}}, seed)
		require.Len(t, a.Choices[0].Message.ToolCalls, 1)
		assert.Equal(t, "add", a.Choices[0].Message.ToolCalls[0].Function.Name)
		validCall(t, "add", a.Choices[0].Message.ToolCalls[0].Function.Arguments)
	}

	// auto: the random model writes text, never a malformed call.
	a := ask("auto", 1)
	assert.Equal(t, "length", a.Choices[0].FinishReason)
	assert.Empty(t, a.Choices[0].Message.ToolCalls)
	require.NotNil(t, a.Choices[0].Message.Content)

	// Streamed: the call's id and name first, then its arguments.
	evs := f.events(t, "/v1/chat/completions", map[string]any{"model": "tiny-llama", "max_tokens": 200, "stream": true, "seed": 5, "temperature": 1.0,
		"messages": []map[string]any{{"role": "user", "content": "add"}}, "tools": testTools, "tool_choice": "required"})
	var name, args, id, finish string
	for _, ev := range evs {
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content   *string `json:"content"`
					ToolCalls []struct {
						Index    *int   `json:"index"`
						ID       string `json:"id"`
						Function struct {
							Name      string `json:"name"`
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal(ev, &chunk))
		for _, ch := range chunk.Choices {
			for _, tc := range ch.Delta.ToolCalls {
				require.NotNil(t, tc.Index)
				assert.Equal(t, 0, *tc.Index)
				id += tc.ID
				name += tc.Function.Name
				args += tc.Function.Arguments
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	assert.Equal(t, "tool_calls", finish)
	assert.True(t, strings.HasPrefix(id, "call_"))
	validCall(t, name, args)
}

// A conversation with calls and their results goes back through the
// template; bad tools and choices are refused by name.
func TestChatToolHistoryAndRefusals(t *testing.T) {
	f := newGenFixture(t, "")
	st, b := f.post(t, "/v1/chat/completions", map[string]any{"model": "tiny-llama", "max_tokens": 4, "tools": testTools,
		"messages": []map[string]any{
			{"role": "user", "content": "weather in Paris?"},
			{"role": "assistant", "content": nil, "tool_calls": []map[string]any{{"id": "call_1", "type": "function",
				"function": map[string]any{"name": "get_weather", "arguments": `{"city":"Paris","unit":"c"}`}}}},
			{"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
		}})
	require.Equal(t, 200, st, string(b))
	for _, c := range []struct {
		extra map[string]any
		param string
		want  string
	}{
		{map[string]any{"tools": json.RawMessage(`[{"type":"code"}]`)}, "tools", "want function"},
		{map[string]any{"tools": json.RawMessage(`[{"type":"function","function":{"name":"bad name"}}]`)}, "tools", "letters, digits"},
		{map[string]any{"tools": testTools, "tool_choice": "always"}, "tool_choice", `"always"`},
		{map[string]any{"tools": testTools, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "nope"}}}, "tool_choice", "do not offer"},
		{map[string]any{"tool_choice": "required"}, "tool_choice", "needs tools"},
		{map[string]any{"tools": testTools, "tool_choice": "required", "response_format": map[string]any{"type": "json_object"}}, "tool_choice", "give one"},
	} {
		body := map[string]any{"model": "tiny-llama", "messages": []map[string]any{{"role": "user", "content": "x"}}}
		for k, v := range c.extra {
			body[k] = v
		}
		st, b := f.post(t, "/v1/chat/completions", body)
		assert.Equal(t, 400, st, "%v: %s", c.extra, b)
		var e struct {
			Error struct {
				Message string  `json:"message"`
				Param   *string `json:"param"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal(b, &e))
		assert.Contains(t, e.Error.Message, c.want)
		if assert.NotNil(t, e.Error.Param) {
			assert.Equal(t, c.param, *e.Error.Param)
		}
	}
}
