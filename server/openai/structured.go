package openai

// Structured output: OpenAI's response_format (json_object, json_schema)
// on chat and completions, and vLLM's guided decoding keys (guided_json,
// guided_regex, guided_choice) that its clients send as extra body keys.
// Each becomes the generation's serving.Constraint: the model's output
// then matches it token by token, whatever the model would rather say.

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/text"
	"github.com/stepserve/stepserve/serving"
)

// responseFormat is OpenAI's response_format.
type responseFormat struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Schema      json.RawMessage `json:"schema"`
		Strict      *bool           `json:"strict"` // the schema is enforced either way
	} `json:"json_schema"`
}

// guided are vLLM's guided decoding keys.
type guided struct {
	ResponseFormat *responseFormat `json:"response_format"`
	GuidedJSON     json.RawMessage `json:"guided_json"`
	GuidedRegex    *string         `json:"guided_regex"`
	GuidedChoice   []string        `json:"guided_choice"`
	GuidedGrammar  *string         `json:"guided_grammar"`
}

// constraint is the structured output g asks for; nil for none.
func (g *guided) constraint() (*serving.Constraint, error) {
	var c *serving.Constraint
	param := ""
	set := func(p string, v *serving.Constraint) error {
		if c != nil {
			return text.WithParam(p, apierr.BadRequest(fmt.Sprintf("%s and %s both constrain the output; give one", param, p)))
		}
		c, param = v, p
		return nil
	}
	if rf := g.ResponseFormat; rf != nil {
		switch rf.Type {
		case "", "text":
		case "json_object":
			if err := set("response_format", &serving.Constraint{JSONObject: true}); err != nil {
				return nil, err
			}
		case "json_schema":
			if rf.JSONSchema == nil || isNull(rf.JSONSchema.Schema) {
				return nil, text.WithParam("response_format", apierr.BadRequest(
					"response_format json_schema needs json_schema.schema: the JSON Schema the output follows"))
			}
			if err := set("response_format", &serving.Constraint{JSONSchema: rf.JSONSchema.Schema}); err != nil {
				return nil, err
			}
		default:
			return nil, text.WithParam("response_format", apierr.BadRequest(fmt.Sprintf(
				"response_format type %q; want text, json_object or json_schema", apierr.ClipName(rf.Type))))
		}
	}
	if !isNull(g.GuidedJSON) {
		schema := g.GuidedJSON
		var s string
		if json.Unmarshal(schema, &s) == nil {
			schema = json.RawMessage(s) // vLLM takes the schema as a string too
		}
		if err := set("guided_json", &serving.Constraint{JSONSchema: schema}); err != nil {
			return nil, err
		}
	}
	if g.GuidedRegex != nil {
		if err := set("guided_regex", &serving.Constraint{Regex: *g.GuidedRegex}); err != nil {
			return nil, err
		}
	}
	if g.GuidedChoice != nil {
		if err := set("guided_choice", &serving.Constraint{Choices: g.GuidedChoice}); err != nil {
			return nil, err
		}
	}
	if g.GuidedGrammar != nil {
		return nil, text.WithParam("guided_grammar", apierr.BadRequest(
			"guided_grammar is not supported; constrain the output with response_format, guided_json, guided_regex or guided_choice"))
	}
	return c, nil
}

// isNull reports whether raw is absent or null.
func isNull(raw json.RawMessage) bool {
	b := bytes.TrimSpace(raw)
	return len(b) == 0 || bytes.Equal(b, []byte("null"))
}
