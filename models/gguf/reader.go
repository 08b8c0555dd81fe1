// Package gguf reads and writes GGUF files, the format llama.cpp and
// ollama serve models in, from the format's description (ggml's
// docs/gguf.md): a header, typed key/value metadata, tensor descriptions,
// then the tensors' data, each aligned.
//
// Everything a file says about sizes is checked before it is used: a
// count, length, dimension or offset is bounded by the bytes left in the
// file before anything is allocated by it, so a hostile file costs at most
// memory proportional to its size and fails with an error wrapping
// [ErrMalformed] (or [ErrUnsupported]) that names the field and its
// offset. GGUF lists a tensor's dimensions innermost first: a [out, in]
// weight has Dims (in, out); [TensorInfo.Shape] gives them outermost first,
// as safetensors and torch do.
package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"slices"
	"strings"

	"github.com/stepserve/stepserve/internal/clip"
)

var (
	// ErrMalformed is wrapped by every error that describes a file that
	// is not well-formed GGUF.
	ErrMalformed = errors.New("gguf: malformed file")
	// ErrUnsupported is wrapped by the errors of a well-formed file this
	// package does not read: version 1, big-endian, a tensor type it
	// cannot convert, an architecture it does not describe.
	ErrUnsupported = errors.New("gguf: unsupported")
)

// Bounds on what a file may declare, beyond the file's size, which bounds
// every count first.
const (
	// maxString bounds one string: chat templates are kilobytes, and a
	// tokenizer.json carried whole as a string a few megabytes.
	maxString = 64 << 20
	// maxKey is gguf.md's bound on a key's length.
	maxKey = 65535
	// maxTensorName is gguf.md's bound on a tensor's name (ggml's
	// GGML_MAX_NAME).
	maxTensorName = 64
	// maxDims is ggml's GGML_MAX_DIMS.
	maxDims = 4
	// maxDepth bounds arrays of arrays: the format allows nesting, no
	// model uses more than two levels.
	maxDepth = 8
	// DefaultAlignment is the data alignment when general.alignment is
	// absent.
	DefaultAlignment = 32
	// maxAlignment bounds general.alignment: a power of two this large
	// is already no layout anyone writes.
	maxAlignment = 1 << 20
	// maxErrName bounds how much of a name read from a file an error
	// quotes.
	maxErrName = 64
)

// magic is "GGUF" read as a little-endian uint32.
const magic = 0x46554747

// File is a parsed GGUF file: its metadata and tensor descriptions, with
// the tensors' data left in the file until read.
type File struct {
	// Version is the format version: 2 or 3.
	Version uint32
	// Keys are the metadata keys in file order; Metadata their values.
	// A scalar is uint8, int8, uint16, int16, uint32, int32, float32,
	// bool, string, uint64, int64 or float64; an array a slice of one of
	// those ([]string, []float32), an array of arrays an []any of them.
	Keys     []string
	Metadata map[string]any
	// Tensors are the tensor descriptions in file order.
	Tensors []TensorInfo
	// Alignment is general.alignment, or 32.
	Alignment uint64
	// DataOffset is where the data section starts in the file; a
	// tensor's bytes start at DataOffset + its Offset.
	DataOffset int64
	// Size is the file's size.
	Size int64

	byName map[string]int
	r      io.ReaderAt
	closer io.Closer
}

// TensorInfo describes one tensor.
type TensorInfo struct {
	Name string
	// Dims are the dimensions innermost first, as the file lists them.
	Dims []uint64
	Type Type
	// Offset is where the tensor's data starts, from the data section's
	// start; Bytes is how many bytes it takes.
	Offset, Bytes uint64
}

// Elements is how many values the tensor holds.
func (t *TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d // checked against overflow at parse
	}
	return n
}

// Shape is the dimensions outermost first (row-major, as safetensors and
// torch write them): a weight with Dims (in, out) has Shape [out, in].
func (t *TensorInfo) Shape() []int {
	s := make([]int, len(t.Dims))
	for i, d := range t.Dims {
		s[len(t.Dims)-1-i] = int(d)
	}
	return s
}

// Open parses the GGUF file at path; Close closes it.
func Open(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	st, err := fh.Stat()
	if err != nil {
		fh.Close()
		return nil, fmt.Errorf("gguf: %w", err)
	}
	if !st.Mode().IsRegular() {
		fh.Close()
		return nil, fmt.Errorf("gguf: %s: not a regular file", path)
	}
	f, err := Parse(fh, st.Size())
	if err != nil {
		fh.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.closer = fh
	return f, nil
}

// Close closes the file Open opened; it does nothing for a File from
// Parse.
func (f *File) Close() error {
	if f.closer == nil {
		return nil
	}
	return f.closer.Close()
}

// Parse reads and checks the header, metadata and tensor descriptions of
// the GGUF file r of size bytes. The tensors' data stays in r, which must
// stay readable while tensors are read.
func Parse(r io.ReaderAt, size int64) (*File, error) {
	if size < 0 {
		return nil, fmt.Errorf("%w: size %d", ErrMalformed, size)
	}
	p := &parser{r: bufio.NewReaderSize(io.NewSectionReader(r, 0, size), 1<<16), size: uint64(size)}
	f := &File{Size: size, r: r, Alignment: DefaultAlignment}
	if err := p.parse(f); err != nil {
		return nil, err
	}
	return f, nil
}

type parser struct {
	r    *bufio.Reader
	size uint64
	pos  uint64 // offset of the next byte r gives
	buf  [8]byte
}

func (p *parser) fail(field string, at uint64, format string, args ...any) error {
	return fmt.Errorf("%w: %s at offset %d: %s", ErrMalformed, field, at, fmt.Sprintf(format, args...))
}

func (p *parser) left() uint64 { return p.size - p.pos }

func (p *parser) read(field string, b []byte) error {
	at := p.pos
	n, err := io.ReadFull(p.r, b)
	p.pos += uint64(n)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return p.fail(field, at, "needs %d bytes, the file ends after %d (truncated?)", len(b), n)
		}
		return fmt.Errorf("gguf: reading %s at offset %d: %w", field, at, err)
	}
	return nil
}

func (p *parser) u32(field string) (uint32, error) {
	if err := p.read(field, p.buf[:4]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(p.buf[:4]), nil
}

func (p *parser) u64(field string) (uint64, error) {
	if err := p.read(field, p.buf[:8]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(p.buf[:8]), nil
}

// count reads a uint64 count of items of at least minBytes bytes each and
// checks that the rest of the file can hold them, so that nothing sized
// by it is allocated for a count the file cannot back.
func (p *parser) count(field string, minBytes uint64) (uint64, error) {
	at := p.pos
	n, err := p.u64(field)
	if err != nil {
		return 0, err
	}
	if n > p.left()/minBytes {
		return 0, p.fail(field, at, "%d items of at least %d bytes each; the file has %d bytes left", n, minBytes, p.left())
	}
	return n, nil
}

func (p *parser) str(field string, limit uint64) (string, error) {
	at := p.pos
	n, err := p.u64(field + " length")
	if err != nil {
		return "", err
	}
	if n > limit {
		return "", p.fail(field, at, "length %d; want at most %d", n, limit)
	}
	if n > p.left() {
		return "", p.fail(field, at, "length %d; the file has %d bytes left (truncated?)", n, p.left())
	}
	b := make([]byte, n)
	if err := p.read(field, b); err != nil {
		return "", err
	}
	return string(b), nil
}

func (p *parser) parse(f *File) error {
	var head [8]byte
	if err := p.read("header", head[:]); err != nil {
		return err
	}
	if m := binary.LittleEndian.Uint32(head[:4]); m != magic {
		return p.fail("magic", 0, "%q; want \"GGUF\" (not a GGUF file)", head[:4])
	}
	f.Version = binary.LittleEndian.Uint32(head[4:])
	switch {
	case f.Version == 2 || f.Version == 3:
	case f.Version == 1:
		return fmt.Errorf("%w: GGUF version 1 (32-bit counts, before 2023-08); want 2 or 3: convert the file again", ErrUnsupported)
	case bits.ReverseBytes32(f.Version) == 2 || bits.ReverseBytes32(f.Version) == 3:
		return fmt.Errorf("%w: a big-endian GGUF file (version %d byte-swapped); want little-endian", ErrUnsupported, bits.ReverseBytes32(f.Version))
	default:
		return p.fail("version", 4, "%d; want 2 or 3", f.Version)
	}
	// The smallest tensor description is a name's length, one dimension's
	// count, its type and offset; the smallest key/value a key's length,
	// one byte of key, a type and a one-byte value.
	nt, err := p.count("tensor_count", 8+4+4+8)
	if err != nil {
		return err
	}
	nkv, err := p.count("metadata_kv_count", 8+1+4+1)
	if err != nil {
		return err
	}
	f.Metadata = make(map[string]any, nkv)
	f.Keys = make([]string, 0, nkv)
	for i := range nkv {
		at := p.pos
		key, err := p.str(fmt.Sprintf("metadata key %d", i), maxKey)
		if err != nil {
			return err
		}
		if key == "" {
			return p.fail(fmt.Sprintf("metadata key %d", i), at, "an empty key")
		}
		if _, dup := f.Metadata[key]; dup {
			return p.fail(fmt.Sprintf("metadata key %d", i), at, "%q appears twice", clip.Clip(key, maxErrName))
		}
		field := fmt.Sprintf("metadata %q", clip.Clip(key, maxErrName))
		typAt := p.pos
		typ, err := p.u32(field + " type")
		if err != nil {
			return err
		}
		v, err := p.value(field, typAt, ValueType(typ), 0)
		if err != nil {
			return err
		}
		f.Keys = append(f.Keys, key)
		f.Metadata[key] = v
	}
	if v, ok := f.Metadata["general.alignment"]; ok {
		a, isU32 := v.(uint32)
		if !isU32 {
			return fmt.Errorf("%w: metadata \"general.alignment\" is %s; want uint32", ErrMalformed, typeName(v))
		}
		if a == 0 || a&(a-1) != 0 || a > maxAlignment {
			return fmt.Errorf("%w: metadata \"general.alignment\" is %d; want a power of two up to %d", ErrMalformed, a, maxAlignment)
		}
		f.Alignment = uint64(a)
	}

	f.Tensors = make([]TensorInfo, nt)
	f.byName = make(map[string]int, nt)
	for i := range nt {
		t := &f.Tensors[i]
		at := p.pos
		if t.Name, err = p.str(fmt.Sprintf("tensor %d name", i), maxTensorName); err != nil {
			return err
		}
		if _, dup := f.byName[t.Name]; dup {
			return p.fail(fmt.Sprintf("tensor %d name", i), at, "%q appears twice", t.Name)
		}
		f.byName[t.Name] = int(i)
		field := fmt.Sprintf("tensor %q", t.Name)
		at = p.pos
		nd, err := p.u32(field + " n_dims")
		if err != nil {
			return err
		}
		if nd < 1 || nd > maxDims {
			return p.fail(field+" n_dims", at, "%d; want 1..%d", nd, maxDims)
		}
		t.Dims = make([]uint64, nd)
		elems := uint64(1)
		for j := range t.Dims {
			at = p.pos
			d, err := p.u64(fmt.Sprintf("%s dimension %d", field, j))
			if err != nil {
				return err
			}
			hi, lo := bits.Mul64(elems, d)
			if d == 0 || hi != 0 || lo > math.MaxInt64 {
				return p.fail(fmt.Sprintf("%s dimension %d", field, j), at, "%d (dims so far %v); want at least 1, and fewer than 2^63 values in all", d, t.Dims[:j])
			}
			t.Dims[j], elems = d, lo
		}
		at = p.pos
		typ, err := p.u32(field + " type")
		if err != nil {
			return err
		}
		t.Type = Type(typ)
		ti, ok := types[t.Type]
		if !ok {
			return p.fail(field+" type", at, "%d is not a ggml type", typ)
		}
		if t.Dims[0]%ti.blockElems != 0 {
			return p.fail(field+" type", at, "%s packs blocks of %d values; the innermost dimension %d is not a multiple", ti.name, ti.blockElems, t.Dims[0])
		}
		hi, bytes := bits.Mul64(elems/ti.blockElems, ti.blockBytes)
		if hi != 0 || bytes > p.size {
			return p.fail(field+" dimensions", at, "%v of %s take %d×%d bytes, more than the file's %d", t.Dims, ti.name, elems/ti.blockElems, ti.blockBytes, p.size)
		}
		t.Bytes = bytes
		at = p.pos
		if t.Offset, err = p.u64(field + " offset"); err != nil {
			return err
		}
		if t.Offset%f.Alignment != 0 {
			return p.fail(field+" offset", at, "%d; want a multiple of the alignment %d", t.Offset, f.Alignment)
		}
	}
	data := (p.pos + f.Alignment - 1) / f.Alignment * f.Alignment
	if data > p.size && nt > 0 {
		return p.fail("data section", p.pos, "starts at %d (aligned to %d), past the file's end at %d (truncated?)", data, f.Alignment, p.size)
	}
	f.DataOffset = int64(min(data, p.size))
	room := p.size - uint64(f.DataOffset)
	order := make([]int, len(f.Tensors))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		oa, ob := f.Tensors[a].Offset, f.Tensors[b].Offset
		if oa != ob {
			if oa < ob {
				return -1
			}
			return 1
		}
		return a - b
	})
	var end uint64 // where the previous tensor (in offset order) ends
	var prev string
	for _, i := range order {
		t := &f.Tensors[i]
		if t.Offset > room || t.Bytes > room-t.Offset {
			return fmt.Errorf("%w: tensor %q: %d bytes (%s, dims %v) at data offset %d end past the file: the data section holds %d bytes (truncated?)",
				ErrMalformed, t.Name, t.Bytes, t.Type, t.Dims, t.Offset, room)
		}
		if t.Offset < end {
			return fmt.Errorf("%w: tensor %q at data offset %d overlaps tensor %q, which ends at %d", ErrMalformed, t.Name, t.Offset, prev, end)
		}
		end, prev = t.Offset+t.Bytes, t.Name
	}
	return nil
}

// value reads a metadata value of type typ (read at typAt).
func (p *parser) value(field string, typAt uint64, typ ValueType, depth int) (any, error) {
	if typ == TypeArray {
		return p.array(field, depth)
	}
	if typ == TypeString {
		return p.str(field, maxString)
	}
	n := typ.size()
	if n == 0 {
		return nil, p.fail(field+" type", typAt, "%d is not a metadata value type (0..12)", uint32(typ))
	}
	at := p.pos
	if err := p.read(field, p.buf[:n]); err != nil {
		return nil, err
	}
	v := scalar(typ, p.buf[:n])
	if typ == TypeBool && p.buf[0] > 1 {
		return nil, p.fail(field, at, "bool %d; want 0 or 1", p.buf[0])
	}
	return v, nil
}

func scalar(typ ValueType, b []byte) any {
	le := binary.LittleEndian
	switch typ {
	case TypeUint8:
		return b[0]
	case TypeInt8:
		return int8(b[0])
	case TypeUint16:
		return le.Uint16(b)
	case TypeInt16:
		return int16(le.Uint16(b))
	case TypeUint32:
		return le.Uint32(b)
	case TypeInt32:
		return int32(le.Uint32(b))
	case TypeFloat32:
		return math.Float32frombits(le.Uint32(b))
	case TypeBool:
		return b[0] != 0
	case TypeUint64:
		return le.Uint64(b)
	case TypeInt64:
		return int64(le.Uint64(b))
	case TypeFloat64:
		return math.Float64frombits(le.Uint64(b))
	}
	return nil
}

func (p *parser) array(field string, depth int) (any, error) {
	at := p.pos
	if depth >= maxDepth {
		return nil, p.fail(field, at, "arrays nested more than %d deep", maxDepth)
	}
	et, err := p.u32(field + " array type")
	if err != nil {
		return nil, err
	}
	typ := ValueType(et)
	minBytes := typ.size()
	switch typ {
	case TypeString:
		minBytes = 8
	case TypeArray:
		minBytes = 4 + 8
	}
	if minBytes == 0 {
		return nil, p.fail(field+" array type", at, "%d is not a metadata value type (0..12)", et)
	}
	n, err := p.count(field+" array length", minBytes)
	if err != nil {
		return nil, err
	}
	switch typ {
	case TypeString:
		out := make([]string, n)
		for i := range out {
			if out[i], err = p.str(fmt.Sprintf("%s[%d]", field, i), maxString); err != nil {
				return nil, err
			}
		}
		return out, nil
	case TypeArray:
		out := make([]any, n)
		for i := range out {
			if out[i], err = p.array(fmt.Sprintf("%s[%d]", field, i), depth+1); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	raw := make([]byte, n*minBytes)
	if err := p.read(field, raw); err != nil {
		return nil, err
	}
	switch typ {
	case TypeUint8:
		return raw, nil
	case TypeInt8:
		return decode(raw, 1, func(b []byte) int8 { return int8(b[0]) }), nil
	case TypeUint16:
		return decode(raw, 2, binary.LittleEndian.Uint16), nil
	case TypeInt16:
		return decode(raw, 2, func(b []byte) int16 { return int16(binary.LittleEndian.Uint16(b)) }), nil
	case TypeUint32:
		return decode(raw, 4, binary.LittleEndian.Uint32), nil
	case TypeInt32:
		return decode(raw, 4, func(b []byte) int32 { return int32(binary.LittleEndian.Uint32(b)) }), nil
	case TypeFloat32:
		return decode(raw, 4, func(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }), nil
	case TypeBool:
		for i, b := range raw {
			if b > 1 {
				return nil, p.fail(fmt.Sprintf("%s[%d]", field, i), p.pos-n+uint64(i), "bool %d; want 0 or 1", b)
			}
		}
		return decode(raw, 1, func(b []byte) bool { return b[0] != 0 }), nil
	case TypeUint64:
		return decode(raw, 8, binary.LittleEndian.Uint64), nil
	case TypeInt64:
		return decode(raw, 8, func(b []byte) int64 { return int64(binary.LittleEndian.Uint64(b)) }), nil
	default: // TypeFloat64
		return decode(raw, 8, func(b []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b)) }), nil
	}
}

func decode[T any](raw []byte, size int, f func([]byte) T) []T {
	out := make([]T, len(raw)/size)
	for i := range out {
		out[i] = f(raw[i*size:])
	}
	return out
}

// typeName names a metadata value's type for an error.
func typeName(v any) string {
	switch v := v.(type) {
	case nil:
		return "absent"
	case []any:
		return "an array of arrays"
	case []uint8:
		return "an array of uint8"
	case string:
		return "string"
	default:
		s := fmt.Sprintf("%T", v)
		if rest, ok := strings.CutPrefix(s, "[]"); ok {
			return "an array of " + rest
		}
		return s
	}
}

// TensorByName returns the named tensor's description.
func (f *File) TensorByName(name string) (*TensorInfo, bool) {
	i, ok := f.byName[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}
