package models

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
)

// maxSafetensorsHeader bounds the JSON header, as the reference
// implementation does, so that a corrupt length cannot make us allocate
// gigabytes before the first check.
const maxSafetensorsHeader = 100 << 20

// ErrSafetensors is wrapped by every error that describes a malformed
// safetensors file.
var ErrSafetensors = errors.New("models: malformed safetensors")

// Tensor is one named weight, converted to float32 on load whatever its
// stored dtype, in row-major order.
type Tensor struct {
	Name  string
	Dtype string // the dtype stored in the file: F32, F16 or BF16
	Shape []int
	Data  []float32
}

// Numel is the number of elements the shape holds.
func (t *Tensor) Numel() int { return numel(t.Shape) }

// Weights is the content of one safetensors file.
type Weights struct {
	Path     string
	Tensors  map[string]*Tensor
	Metadata map[string]string
}

// Tensor returns the named tensor checked against the expected shape; the
// error names the file, the tensor, and the shape found and wanted.
func (w *Weights) Tensor(name string, shape ...int) (*Tensor, error) {
	t, ok := w.Tensors[name]
	if !ok {
		return nil, fmt.Errorf("%s: tensor %q is missing (want shape %v)", w.Path, name, shape)
	}
	if !slices.Equal(t.Shape, shape) {
		return nil, fmt.Errorf("%s: tensor %q has shape %v, want %v", w.Path, name, t.Shape, shape)
	}
	return t, nil
}

var safetensorsDtypeSize = map[string]int{"F32": 4, "F16": 2, "BF16": 2}

type safetensorsEntry struct {
	Dtype       string `json:"dtype"`
	Shape       []int  `json:"shape"`
	DataOffsets []int  `json:"data_offsets"`
}

// ReadSafetensors reads and checks a whole safetensors file. A truncated or
// inconsistent file is an error naming the file and the tensor; it never
// panics, whatever the bytes.
func ReadSafetensors(path string) (*Weights, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	w, err := ParseSafetensors(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	w.Path = path
	return w, nil
}

// ParseSafetensors decodes a safetensors file held in memory. The returned
// tensors do not alias b.
func ParseSafetensors(b []byte) (*Weights, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("%w: file is %d bytes, shorter than the 8-byte header length", ErrSafetensors, len(b))
	}
	n := binary.LittleEndian.Uint64(b[:8])
	if n > maxSafetensorsHeader {
		return nil, fmt.Errorf("%w: header length %d exceeds the %d-byte limit", ErrSafetensors, n, maxSafetensorsHeader)
	}
	if n > uint64(len(b)-8) {
		return nil, fmt.Errorf("%w: header length %d runs past the end of the %d-byte file (truncated?)", ErrSafetensors, n, len(b))
	}
	header, data := b[8:8+n], b[8+n:]

	var raw map[string]json.RawMessage
	if err := json.Unmarshal(header, &raw); err != nil {
		return nil, fmt.Errorf("%w: header is not a JSON object: %v", ErrSafetensors, err)
	}
	w := &Weights{Tensors: make(map[string]*Tensor, len(raw))}
	type span struct {
		name       string
		begin, end int
	}
	spans := make([]span, 0, len(raw))
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &w.Metadata); err != nil {
				return nil, fmt.Errorf("%w: __metadata__ must map strings to strings: %v", ErrSafetensors, err)
			}
			continue
		}
		var e safetensorsEntry
		dec := json.NewDecoder(bytes.NewReader(msg))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("%w: tensor %q: bad header entry: %v", ErrSafetensors, name, err)
		}
		size, ok := safetensorsDtypeSize[e.Dtype]
		if !ok {
			return nil, fmt.Errorf("%w: tensor %q: dtype %q is not supported; want F32, F16 or BF16", ErrSafetensors, name, e.Dtype)
		}
		count := 1
		for _, d := range e.Shape {
			if d < 0 {
				return nil, fmt.Errorf("%w: tensor %q: negative dimension in shape %v", ErrSafetensors, name, e.Shape)
			}
			if d != 0 && count > math.MaxInt32/d {
				return nil, fmt.Errorf("%w: tensor %q: shape %v is too large", ErrSafetensors, name, e.Shape)
			}
			count *= d
		}
		if len(e.DataOffsets) != 2 {
			return nil, fmt.Errorf("%w: tensor %q: data_offsets must be [begin, end], got %v", ErrSafetensors, name, e.DataOffsets)
		}
		begin, end := e.DataOffsets[0], e.DataOffsets[1]
		if begin < 0 || end < begin || end > len(data) {
			return nil, fmt.Errorf("%w: tensor %q: data_offsets [%d, %d] fall outside the %d-byte data section (truncated?)", ErrSafetensors, name, begin, end, len(data))
		}
		if end-begin != count*size {
			return nil, fmt.Errorf("%w: tensor %q: data_offsets span %d bytes, but %s%v needs %d", ErrSafetensors, name, end-begin, e.Dtype, e.Shape, count*size)
		}
		w.Tensors[name] = &Tensor{
			Name:  name,
			Dtype: e.Dtype,
			Shape: e.Shape,
			Data:  decodeFloats(e.Dtype, data[begin:end], count),
		}
		spans = append(spans, span{name, begin, end})
	}

	// The format requires the tensors to tile the data section exactly: an
	// overlap or a hole means the header and the data disagree.
	sort.Slice(spans, func(i, j int) bool { return spans[i].begin < spans[j].begin })
	at, prev := 0, ""
	for _, s := range spans {
		if s.begin < at {
			return nil, fmt.Errorf("%w: tensor %q: data_offsets [%d, %d] overlap tensor %q", ErrSafetensors, s.name, s.begin, s.end, prev)
		}
		if s.begin > at {
			return nil, fmt.Errorf("%w: tensor %q: %d unclaimed bytes before its data at offset %d", ErrSafetensors, s.name, s.begin-at, s.begin)
		}
		at, prev = s.end, s.name
	}
	if at != len(data) {
		return nil, fmt.Errorf("%w: %d bytes after the last tensor are claimed by none", ErrSafetensors, len(data)-at)
	}
	return w, nil
}

func decodeFloats(dtype string, b []byte, count int) []float32 {
	out := make([]float32, count)
	switch dtype {
	case "F32":
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case "F16":
		for i := range out {
			out[i] = Float16ToFloat32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case "BF16":
		for i := range out {
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
		}
	}
	return out
}

// Float16ToFloat32 converts an IEEE 754 half-precision value.
func Float16ToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: normalise into float32's wider exponent
		e := uint32(127 - 15 + 1)
		for mant&0x400 == 0 {
			mant <<= 1
			e--
		}
		return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
	default:
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	}
}

// WriteSafetensors writes F32 tensors in name order with the given metadata.
// It is what the training program uses to ship weights, and what tests use to
// build files.
func WriteSafetensors(w io.Writer, tensors []*Tensor, metadata map[string]string) error {
	sorted := slices.Clone(tensors)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	header := make(map[string]any, len(sorted)+1)
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	off := 0
	for _, t := range sorted {
		if len(t.Data) != t.Numel() {
			return fmt.Errorf("models: tensor %q: %d values for shape %v", t.Name, len(t.Data), t.Shape)
		}
		n := 4 * len(t.Data)
		header[t.Name] = safetensorsEntry{Dtype: "F32", Shape: t.Shape, DataOffsets: []int{off, off + n}}
		off += n
	}
	hb, err := json.Marshal(header)
	if err != nil {
		return err
	}
	// Pad the header with spaces so the data starts 8-byte aligned.
	for len(hb)%8 != 0 {
		hb = append(hb, ' ')
	}
	buf := make([]byte, 8, 8+len(hb)+off)
	binary.LittleEndian.PutUint64(buf, uint64(len(hb)))
	buf = append(buf, hb...)
	for _, t := range sorted {
		for _, v := range t.Data {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
		}
	}
	_, err = w.Write(buf)
	return err
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}
