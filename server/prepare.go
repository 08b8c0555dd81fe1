package server

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// decodeStrings reads a BYTES input: a JSON array of strings, or Triton's
// binary form (each element a 4-byte little-endian length, then its bytes).
// Text must be UTF-8.
func decodeStrings(in *wireInput, binSize int, hasBin bool, binaryPart []byte, elems int) ([]string, []byte, error) {
	var strs []string
	rest := binaryPart
	if hasBin {
		if binSize > len(binaryPart) {
			return nil, nil, fmt.Errorf("binary_data_size is %d bytes, but only %d bytes of binary data remain in the body", binSize, len(binaryPart))
		}
		b := binaryPart[:binSize]
		rest = binaryPart[binSize:]
		for len(b) > 0 {
			if len(b) < 4 {
				return nil, nil, fmt.Errorf("element %d: %d bytes left, too few for its 4-byte length", len(strs), len(b))
			}
			n := binary.LittleEndian.Uint32(b)
			if uint64(n) > uint64(len(b)-4) {
				return nil, nil, fmt.Errorf("element %d: length %d runs past the %d bytes of binary data left", len(strs), n, len(b)-4)
			}
			strs = append(strs, string(b[4:4+n]))
			b = b[4+n:]
		}
	} else {
		if len(in.Data) == 0 || string(in.Data) == "null" {
			return nil, nil, errors.New("has no data; send data or binary_data_size")
		}
		if !utf8.Valid(in.Data) {
			return nil, nil, errors.New("data is not valid UTF-8")
		}
		var err error
		if strs, err = flattenStrings(in.Data, len(in.Shape)); err != nil {
			return nil, nil, err
		}
	}
	if len(strs) != elems {
		return nil, nil, fmt.Errorf("shape %v needs %d strings, data has %d", in.Shape, elems, len(strs))
	}
	for i, s := range strs {
		if !utf8.ValidString(s) {
			return nil, nil, fmt.Errorf("element %d is not valid UTF-8", i)
		}
	}
	return strs, rest, nil
}

// flattenStrings reads a flat or nested JSON array of strings, nested at
// most depth deep.
func flattenStrings(raw json.RawMessage, depth int) ([]string, error) {
	if depth < 1 {
		return nil, errors.New("data is nested deeper than its shape's dimensions")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, errors.New("data must be an array of strings")
	}
	var out []string
	for i, it := range items {
		switch {
		case len(it) > 0 && it[0] == '"':
			var s string
			if err := json.Unmarshal(it, &s); err != nil {
				return nil, fmt.Errorf("element %d: %v", i, err)
			}
			out = append(out, s)
		case len(it) > 0 && it[0] == '[':
			inner, err := flattenStrings(it, depth-1)
			if err != nil {
				return nil, err
			}
			out = append(out, inner...)
		default:
			return nil, fmt.Errorf("element %d is %s; want a string", i, excerpt(it))
		}
	}
	return out, nil
}

// prepare builds the step request: the model prepares its step inputs from
// the decoded inputs, and every output gets room in one buffer.
func prepare(m *models.Model, req *inferRequest) (*steps.Request, error) {
	// The step request and the usual few buffer headers in one allocation.
	bundle := new(struct {
		sr           steps.Request
		inputs, outs [3][]byte
	})
	sr := &bundle.sr
	sr.Rows = req.rows
	var err error
	if sr.Inputs, sr.Seq, err = m.PrepareInputs(bundle.inputs[:0], req.inputs); err != nil {
		return nil, err
	}
	for _, t := range req.inputs {
		if n, ok := declaredElements(t.Shape); ok {
			sr.Elements += int(n)
		}
	}
	outputs := m.Config.Outputs
	sr.Outputs = bundle.outs[:0]
	if len(outputs) > len(bundle.outs) {
		sr.Outputs = make([][]byte, 0, len(outputs))
	}
	total := 0
	for _, o := range outputs {
		total += req.rows * o.RowBytes(sr.Seq)
	}
	outs := make([]byte, total)
	for _, o := range outputs {
		n := req.rows * o.RowBytes(sr.Seq)
		sr.Outputs = append(sr.Outputs, outs[:n:n])
		outs = outs[n:]
	}
	return sr, nil
}
