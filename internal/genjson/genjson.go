// Package genjson writes the JSON files the generators (cmd/gen-*) make:
// indented two spaces, HTML characters as they are, a newline at the end,
// so that a regenerated file differs from the committed one only where
// its content does.
package genjson

import (
	"bytes"
	"encoding/json"
)

// Marshal is v as a generated file holds it.
func Marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
