package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/stepserve/stepserve/internal/half"
)

// Writer accumulates metadata and tensors and writes them as a GGUF
// version 3 file: keys in the order they were set, tensors in the order
// they were added, each tensor's data aligned to general.alignment (32
// unless set).
type Writer struct {
	kv      []kv
	keys    map[string]bool
	tensors []wtensor
	names   map[string]bool
}

type kv struct {
	key   string
	value any
}

type wtensor struct {
	name string
	dims []uint64 // innermost first
	typ  Type
	data []float32 // quantized as typ when written
	raw  []byte    // or the bytes as stored
}

// Set adds a metadata key. The value is one of the types [File.Metadata]
// holds: uint8, int8, uint16, int16, uint32, int32, float32, bool,
// string, uint64, int64, float64, a slice of one of those, or an []any of
// such slices (an array of arrays). Setting a key twice replaces its value.
func (w *Writer) Set(key string, value any) {
	if w.keys[key] {
		for i := range w.kv {
			if w.kv[i].key == key {
				w.kv[i].value = value
			}
		}
		return
	}
	if w.keys == nil {
		w.keys = map[string]bool{}
	}
	w.keys[key] = true
	w.kv = append(w.kv, kv{key, value})
}

// String, Uint32, Int32, Float32 and Bool set a key of that type.
func (w *Writer) String(key, v string)          { w.Set(key, v) }
func (w *Writer) Uint32(key string, v uint32)   { w.Set(key, v) }
func (w *Writer) Int32(key string, v int32)     { w.Set(key, v) }
func (w *Writer) Float32(key string, v float32) { w.Set(key, v) }
func (w *Writer) Bool(key string, v bool)       { w.Set(key, v) }

// Strings, Int32s and Float32s set an array-valued key.
func (w *Writer) Strings(key string, v []string)   { w.Set(key, v) }
func (w *Writer) Int32s(key string, v []int32)     { w.Set(key, v) }
func (w *Writer) Float32s(key string, v []float32) { w.Set(key, v) }

// Tensor adds a tensor of the given row-major shape (outermost first, as
// safetensors and torch write it), stored as typ: F32, F16, BF16, Q8_0 or
// Q4_0, quantized as llama.cpp's reference quantizers do. A quantized
// type's innermost dimension must be a multiple of its block.
func (w *Writer) Tensor(name string, shape []int, typ Type, data []float32) error {
	switch typ {
	case F32, F16, BF16, Q8_0, Q4_0:
	default:
		return fmt.Errorf("gguf: tensor %s: writing %s is not supported (F32, F16, BF16, Q8_0, Q4_0 are)", name, typ)
	}
	dims, n, err := w.dims(name, shape)
	if err != nil {
		return err
	}
	if n != uint64(len(data)) {
		return fmt.Errorf("gguf: tensor %s: shape %v holds %d values, got %d", name, shape, n, len(data))
	}
	if be, _ := typ.Block(); dims[0]%uint64(be) != 0 {
		return fmt.Errorf("gguf: tensor %s: %s packs blocks of %d values; the innermost dimension %d is not a multiple", name, typ, be, dims[0])
	}
	w.tensors = append(w.tensors, wtensor{name: name, dims: dims, typ: typ, data: data})
	return nil
}

// RawTensor adds a tensor whose bytes are given as stored, for a type the
// writer does not quantize to (a Q4_K tensor made elsewhere).
func (w *Writer) RawTensor(name string, shape []int, typ Type, raw []byte) error {
	be, bb := typ.Block()
	if be == 0 {
		return fmt.Errorf("gguf: tensor %s: %d is not a ggml type", name, uint32(typ))
	}
	dims, n, err := w.dims(name, shape)
	if err != nil {
		return err
	}
	if dims[0]%uint64(be) != 0 || n/uint64(be)*uint64(bb) != uint64(len(raw)) {
		return fmt.Errorf("gguf: tensor %s: shape %v of %s takes %d bytes (innermost dimension a multiple of %d), got %d",
			name, shape, typ, n/uint64(be)*uint64(bb), be, len(raw))
	}
	w.tensors = append(w.tensors, wtensor{name: name, dims: dims, typ: typ, raw: raw})
	return nil
}

// dims checks a tensor's name and shape and turns the shape innermost
// first.
func (w *Writer) dims(name string, shape []int) ([]uint64, uint64, error) {
	if name == "" || len(name) > maxTensorName {
		return nil, 0, fmt.Errorf("gguf: tensor name %q: want 1..%d bytes", name, maxTensorName)
	}
	if w.names[name] {
		return nil, 0, fmt.Errorf("gguf: tensor %s added twice", name)
	}
	if len(shape) < 1 || len(shape) > maxDims {
		return nil, 0, fmt.Errorf("gguf: tensor %s: shape %v; want 1..%d dimensions", name, shape, maxDims)
	}
	n := uint64(1)
	dims := make([]uint64, len(shape))
	for i, d := range shape {
		if d < 1 {
			return nil, 0, fmt.Errorf("gguf: tensor %s: shape %v; want every dimension at least 1", name, shape)
		}
		n *= uint64(d)
		dims[len(shape)-1-i] = uint64(d)
	}
	if w.names == nil {
		w.names = map[string]bool{}
	}
	w.names[name] = true
	return dims, n, nil
}

func (t *wtensor) bytes() uint64 {
	if t.raw != nil {
		return uint64(len(t.raw))
	}
	be, bb := t.typ.Block()
	return uint64(len(t.data)) / uint64(be) * uint64(bb)
}

// WriteFile writes the file to path.
func (w *Writer) WriteFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	if _, err := w.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("gguf: %s: %w", path, err)
	}
	return f.Close()
}

// WriteTo writes the file.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	align := uint64(DefaultAlignment)
	for _, e := range w.kv {
		if e.key == "general.alignment" {
			a, ok := e.value.(uint32)
			if !ok || a == 0 || a&(a-1) != 0 || a > maxAlignment {
				return 0, fmt.Errorf("gguf: general.alignment %v (%T); want a uint32 power of two up to %d", e.value, e.value, maxAlignment)
			}
			align = uint64(a)
		}
	}
	pad := func(n uint64) uint64 { return (n + align - 1) / align * align }
	c := &counter{w: bufio.NewWriterSize(out, 1<<20)}
	c.raw([]byte("GGUF"))
	c.u32(3)
	c.u64(uint64(len(w.tensors)))
	c.u64(uint64(len(w.kv)))
	for _, e := range w.kv {
		c.str(e.key)
		if err := c.value(e.value, true); err != nil {
			return c.n, fmt.Errorf("gguf: metadata %s: %w", e.key, err)
		}
	}
	var offset uint64
	for _, t := range w.tensors {
		c.str(t.name)
		c.u32(uint32(len(t.dims)))
		for _, d := range t.dims {
			c.u64(d)
		}
		c.u32(uint32(t.typ))
		c.u64(offset)
		offset += pad(t.bytes())
	}
	c.raw(make([]byte, pad(uint64(c.n))-uint64(c.n)))
	for _, t := range w.tensors {
		if t.raw != nil {
			c.raw(t.raw)
		} else {
			be, _ := t.typ.Block()
			buf := make([]byte, 0, 1<<16)
			for i := 0; i < len(t.data); i += be {
				buf = appendBlock(buf, t.typ, t.data[i:i+be])
				if len(buf) >= 1<<16-64 || i+be == len(t.data) {
					c.raw(buf)
					buf = buf[:0]
				}
			}
		}
		c.raw(make([]byte, pad(t.bytes())-t.bytes()))
	}
	if c.err == nil {
		c.err = c.w.Flush()
	}
	return c.n, c.err
}

// appendBlock appends one block of x stored as typ.
func appendBlock(buf []byte, typ Type, x []float32) []byte {
	le := binary.LittleEndian
	switch typ {
	case F32:
		return le.AppendUint32(buf, math.Float32bits(x[0]))
	case F16:
		return le.AppendUint16(buf, half.FromFloat32(x[0]))
	case BF16:
		return le.AppendUint16(buf, half.BFloat16FromFloat32(x[0]))
	case Q8_0:
		d, q := QuantizeQ8_0(x)
		buf = le.AppendUint16(buf, d)
		for _, v := range q {
			buf = append(buf, byte(v))
		}
		return buf
	default: // Q4_0
		d, q := QuantizeQ4_0(x)
		buf = le.AppendUint16(buf, d)
		return append(buf, q[:]...)
	}
}

// QuantizeQ8_0 quantizes 32 values as llama.cpp's quantize_row_q8_0_ref
// (and gguf-py's converter) does: the scale d = max|x|/127, stored as
// float16, and each value round(x/d), halves away from zero.
func QuantizeQ8_0(x []float32) (d uint16, q [32]int8) {
	var amax float32
	for _, v := range x[:32] {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	dd := amax / 127
	var id float32
	if dd != 0 {
		id = 1 / dd
	}
	for j, v := range x[:32] {
		q[j] = int8(math.Round(float64(v * id)))
	}
	return half.FromFloat32(dd), q
}

// QuantizeQ4_0 quantizes 32 values as ggml's quantize_row_q4_0_ref does:
// d = m/-8 for the value m of largest magnitude (sign kept), each value
// min(15, trunc(x/d + 8.5)), values j and j+16 sharing byte j (low and
// high nibble).
func QuantizeQ4_0(x []float32) (d uint16, q [16]byte) {
	var amax, m float32
	for _, v := range x[:32] {
		if a := float32(math.Abs(float64(v))); amax < a {
			amax, m = a, v
		}
	}
	dd := m / -8
	var id float32
	if dd != 0 {
		id = 1 / dd
	}
	for j := range 16 {
		x0 := min(15, int8(x[j]*id+8.5))
		x1 := min(15, int8(x[16+j]*id+8.5))
		q[j] = byte(x0) | byte(x1)<<4
	}
	return half.FromFloat32(dd), q
}

type counter struct {
	w   *bufio.Writer
	n   int64
	err error
}

func (c *counter) raw(b []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(b)
	c.n += int64(n)
	c.err = err
}

func (c *counter) u8(v uint8)   { c.raw([]byte{v}) }
func (c *counter) u16(v uint16) { c.raw(binary.LittleEndian.AppendUint16(nil, v)) }
func (c *counter) u32(v uint32) { c.raw(binary.LittleEndian.AppendUint32(nil, v)) }
func (c *counter) u64(v uint64) { c.raw(binary.LittleEndian.AppendUint64(nil, v)) }
func (c *counter) str(s string) {
	c.u64(uint64(len(s)))
	c.raw([]byte(s))
}

var errValue = errors.New("not a GGUF metadata value")

// value writes v, preceded by its type when typed (an array's elements
// are not).
func (c *counter) value(v any, typed bool) error {
	t := func(vt ValueType) {
		if typed {
			c.u32(uint32(vt))
		}
	}
	b2u := func(b bool) uint8 {
		if b {
			return 1
		}
		return 0
	}
	switch x := v.(type) {
	case uint8:
		t(TypeUint8)
		c.u8(x)
	case int8:
		t(TypeInt8)
		c.u8(uint8(x))
	case uint16:
		t(TypeUint16)
		c.u16(x)
	case int16:
		t(TypeInt16)
		c.u16(uint16(x))
	case uint32:
		t(TypeUint32)
		c.u32(x)
	case int32:
		t(TypeInt32)
		c.u32(uint32(x))
	case float32:
		t(TypeFloat32)
		c.u32(math.Float32bits(x))
	case bool:
		t(TypeBool)
		c.u8(b2u(x))
	case string:
		t(TypeString)
		c.str(x)
	case uint64:
		t(TypeUint64)
		c.u64(x)
	case int64:
		t(TypeInt64)
		c.u64(uint64(x))
	case float64:
		t(TypeFloat64)
		c.u64(math.Float64bits(x))
	case []uint8:
		return array(c, typed, TypeUint8, x)
	case []int8:
		return array(c, typed, TypeInt8, x)
	case []uint16:
		return array(c, typed, TypeUint16, x)
	case []int16:
		return array(c, typed, TypeInt16, x)
	case []uint32:
		return array(c, typed, TypeUint32, x)
	case []int32:
		return array(c, typed, TypeInt32, x)
	case []float32:
		return array(c, typed, TypeFloat32, x)
	case []bool:
		return array(c, typed, TypeBool, x)
	case []string:
		return array(c, typed, TypeString, x)
	case []uint64:
		return array(c, typed, TypeUint64, x)
	case []int64:
		return array(c, typed, TypeInt64, x)
	case []float64:
		return array(c, typed, TypeFloat64, x)
	case []any:
		// An array of arrays: each element writes its own element type.
		if typed {
			c.u32(uint32(TypeArray))
		}
		c.u32(uint32(TypeArray))
		c.u64(uint64(len(x)))
		for _, e := range x {
			if err := c.value(e, false); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("%w: %T", errValue, v)
	}
	return nil
}

// array writes an array of elem values: as a value of an array of arrays
// (typed false) it starts with its element type, as a key's value with
// the array type first.
func array[T any](c *counter, typed bool, elem ValueType, xs []T) error {
	if typed {
		c.u32(uint32(TypeArray))
	}
	c.u32(uint32(elem))
	c.u64(uint64(len(xs)))
	for _, x := range xs {
		if err := c.value(any(x), false); err != nil {
			return err
		}
	}
	return nil
}
