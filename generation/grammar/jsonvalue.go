package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// jvalue is a parsed JSON value that keeps its object members in order
// (a schema's properties are generated in the order written).
type jvalue struct {
	kind  byte // 'o' object, 'a' array, 's' string, 'n' number, 'b' boolean, 'z' null
	keys  []string
	vals  []*jvalue // an object's values, or an array's items
	str   string
	num   json.Number
	truth bool
}

func parseJSON(data []byte) (*jvalue, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := readJSON(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("grammar: trailing data after the schema")
	}
	return v, nil
}

func readJSON(dec *json.Decoder) (*jvalue, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("grammar: schema is not JSON: %w", err)
	}
	switch t := tok.(type) {
	case json.Delim:
		v := &jvalue{kind: 'a'}
		if t == '{' {
			v.kind = 'o'
		}
		for dec.More() {
			if v.kind == 'o' {
				k, err := dec.Token()
				if err != nil {
					return nil, fmt.Errorf("grammar: schema is not JSON: %w", err)
				}
				v.keys = append(v.keys, k.(string))
			}
			item, err := readJSON(dec)
			if err != nil {
				return nil, err
			}
			v.vals = append(v.vals, item)
		}
		if _, err := dec.Token(); err != nil {
			return nil, fmt.Errorf("grammar: schema is not JSON: %w", err)
		}
		return v, nil
	case string:
		return &jvalue{kind: 's', str: t}, nil
	case json.Number:
		return &jvalue{kind: 'n', num: t}, nil
	case bool:
		return &jvalue{kind: 'b', truth: t}, nil
	case nil:
		return &jvalue{kind: 'z'}, nil
	}
	return nil, fmt.Errorf("grammar: unexpected JSON token %v", tok)
}

// get is an object's member, or nil.
func (v *jvalue) get(key string) *jvalue {
	if v == nil || v.kind != 'o' {
		return nil
	}
	for i, k := range v.keys {
		if k == key {
			return v.vals[i]
		}
	}
	return nil
}

// encode is v as compact JSON, members in order.
func (v *jvalue) encode() string {
	var sb strings.Builder
	v.write(&sb)
	return sb.String()
}

func (v *jvalue) write(sb *strings.Builder) {
	switch v.kind {
	case 'o':
		sb.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(jsonString(k))
			sb.WriteByte(':')
			v.vals[i].write(sb)
		}
		sb.WriteByte('}')
	case 'a':
		sb.WriteByte('[')
		for i, it := range v.vals {
			if i > 0 {
				sb.WriteByte(',')
			}
			it.write(sb)
		}
		sb.WriteByte(']')
	case 's':
		sb.WriteString(jsonString(v.str))
	case 'n':
		sb.WriteString(v.num.String())
	case 'b':
		sb.WriteString(strconv.FormatBool(v.truth))
	default:
		sb.WriteString("null")
	}
}

// jsonString is s as a JSON string, with no HTML escaping.
func jsonString(s string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(buf.String(), "\n")
}

// resolvePointer follows a JSON pointer fragment ("#/$defs/a") in root.
func resolvePointer(root *jvalue, ref string) (*jvalue, bool) {
	frag, ok := strings.CutPrefix(ref, "#")
	if !ok {
		return nil, false
	}
	v := root
	if frag == "" {
		return v, true
	}
	if !strings.HasPrefix(frag, "/") {
		return nil, false
	}
	for _, part := range strings.Split(frag[1:], "/") {
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		switch v.kind {
		case 'o':
			if v = v.get(part); v == nil {
				return nil, false
			}
		case 'a':
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(v.vals) {
				return nil, false
			}
			v = v.vals[i]
		default:
			return nil, false
		}
	}
	return v, true
}
