package wire

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/stepserve/stepserve/internal/half"
	"github.com/stepserve/stepserve/models"
)

// Triton's classification extension: an output requested with
// "parameters": {"classification": k} is returned as BYTES of shape
// [rows, k], each element "value:index" or "value:index:label" for one of
// the row's k highest values, highest first (ties: the lower index
// first), the label from the output's labels file (model.yaml labels:).
// value is the shortest text that reads back as the same value of the
// output's datatype (Triton prints floats with six decimals; this keeps
// the precision, and parses the same way).

// classificationParam reads an output's classification parameter: the
// number of classes to return per row, 0 for the raw output (as Triton
// reads 0). Its errors are the client's, without the output's name.
func classificationParam(params WireParams, spec models.TensorSpec) (int, error) {
	raw, ok := params.Get("classification")
	if !ok {
		return 0, nil
	}
	k, ok := parseInt64(raw)
	if !ok || k < 0 {
		return 0, fmt.Errorf("parameter classification must be a non-negative integer (the number of classes to return), got %s", excerpt(raw))
	}
	return classCount(spec, k)
}

// classCount checks a requested number of classes k against the output:
// 0 is the raw output; more than a row's elements, or an output whose
// values cannot be ranked, is the client's error (a 400, or
// InvalidArgument). Every protocol's classification parameter comes here.
func classCount(spec models.TensorSpec, k int64) (int, error) {
	if k == 0 {
		return 0, nil
	}
	if k < 0 {
		return 0, fmt.Errorf("classification %d: the number of classes must not be negative", k)
	}
	if err := classifiable(spec); err != nil {
		return 0, err
	}
	if width := spec.RowElements(0); k > int64(width) {
		return 0, fmt.Errorf("classification %d asks for more classes than the output's %d elements per row", k, width)
	}
	return int(k), nil
}

// classifiable says why an output's values cannot be ranked, if they
// cannot.
func classifiable(spec models.TensorSpec) error {
	switch {
	case spec.Datatype == models.BYTES || spec.Datatype == models.BOOL:
		return fmt.Errorf("output is %s; classification ranks numeric outputs", spec.Datatype)
	case spec.HasSeq():
		return errors.New("output has a variable dimension; classification needs a fixed number of elements per row")
	}
	return nil
}

// rankClasses ranks each of rows rows of data (packed elements of spec's
// datatype, RowElements(0) a row) and hands emit the top k of each, row by
// row, as "value:index[:label]" text in a buffer reused for the next;
// labels (nil for none) names the elements of a row. It is the one
// ranking behind every protocol's classification.
func rankClasses(spec models.TensorSpec, labels []string, data []byte, rows, k int, emit func(text []byte)) {
	width := spec.RowElements(0)
	size := spec.Datatype.Size()
	idx := make([]int, width)
	var buf []byte
	for r := range rows {
		row := data[r*width*size : (r+1)*width*size]
		for i := range idx {
			idx[i] = i
		}
		rankRow(idx, row, spec.Datatype)
		for _, i := range idx[:k] {
			buf = appendValue(buf[:0], row[i*size:], spec.Datatype)
			buf = append(buf, ':')
			buf = strconv.AppendInt(buf, int64(i), 10)
			if i < len(labels) && labels[i] != "" {
				buf = append(buf, ':')
				buf = append(buf, labels[i]...)
			}
			emit(buf)
		}
	}
}

// Classify is rankClasses' text as strings, rows x k of them in row
// order: the elements of a classified output as BYTES.
func Classify(spec models.TensorSpec, labels []string, data []byte, rows, k int) []string {
	out := make([]string, 0, rows*k)
	rankClasses(spec, labels, data, rows, k, func(text []byte) { out = append(out, string(text)) })
	return out
}

// classScratch is what ranking an output's rows takes besides its text:
// the indices of a row.
func classScratch(spec models.TensorSpec) int64 { return 8 * int64(spec.RowElements(0)) }

// rankRow orders idx, a row's element indices, by the elements' values,
// highest first, compared in the row's datatype; ties keep the lower index
// first. A NaN ranks last.
func rankRow(idx []int, row []byte, dt models.Datatype) {
	switch dt {
	case models.INT8, models.INT16, models.INT32, models.INT64:
		slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(intAt(row, b, dt), intAt(row, a, dt)) })
	case models.UINT8, models.UINT16, models.UINT32, models.UINT64:
		slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(uintAt(row, b, dt), uintAt(row, a, dt)) })
	default:
		// cmp.Compare orders a NaN below every number.
		slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(floatAt(row, b, dt), floatAt(row, a, dt)) })
	}
}

func intAt(row []byte, i int, dt models.Datatype) int64 {
	switch dt {
	case models.INT8:
		return int64(int8(row[i]))
	case models.INT16:
		return int64(int16(binary.LittleEndian.Uint16(row[2*i:])))
	case models.INT32:
		return int64(int32(binary.LittleEndian.Uint32(row[4*i:])))
	}
	return int64(binary.LittleEndian.Uint64(row[8*i:]))
}

func uintAt(row []byte, i int, dt models.Datatype) uint64 {
	switch dt {
	case models.UINT8:
		return uint64(row[i])
	case models.UINT16:
		return uint64(binary.LittleEndian.Uint16(row[2*i:]))
	case models.UINT32:
		return uint64(binary.LittleEndian.Uint32(row[4*i:]))
	}
	return binary.LittleEndian.Uint64(row[8*i:])
}

func floatAt(row []byte, i int, dt models.Datatype) float64 {
	switch dt {
	case models.FP64:
		return math.Float64frombits(binary.LittleEndian.Uint64(row[8*i:]))
	case models.FP16:
		return float64(half.ToFloat32(binary.LittleEndian.Uint16(row[2*i:])))
	case models.BF16:
		return float64(half.BFloat16ToFloat32(binary.LittleEndian.Uint16(row[2*i:])))
	}
	return float64(math.Float32frombits(binary.LittleEndian.Uint32(row[4*i:])))
}

// appendValue appends the element at the front of b as text: integers in
// decimal, floats as the shortest text that reads back as the same value
// of their width.
func appendValue(dst, b []byte, dt models.Datatype) []byte {
	switch dt {
	case models.INT8, models.INT16, models.INT32, models.INT64:
		return strconv.AppendInt(dst, intAt(b, 0, dt), 10)
	case models.UINT8, models.UINT16, models.UINT32, models.UINT64:
		return strconv.AppendUint(dst, uintAt(b, 0, dt), 10)
	case models.FP64:
		return strconv.AppendFloat(dst, floatAt(b, 0, dt), 'g', -1, 64)
	}
	return strconv.AppendFloat(dst, floatAt(b, 0, dt), 'g', -1, 32)
}

// classElementBytes bounds one classification element's text: the longest
// value of the datatype, a colon, the longest index of a row of width
// elements, and a colon and the longest label; as a JSON string (quoted,
// escaped, with its comma) or as Triton's binary BYTES element (a 4-byte
// length, then the text).
func classElementBytes(dt models.Datatype, width int, labels []string, asJSON bool) int64 {
	label := 0
	for _, l := range labels {
		label = max(label, len(l))
	}
	if label > 0 {
		label++ // the colon
	}
	n := int64(25 + 1 + len(strconv.Itoa(max(width-1, 0))))
	if asJSON {
		// Quotes and comma; the value and index need no escape, and a
		// label's every byte at most two (\" and \\: no control
		// characters but a tab, models.ParseLabels).
		return n + 3 + 2*int64(label)
	}
	return 4 + n + int64(label)
}

// appendJSONString appends s, valid UTF-8, as a JSON string: '"' and '\\'
// escaped with a backslash, control characters as \u00XX (a label holds
// none but a tab, models.ParseLabels), the rest as it is.
func appendJSONString(b []byte, s []byte) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for _, c := range s {
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\t':
			b = append(b, '\\', 't')
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// AppendClassOutput appends one classified output of the response: its
// JSON object, with the strings inline or, for a binary output, the
// binary_data_size of the part it appends to parts.
func AppendClassOutput(b []byte, parts [][]byte, m *models.Model, c OutputChoice, data []byte, rows int) ([]byte, [][]byte) {
	spec := m.Config.Outputs[c.Index]
	var labels []string
	if c.Index < len(m.Labels) {
		labels = m.Labels[c.Index]
	}
	b = append(b, `{"name":`...)
	b = strconv.AppendQuote(b, spec.Name)
	b = append(b, `,"datatype":"BYTES","shape":[`...)
	b = strconv.AppendInt(b, int64(rows), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(c.Classes), 10)
	b = append(b, ']')
	if c.Binary {
		// Triton's binary BYTES: each element a 4-byte little-endian
		// length, then its bytes.
		part := make([]byte, 0, int64(rows*c.Classes)*classElementBytes(spec.Datatype, spec.RowElements(0), labels, false))
		rankClasses(spec, labels, data, rows, c.Classes, func(text []byte) {
			part = binary.LittleEndian.AppendUint32(part, uint32(len(text)))
			part = append(part, text...)
		})
		b = append(b, `,"parameters":{"binary_data_size":`...)
		b = strconv.AppendInt(b, int64(len(part)), 10)
		b = append(b, "}}"...)
		return b, append(parts, part)
	}
	b = append(b, `,"data":[`...)
	first := true
	rankClasses(spec, labels, data, rows, c.Classes, func(text []byte) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendJSONString(b, text)
	})
	return append(b, "]}"...), parts
}
