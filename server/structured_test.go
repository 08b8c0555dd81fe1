package server

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// structuredSchema is an object the tiny random model could never write
// by chance: every field bounded, so that a constrained output ends.
const structuredSchema = `{
	"type": "object",
	"properties": {
		"name": {"type": "string", "maxLength": 6},
		"ok": {"type": "boolean"},
		"color": {"enum": ["red", "green", "blue"]},
		"tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}
	},
	"required": ["name", "ok", "color", "tags"],
	"additionalProperties": false
}`

// structured is what structuredSchema allows, decoded strictly.
type structured struct {
	Name  *string  `json:"name"`
	OK    *bool    `json:"ok"`
	Color *string  `json:"color"`
	Tags  []string `json:"tags"`
}

// validStructured checks out against structuredSchema.
func validStructured(t *testing.T, out string) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	var v structured
	require.NoError(t, dec.Decode(&v), "the output parses: %q", out)
	assert.False(t, dec.More(), "one JSON value: %q", out)
	require.NotNil(t, v.Name, out)
	assert.LessOrEqual(t, len([]rune(*v.Name)), 6, out)
	require.NotNil(t, v.OK, out)
	require.NotNil(t, v.Color, out)
	assert.Contains(t, []string{"red", "green", "blue"}, *v.Color, out)
	require.NotNil(t, v.Tags, out)
	assert.LessOrEqual(t, len(v.Tags), 3, out)
	for _, tag := range v.Tags {
		assert.Contains(t, []string{"a", "b"}, tag, out)
	}
}

// A chat completion with response_format json_schema returns JSON that
// validates against the schema, whatever the (random) model would rather
// say, sampled or greedy, streamed or not; finish_reason is stop.
func TestChatJSONSchema(t *testing.T) {
	f := newGenFixture(t, "")
	format := map[string]any{"type": "json_schema", "json_schema": map[string]any{
		"name": "thing", "strict": true, "schema": json.RawMessage(structuredSchema)}}
	for seed := range 12 {
		body := map[string]any{"model": "tiny-llama", "max_tokens": 200, "temperature": 1.0, "seed": seed,
			"messages": []map[string]any{{"role": "user", "content": "describe a thing"}}, "response_format": format}
		st, b := f.post(t, "/v1/chat/completions", body)
		require.Equal(t, 200, st, string(b))
		var c completion
		require.NoError(t, json.Unmarshal(b, &c))
		require.Len(t, c.Choices, 1)
		require.NotNil(t, c.Choices[0].Message)
		require.NotNil(t, c.Choices[0].FinishReason)
		assert.Equal(t, "stop", *c.Choices[0].FinishReason, "seed %d", seed)
		validStructured(t, c.Choices[0].Message.Content)
	}

	body := map[string]any{"model": "tiny-llama", "max_tokens": 200, "stream": true, "seed": 3, "temperature": 0.9,
		"messages": []map[string]any{{"role": "user", "content": "describe a thing"}}, "response_format": format}
	var out strings.Builder
	finish := ""
	for _, ev := range f.events(t, "/v1/chat/completions", body) {
		var chunk struct {
			Choices []struct {
				Delta        struct{ Content string } `json:"delta"`
				FinishReason *string                  `json:"finish_reason"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal(ev, &chunk))
		for _, ch := range chunk.Choices {
			out.WriteString(ch.Delta.Content)
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	assert.Equal(t, "stop", finish)
	validStructured(t, out.String())

	// max_tokens cuts a constrained output: length, and a prefix of
	// what the schema allows.
	body = map[string]any{"model": "tiny-llama", "max_tokens": 3, "messages": []map[string]any{{"role": "user", "content": "x"}}, "response_format": format}
	st, b := f.post(t, "/v1/chat/completions", body)
	require.Equal(t, 200, st, string(b))
	var c completion
	require.NoError(t, json.Unmarshal(b, &c))
	assert.Equal(t, "length", *c.Choices[0].FinishReason)
	assert.True(t, strings.HasPrefix(`{"name":`, strings.Join(strings.Fields(c.Choices[0].Message.Content), "")[:1]), c.Choices[0].Message.Content)
}

// vLLM's guided keys on completions: a choice, a regex, a schema.
func TestCompletionsGuided(t *testing.T) {
	f := newGenFixture(t, "")
	text := func(body map[string]any) (string, string) {
		t.Helper()
		body["model"], body["prompt"] = "tiny-llama", "the answer is"
		st, b := f.post(t, "/v1/completions", body)
		require.Equal(t, 200, st, string(b))
		var c completion
		require.NoError(t, json.Unmarshal(b, &c))
		return c.Choices[0].Text, *c.Choices[0].FinishReason
	}
	choices := []string{"yes", "no", "maybe so", "ünïcode 🙂"}
	seen := map[string]bool{}
	for seed := range 16 {
		out, finish := text(map[string]any{"guided_choice": choices, "temperature": 1.0, "seed": seed, "max_tokens": 40})
		assert.Contains(t, choices, out)
		assert.Equal(t, "stop", finish)
		seen[out] = true
	}
	assert.Greater(t, len(seen), 1, "the draw chooses")

	re := regexp.MustCompile(`^[0-9]{3}-[a-z]{2}$`)
	for seed := range 8 {
		out, finish := text(map[string]any{"guided_regex": `[0-9]{3}-[a-z]{2}`, "temperature": 1.0, "seed": seed, "max_tokens": 40})
		assert.Regexp(t, re, out)
		assert.Equal(t, "stop", finish)
	}
	out, finish := text(map[string]any{"guided_json": structuredSchema, "max_tokens": 200})
	assert.Equal(t, "stop", finish)
	validStructured(t, out)
	out, finish = text(map[string]any{"response_format": map[string]any{"type": "json_object"}, "max_tokens": 30})
	assert.True(t, strings.HasPrefix(strings.TrimLeft(out, " \t\r\n"), "{"), "a JSON object begins: %q", out)
	if finish == "stop" {
		var obj map[string]any
		assert.NoError(t, json.Unmarshal([]byte(out), &obj), "a complete output is a JSON object: %q", out)
	}
}

// What cannot be enforced is refused, naming what is wrong.
func TestStructuredOutputRefusals(t *testing.T) {
	f := newGenFixture(t, "")
	for _, c := range []struct {
		body  string
		param string
		want  string
	}{
		{`"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","patternProperties":{"a":{}}}}}`, "response_format", "patternProperties"},
		{`"response_format":{"type":"json_schema","json_schema":{"name":"x"}}`, "response_format", "json_schema.schema"},
		{`"response_format":{"type":"yaml"}`, "response_format", `"yaml"`},
		{`"guided_regex":"a","guided_choice":["b"]`, "guided_choice", "give one"},
		{`"guided_grammar":"root ::= x"`, "guided_grammar", "not supported"},
		{`"guided_regex":"a{1000}b{1000}c{1000}d{1000}e{1000}f{1000}g{1000}h{1000}i{1000}j{1000}k{1000}l{1000}m{1000}n{1000}o{1000}p{1000}q{1000}r{1000}s{1000}t{1000}u{1000}v{1000}w{1000}x{1000}y{1000}z{1000}A{1000}B{1000}C{1000}D{1000}E{1000}F{1000}G{1000}H{1000}I{1000}J{1000}K{1000}L{1000}M{1000}N{1000}O{1000}P{1000}Q{1000}R{1000}S{1000}T{1000}U{1000}V{1000}W{1000}X{1000}"`, "response_format", "too large"},
	} {
		body := fmt.Sprintf(`{"model":"tiny-llama","messages":[{"role":"user","content":"x"}],%s}`, c.body)
		st, b := f.post(t, "/v1/chat/completions", json.RawMessage(body))
		assert.Equal(t, 400, st, "%s: %s", c.body, b)
		var e struct {
			Error struct {
				Message string  `json:"message"`
				Param   *string `json:"param"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal(b, &e), string(b))
		assert.Contains(t, e.Error.Message, c.want, c.body)
		if assert.NotNil(t, e.Error.Param, c.body) {
			assert.Equal(t, c.param, *e.Error.Param, c.body)
		}
	}
}

// A model whose model.yaml turns structured output off answers a
// constrained request 400, naming the key, and a plain one as before.
func TestStructuredOutputOff(t *testing.T) {
	f := newGenFixture(t, "generation:\n  structured_output: false\n")
	for _, extra := range []string{`"response_format":{"type":"json_object"}`, `"guided_choice":["a","b"]`} {
		body := fmt.Sprintf(`{"model":"tiny-llama","max_tokens":4,"messages":[{"role":"user","content":"x"}],%s}`, extra)
		st, b := f.post(t, "/v1/chat/completions", json.RawMessage(body))
		assert.Equal(t, 400, st, "%s: %s", extra, b)
		assert.Contains(t, string(b), "generation.structured_output false", extra)
	}
	st, b := f.post(t, "/v1/chat/completions", json.RawMessage(`{"model":"tiny-llama","max_tokens":4,"messages":[{"role":"user","content":"x"}]}`))
	assert.Equal(t, 200, st, string(b))
}

// Hostile constraints get an answer, never a crash or a server error:
// what would expand past the grammar's bounds is refused as too large,
// a schema that matches nothing is refused, and the request's JSON value
// bound refuses the largest before they are decoded.
func TestStructuredOutputHostile(t *testing.T) {
	f := newGenFixture(t, "")
	var enum, wide []string
	for i := range 6000 {
		enum = append(enum, fmt.Sprintf("v%d", i))
	}
	for i := range 1500 {
		wide = append(wide, fmt.Sprintf(`"p%d":{"type":"string","maxLength":50}`, i))
	}
	enumJSON, err := json.Marshal(map[string]any{"enum": enum})
	require.NoError(t, err)
	for _, c := range []struct {
		name   string
		body   map[string]any
		status int
		want   string
	}{
		{"nested 2000 deep", map[string]any{"guided_json": json.RawMessage(strings.Repeat(`{"type":"array","items":`, 2000) + `{"type":"string"}` + strings.Repeat(`}`, 2000))}, 200, ""},
		{"nested past the value bound", map[string]any{"guided_json": json.RawMessage(strings.Repeat(`{"type":"array","items":`, 5000) + `{}` + strings.Repeat(`}`, 5000))}, 413, "JSON values"},
		{"an enum of 6000", map[string]any{"guided_json": json.RawMessage(enumJSON)}, 200, ""},
		{"6000 choices", map[string]any{"guided_choice": enum}, 200, ""},
		{"1500 bounded properties", map[string]any{"guided_json": json.RawMessage(`{"type":"object","properties":{` + strings.Join(wide, ",") + `}}`)}, 400, "too large"},
		{"a $ref loop", map[string]any{"guided_json": json.RawMessage(`{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}`)}, 400, "matches nothing"},
		{"a nested repeat", map[string]any{"guided_regex": "(a{100}){100}"}, 400, "repeat count"},
	} {
		c.body["model"], c.body["prompt"], c.body["max_tokens"] = "tiny-llama", "x", 8
		st, b := f.post(t, "/v1/completions", c.body)
		assert.Equal(t, c.status, st, "%s: %.300s", c.name, b)
		assert.Contains(t, string(b), c.want, c.name)
	}
}
