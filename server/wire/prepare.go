package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/stepserve/stepserve/models"
)

// decodeStrings reads a checked BYTES input of n elements: a JSON array of
// strings, Triton's binary form (each element a 4-byte little-endian
// length, then its bytes) from the input's binary data when hasBin, or
// gRPC's typed contents. Text must be UTF-8. The elements are counted
// against the shape as they are read: a body of many small strings is
// refused at the first one past the shape's count, before it costs more.
func decodeStrings(in *WireInput, n int, hasBin bool) ([]string, error) {
	tooMany := func() error { return fmt.Errorf("more strings than the shape holds (%d)", n) }
	if in.Contents != nil {
		// Counted before any is copied.
		c, err := in.Contents.Count(models.BYTES)
		if err != nil {
			return nil, err
		}
		if c > n {
			return nil, tooMany()
		}
		if c < n {
			return nil, fmt.Errorf("shape %v needs %d strings, contents has %d", in.Shape, n, c)
		}
		strs := in.Contents.Strings(make([]string, 0, n))
		for i, s := range strs {
			if !utf8.ValidString(s) {
				return nil, fmt.Errorf("element %d is not valid UTF-8", i)
			}
		}
		return strs, nil
	}
	strs := make([]string, 0, n)
	if hasBin {
		b := in.Bin
		for len(b) > 0 {
			if len(strs) == n {
				return nil, tooMany()
			}
			if len(b) < 4 {
				return nil, fmt.Errorf("element %d: %d bytes left, too few for its 4-byte length", len(strs), len(b))
			}
			k := binary.LittleEndian.Uint32(b)
			if uint64(k) > uint64(len(b)-4) {
				return nil, fmt.Errorf("element %d: length %d runs past the %d bytes of binary data left", len(strs), k, len(b)-4)
			}
			s := b[4 : 4+k]
			if !utf8.Valid(s) {
				return nil, fmt.Errorf("element %d is not valid UTF-8", len(strs))
			}
			strs = append(strs, string(s))
			b = b[4+k:]
		}
	} else {
		if !utf8.Valid(in.Data) {
			return nil, errors.New("data is not valid UTF-8")
		}
		var err error
		if strs, err = scanStrings(in.Data, len(in.Shape), strs); err != nil {
			if err == errTooManyStrings {
				err = tooMany()
			}
			return nil, err
		}
	}
	if len(strs) != n {
		return nil, fmt.Errorf("shape %v needs %d strings, %s has %d", in.Shape, n, in.dataTerm(), len(strs))
	}
	return strs, nil
}

var errTooManyStrings = errors.New("more strings than the shape holds")

// scanStrings appends the strings of a flat or nested JSON array, nested at
// most rank deep, to out, and stops with errTooManyStrings at the first
// past out's capacity. raw is known to be valid JSON.
func scanStrings(raw []byte, rank int, out []string) ([]string, error) {
	i := 0
	for i < len(raw) && isSpace(raw[i]) {
		i++
	}
	if i == len(raw) || raw[i] != '[' {
		return nil, errors.New("data must be an array of strings")
	}
	depth := 0
	for i < len(raw) {
		switch c := raw[i]; {
		case c == '[':
			if depth++; depth > rank {
				return nil, fmt.Errorf("data is nested deeper than its shape's %d dimensions", rank)
			}
			i++
		case c == ']':
			depth--
			i++
		case c == ',' || isSpace(c):
			i++
		case c == '"':
			if len(out) == cap(out) {
				return nil, errTooManyStrings
			}
			p := wireParser{b: raw, i: i}
			if !p.skipString() {
				return nil, errors.New("data must be an array of strings")
			}
			quoted := raw[i:p.i]
			if bytes.IndexByte(quoted, '\\') < 0 {
				out = append(out, string(quoted[1:len(quoted)-1]))
			} else {
				var s string
				if err := json.Unmarshal(quoted, &s); err != nil {
					return nil, fmt.Errorf("element %d: %v", len(out), err)
				}
				out = append(out, s)
			}
			i = p.i
		default:
			p := wireParser{b: raw, i: i}
			p.skip()
			return nil, fmt.Errorf("element %d is %s; want a string", len(out), excerpt(raw[i:max(p.i, i+1)]))
		}
	}
	return out, nil
}
