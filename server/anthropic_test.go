package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type anthropicMessage struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Role    string `json:"role"`
	Model   string `json:"model"`
	Content []struct {
		Type  string          `json:"type"`
		Text  *string         `json:"text"`
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	} `json:"content"`
	StopReason   string  `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
	Usage        struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

// Anthropic's Messages API: a message with its system prompt and turns,
// its stop reasons (max_tokens, a stop sequence, a tool call the
// grammar made), the token count of the same prompt, and Anthropic's
// error shape.
func TestAnthropicMessages(t *testing.T) {
	f := newGenFixture(t, "")
	msgs := []map[string]any{{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."},
		{"role": "user", "content": []map[string]any{{"type": "text", "text": "Tell me a story."}}}}
	post := func(body map[string]any) (int, anthropicMessage, string) {
		t.Helper()
		st, b := f.post(t, "/v1/messages", body)
		var m anthropicMessage
		if st == 200 {
			require.NoError(t, json.Unmarshal(b, &m), string(b))
		}
		return st, m, string(b)
	}
	st, m, raw := post(map[string]any{"model": "tiny-llama", "max_tokens": 8, "system": "Be brief.", "messages": msgs, "temperature": 0})
	require.Equal(t, 200, st, raw)
	assert.True(t, strings.HasPrefix(m.ID, "msg_"), m.ID)
	assert.Equal(t, "message", m.Type)
	assert.Equal(t, "assistant", m.Role)
	assert.Equal(t, "tiny-llama", m.Model)
	require.Len(t, m.Content, 1)
	assert.Equal(t, "text", m.Content[0].Type)
	assert.Equal(t, "max_tokens", m.StopReason)
	assert.Equal(t, 8, m.Usage.OutputTokens)
	assert.Positive(t, m.Usage.InputTokens)

	st, b := f.post(t, "/v1/messages/count_tokens", map[string]any{"model": "tiny-llama", "system": "Be brief.", "messages": msgs})
	require.Equal(t, 200, st, string(b))
	var count struct {
		InputTokens int `json:"input_tokens"`
	}
	require.NoError(t, json.Unmarshal(b, &count))
	assert.Equal(t, m.Usage.InputTokens, count.InputTokens, "count_tokens counts the prompt the message ran on")

	// tool_choice any: a tool_use block the grammar made, stop_reason
	// tool_use; its result goes back as a tool_result block.
	tools := []map[string]any{{"name": "add", "description": "Adds.", "input_schema": json.RawMessage(`{"type":"object","properties":{"a":{"enum":[1,2,3]},"b":{"type":"boolean"}},"required":["a","b"],"additionalProperties":false}`)}}
	st, m, raw = post(map[string]any{"model": "tiny-llama", "max_tokens": 200, "messages": msgs, "tools": tools, "tool_choice": map[string]any{"type": "any"}, "temperature": 1})
	require.Equal(t, 200, st, raw)
	assert.Equal(t, "tool_use", m.StopReason, raw)
	require.Len(t, m.Content, 1, raw)
	assert.Equal(t, "tool_use", m.Content[0].Type)
	assert.True(t, strings.HasPrefix(m.Content[0].ID, "toolu_"))
	validCall(t, m.Content[0].Name, string(m.Content[0].Input))
	turn := append(msgs, map[string]any{"role": "assistant", "content": []map[string]any{{"type": "tool_use", "id": m.Content[0].ID, "name": "add", "input": m.Content[0].Input}}},
		map[string]any{"role": "user", "content": []map[string]any{{"type": "tool_result", "tool_use_id": m.Content[0].ID, "content": "5"}}})
	st, _, raw = post(map[string]any{"model": "tiny-llama", "max_tokens": 4, "messages": turn, "tools": tools})
	assert.Equal(t, 200, st, raw)

	// A stop sequence the (constrained) output meets ends it, named.
	st, m, raw = post(map[string]any{"model": "tiny-llama", "max_tokens": 200, "messages": msgs, "tools": tools, "tool_choice": map[string]any{"type": "any"},
		"stop_sequences": []string{`"name"`}})
	require.Equal(t, 200, st, raw)
	assert.Equal(t, "stop_sequence", m.StopReason, raw)
	require.NotNil(t, m.StopSequence)
	assert.Equal(t, `"name"`, *m.StopSequence)

	for _, c := range []struct {
		body map[string]any
		want string
	}{
		{map[string]any{"model": "tiny-llama", "messages": msgs}, "max_tokens is required"},
		{map[string]any{"model": "tiny-llama", "max_tokens": 4, "messages": []map[string]any{{"role": "system", "content": "x"}}}, "want user or assistant"},
		{map[string]any{"model": "tiny-llama", "max_tokens": 4, "messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "image", "source": map[string]any{}}}}}}, `"image"`},
		{map[string]any{"model": "tiny-llama", "max_tokens": 4, "messages": msgs, "tools": []map[string]any{{"type": "web_search_20250305", "name": "web_search"}}}, "server tools"},
	} {
		st, b := f.post(t, "/v1/messages", c.body)
		assert.Equal(t, 400, st, string(b))
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal(b, &e), string(b))
		assert.Equal(t, "error", e.Type)
		assert.Equal(t, "invalid_request_error", e.Error.Type)
		assert.Contains(t, e.Error.Message, c.want)
	}
	st, b = f.post(t, "/v1/messages", map[string]any{"model": "nope", "max_tokens": 4, "messages": msgs})
	assert.Equal(t, 404, st)
	assert.Contains(t, string(b), `"type":"not_found_error"`)
}

// A stream is Anthropic's event sequence, its text deltas adding up to
// the whole answer of the same greedy request.
func TestAnthropicMessagesStream(t *testing.T) {
	f := newGenFixture(t, "")
	body := map[string]any{"model": "tiny-llama", "max_tokens": 12, "temperature": 0,
		"messages": []map[string]any{{"role": "user", "content": "Hello"}}}
	b, err := json.Marshal(body)
	require.NoError(t, err)
	resp, err := http.Post(f.srv.URL+"/v1/messages", "application/json", bytes.NewReader(b))
	require.NoError(t, err)
	var whole anthropicMessage
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&whole))
	resp.Body.Close()

	body["stream"] = true
	b, err = json.Marshal(body)
	require.NoError(t, err)
	resp, err = http.Post(f.srv.URL+"/v1/messages", "application/json", bytes.NewReader(b))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	var events []string
	var textOut strings.Builder
	stop := ""
	sc := bufio.NewScanner(resp.Body)
	ev := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			ev = strings.TrimPrefix(line, "event: ")
			events = append(events, ev)
		case strings.HasPrefix(line, "data: "):
			var d struct {
				Type  string `json:"type"`
				Delta struct {
					Type       string `json:"type"`
					Text       string `json:"text"`
					StopReason string `json:"stop_reason"`
				} `json:"delta"`
			}
			require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &d))
			assert.Equal(t, ev, d.Type, "the data's type is the event's")
			if d.Delta.Type == "text_delta" {
				textOut.WriteString(d.Delta.Text)
			}
			if d.Delta.StopReason != "" {
				stop = d.Delta.StopReason
			}
		}
	}
	require.GreaterOrEqual(t, len(events), 5, events)
	assert.Equal(t, []string{"message_start", "content_block_start"}, events[:2])
	assert.Equal(t, []string{"content_block_stop", "message_delta", "message_stop"}, events[len(events)-3:])
	assert.Equal(t, "max_tokens", stop)
	require.Len(t, whole.Content, 1)
	assert.Equal(t, *whole.Content[0].Text, textOut.String(), "the deltas add up to the whole answer")
}

// The inference tokens are taken as Anthropic's x-api-key, as a bearer
// token; a refusal is Anthropic's authentication_error.
func TestAnthropicAPIKey(t *testing.T) {
	f := newGenFixture(t, "")
	f.s.SetTokens([]string{"sk-test"}, nil)
	send := func(header, value string) (int, string) {
		req, err := http.NewRequest("POST", f.srv.URL+"/v1/messages", strings.NewReader(`{"model":"tiny-llama","max_tokens":2,"messages":[{"role":"user","content":"x"}]}`))
		require.NoError(t, err)
		if header != "" {
			req.Header.Set(header, value)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	st, b := send("", "")
	assert.Equal(t, 401, st)
	assert.Contains(t, b, `"type":"authentication_error"`)
	st, _ = send("X-Api-Key", "wrong")
	assert.Equal(t, 401, st)
	st, b = send("X-Api-Key", "sk-test")
	assert.Equal(t, 200, st, b)
	st, b = send("Authorization", "Bearer sk-test")
	assert.Equal(t, 200, st, b)
}
