package text

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// Numbers and text as the text APIs write them in JSON.

// RowFloats is row i of an FP32 output of width values a row.
func RowFloats(out []byte, i, width int) []float32 {
	row := make([]float32, width)
	b := out[i*width*4:]
	for k := range row {
		row[k] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*k:]))
	}
	return row
}

// Normalize scales v to unit L2 norm (a zero vector stays zero).
func Normalize(v []float32) {
	var ss float64
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	if ss == 0 {
		return
	}
	inv := 1 / math.Sqrt(ss)
	for i, x := range v {
		v[i] = float32(float64(x) * inv)
	}
}

// AppendFloats appends v as a JSON array of float32 values, each the
// shortest that reads back the same.
func AppendFloats(b []byte, v []float32) ([]byte, error) {
	b = append(b, '[')
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = AppendFloat(b, x); err != nil {
			return b, err
		}
	}
	return append(b, ']'), nil
}

func AppendFloat(b []byte, x float32) ([]byte, error) {
	if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
		return b, fmt.Errorf("the model produced %v, which JSON cannot carry", x)
	}
	return strconv.AppendFloat(b, float64(x), 'g', -1, 32), nil
}

// Sigmoid is the logistic function, as a single logit's score.
func Sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

// Softmax turns logits into probabilities, in place.
func Softmax(v []float32) {
	mx := float32(math.Inf(-1))
	for _, x := range v {
		mx = max(mx, x)
	}
	var sum float64
	for i, x := range v {
		e := math.Exp(float64(x - mx))
		v[i] = float32(e)
		sum += e
	}
	for i := range v {
		v[i] = float32(float64(v[i]) / sum)
	}
}

// AppendJSONText appends s, valid UTF-8, as a JSON string, as
// appendJSONString does.
func AppendJSONText(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\t':
			b = append(b, '\\', 't')
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		case c < utf8.RuneSelf:
			b = append(b, c)
		default:
			// Invalid UTF-8 (a byte-level token's part of a character)
			// is written as U+FFFD, as encoding/json writes it: the
			// answer stays valid JSON.
			r, n := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && n == 1 {
				b = append(b, `\ufffd`...)
				continue
			}
			b = append(b, s[i:i+n]...)
			i += n - 1
		}
	}
	return append(b, '"')
}
