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
			return nil, fmt.Errorf("element %d is %s; want a string", i, truncate(it))
		}
	}
	return out, nil
}

// prepare turns a decoded request into the step's tensors: as is for an
// mlp; for an encoder, checked token tensors, with text tokenized first.
func prepare(m *models.Model, req *inferRequest) (*steps.Request, error) {
	cfg := m.Config
	// The step request and the usual few buffer headers in one allocation,
	// and every output in one buffer.
	bundle := new(struct {
		sr           steps.Request
		inputs, outs [3][]byte
	})
	sr := &bundle.sr
	sr.Rows = req.rows
	sr.Inputs, sr.Outputs = bundle.inputs[:0], bundle.outs[:0]
	if len(cfg.Outputs) > len(bundle.outs) {
		sr.Outputs = make([][]byte, 0, len(cfg.Outputs))
	}
	for _, t := range req.inputs {
		if n, ok := declaredElements(t.shape); ok {
			sr.Elements += int(n)
		}
	}
	total := 0
	for _, o := range cfg.Outputs {
		total += req.rows * o.RowBytes(0)
	}
	outs := make([]byte, total)
	for _, o := range cfg.Outputs {
		n := req.rows * o.RowBytes(0)
		sr.Outputs = append(sr.Outputs, outs[:n:n])
		outs = outs[n:]
	}
	if cfg.Architecture != "encoder" {
		for _, t := range req.inputs {
			sr.Inputs = append(sr.Inputs, t.data)
		}
		return sr, nil
	}

	enc := cfg.Encoder
	maxSeq := cfg.Buckets.Seq[len(cfg.Buckets.Seq)-1]
	var ids, mask, types []int64
	if cfg.TextInput() {
		texts := req.inputs[0].strs
		tokens := make([][]int64, len(texts))
		for i, text := range texts {
			var err error
			if tokens[i], err = m.Tokenizer.Encode(text, maxSeq, enc.Truncate); err != nil {
				return nil, badRequest(fmt.Sprintf("input %q: element %d: %v (the largest seq bucket); shorten it, or set encoder.truncate: true", cfg.Inputs[0].Name, i, err))
			}
			sr.Seq = max(sr.Seq, len(tokens[i]))
		}
		ids = make([]int64, req.rows*sr.Seq)
		mask = make([]int64, req.rows*sr.Seq)
		types = make([]int64, req.rows*sr.Seq)
		for i, toks := range tokens {
			row := ids[i*sr.Seq : (i+1)*sr.Seq]
			for j := range row {
				row[j] = m.Tokenizer.PAD
			}
			copy(row, toks)
			for j := range toks {
				mask[i*sr.Seq+j] = 1
			}
		}
	} else {
		sr.Seq = int(req.inputs[0].shape[1])
		if sr.Seq > maxSeq {
			return nil, badRequest(fmt.Sprintf("input %q: sequence length %d exceeds the largest seq bucket %d", cfg.Inputs[0].Name, sr.Seq, maxSeq))
		}
		for _, t := range req.inputs[1:] {
			if t.shape != nil && t.shape[1] != req.inputs[0].shape[1] {
				return nil, badRequest(fmt.Sprintf("input shapes %v and %v differ; input_ids, attention_mask and token_type_ids must have the same shape", req.inputs[0].shape, t.shape))
			}
		}
		ids, mask = int64sOf(req.inputs[0].data), int64sOf(req.inputs[1].data)
		types = make([]int64, len(ids))
		if len(req.inputs) > 2 && req.inputs[2].data != nil {
			types = int64sOf(req.inputs[2].data)
		}
		if err := checkTokens(ids, mask, types, enc); err != nil {
			return nil, err
		}
	}
	sr.Inputs = append(sr.Inputs[:0], int64Bytes(ids), int64Bytes(mask), int64Bytes(types))
	return sr, nil
}

// checkTokens keeps every id inside the embedding tables it indexes.
func checkTokens(ids, mask, types []int64, enc *models.EncoderConfig) error {
	for i := range ids {
		switch {
		case ids[i] < 0 || ids[i] >= int64(enc.VocabSize):
			return badRequest(fmt.Sprintf("input \"input_ids\": element %d is %d; token ids must be in 0..%d", i, ids[i], enc.VocabSize-1))
		case mask[i] != 0 && mask[i] != 1:
			return badRequest(fmt.Sprintf("input \"attention_mask\": element %d is %d; want 0 or 1", i, mask[i]))
		case types[i] < 0 || types[i] >= int64(enc.TypeVocabSize):
			return badRequest(fmt.Sprintf("input \"token_type_ids\": element %d is %d; want 0..%d", i, types[i], enc.TypeVocabSize-1))
		}
	}
	return nil
}

func int64sOf(b []byte) []int64 {
	out := make([]int64, len(b)/8)
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out
}

func int64Bytes(v []int64) []byte {
	b := make([]byte, 0, 8*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, uint64(x))
	}
	return b
}
