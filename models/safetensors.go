package models

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/stepserve/stepserve/internal/clip"
	"github.com/stepserve/stepserve/internal/half"
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
	// Data is nil until the file's data is read.
	Data []float32

	begin, end int64 // the tensor's bytes in the data section
	shard      int   // the file that holds it: an index into Weights.Paths (0 for one file)
}

// Numel is the number of elements the shape holds.
func (t *Tensor) Numel() int { return numel(t.Shape) }

// Weights is the content of one safetensors file.
type Weights struct {
	// Path is where the file is on disk, for an engine that reads it
	// itself. Name is how errors name it: its path in the model
	// repository (digits/weights.safetensors), or Path when it was read
	// from outside one.
	Path     string
	Name     string
	Tensors  map[string]*Tensor
	Metadata map[string]string
	// Paths are the files on disk, for weights sharded over several (a
	// model.safetensors.index.json's shards), Path their first; nil for
	// one file.
	Paths []string

	dataStart int64 // where the data section starts in the file
	// shardStarts are where each shard's data section starts, for
	// sharded weights.
	shardStarts []int64
}

// Drop forgets the named tensors: they are not read, and not counted in
// [Weights.ResidentBytes]. A model drops the tensors it does not use
// before its weights are read.
func (w *Weights) Drop(names []string) {
	for _, n := range names {
		delete(w.Tensors, n)
	}
}

// Tensor returns the named tensor checked against the expected shape; the
// error names the file, the tensor, and the shape found and wanted.
func (w *Weights) Tensor(name string, shape ...int) (*Tensor, error) {
	t, ok := w.Tensors[name]
	if !ok {
		return nil, fmt.Errorf("%s: tensor %q is missing (want shape %v)", w.name(), clip.Clip(name, maxNameInError), shape)
	}
	if !slices.Equal(t.Shape, shape) {
		return nil, fmt.Errorf("%s: tensor %q has shape %v, want %v", w.name(), clip.Clip(name, maxNameInError), t.Shape, shape)
	}
	if t.Dtype != "" && !floatDtypes[t.Dtype] { // "": built in memory, float32
		return nil, fmt.Errorf("%s: tensor %q is %s; want F32, F16 or BF16", w.name(), clip.Clip(name, maxNameInError), t.Dtype)
	}
	return t, nil
}

// name is how errors name the file.
func (w *Weights) name() string {
	if w.Name != "" {
		return w.Name
	}
	return w.Path
}

// ResidentBytes is the memory the tensors take once read: every value a
// float32, whatever the file stores. It is known from the header alone.
func (w *Weights) ResidentBytes() int64 {
	var n int64
	for _, t := range w.Tensors {
		n += int64(t.Numel()) * 4
	}
	return n
}

// maxNameInError bounds how much of a name read from a file an error
// quotes: enough to recognise it, never a file's worth.
const maxNameInError = 64

var safetensorsDtypeSize = map[string]int{"F32": 4, "F16": 2, "BF16": 2,
	// Read by the worker for architecture torch (a state_dict's integer
	// buffers, say); the built-in architectures refuse them (readData).
	"F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}

// floatDtypes are the stored dtypes the built-in architectures read.
var floatDtypes = map[string]bool{"F32": true, "F16": true, "BF16": true}

type safetensorsEntry struct {
	Dtype       string `json:"dtype"`
	Shape       []int  `json:"shape"`
	DataOffsets []int  `json:"data_offsets"`
}

// ReadSafetensors reads and checks a whole safetensors file. A truncated or
// inconsistent file is an error naming the file and the tensor; it never
// panics, whatever the bytes. Only a regular file is read; its header is
// checked against the file's size before any tensor's data is read, and
// the data is read a chunk at a time, never held whole.
func ReadSafetensors(path string) (*Weights, error) {
	root, err := os.OpenRoot(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	defer root.Close()
	f, err := openFile(root, filepath.Base(path), 0)
	if err != nil {
		return nil, fmt.Errorf("models: %w", err)
	}
	defer f.Close()
	f.Name = path
	w, err := readHeader(f)
	if err != nil {
		return nil, err
	}
	if err := w.readData(context.Background(), f); err != nil {
		return nil, err
	}
	w.Path = path
	return w, nil
}

// readHeader reads and checks the header of an opened safetensors file:
// every tensor's dtype, shape and place in the data section, which the
// file's size must hold exactly. Nothing it allocates grows with the data.
func readHeader(f *repoFile) (*Weights, error) {
	var lenBuf [8]byte
	if _, err := io.ReadFull(f, lenBuf[:]); err != nil {
		return nil, fmt.Errorf("%s: %w: file is %d bytes, shorter than the 8-byte header length", f.Name, ErrSafetensors, f.Size)
	}
	n, err := headerLength(lenBuf[:], f.Size)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Name, err)
	}
	header := make([]byte, n)
	if _, err := io.ReadFull(f, header); err != nil {
		return nil, fmt.Errorf("%s: %w: reading the header: %v (truncated?)", f.Name, ErrSafetensors, unwrapPath(err))
	}
	w, err := parseHeader(header, f.Size-8-int64(n))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Name, err)
	}
	w.Name, w.dataStart = f.Name, 8+int64(n)
	return w, nil
}

// readChunk is how much of a tensor is read at a time: the file's bytes
// are never held whole, only the float32 values they become.
const readChunk = 1 << 20

// readData reads every tensor's values from f, whose header w was read
// from, in file order and a chunk at a time, checking ctx between chunks.
// Sharded weights take one opened file per shard, in Paths' order.
func (w *Weights) readData(ctx context.Context, files ...*repoFile) error {
	sorted := make([]*Tensor, 0, len(w.Tensors))
	for _, t := range w.Tensors {
		sorted = append(sorted, t)
	}
	slices.SortFunc(sorted, func(a, b *Tensor) int {
		return cmp.Or(cmp.Compare(a.shard, b.shard), cmp.Compare(a.begin, b.begin))
	})
	buf := make([]byte, readChunk)
	for _, t := range sorted {
		if !floatDtypes[t.Dtype] {
			// Not a weight the built-in architectures take (a checkpoint's
			// I64 embeddings.position_ids, say): left unread. Tensor
			// refuses it by name if an architecture asks for it.
			continue
		}
		f, start := files[0], w.dataStart
		if w.shardStarts != nil {
			if t.shard >= len(files) {
				return fmt.Errorf("%s: tensor %q is in shard %d of %d opened", w.name(), clip.Clip(t.Name, maxNameInError), t.shard, len(files))
			}
			f, start = files[t.shard], w.shardStarts[t.shard]
		}
		size := int64(safetensorsDtypeSize[t.Dtype])
		t.Data = make([]float32, t.Numel())
		for done := int64(0); done < t.end-t.begin; {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("%s: reading the weights: %w", w.name(), err)
			}
			chunk := buf[:min(int64(len(buf)), t.end-t.begin-done)]
			if _, err := f.ReadAt(chunk, start+t.begin+done); err != nil {
				return fmt.Errorf("%s: %w: tensor %q: reading its data: %v (the file changed while it was read?)",
					f.Name, ErrSafetensors, clip.Clip(t.Name, maxNameInError), unwrapPath(err))
			}
			decodeInto(t.Dtype, chunk, t.Data[done/size:])
			done += int64(len(chunk))
		}
	}
	return nil
}

// mergeShards makes one Weights of the shards' headers, each tensor
// remembering its shard; a tensor in two shards is an error. name is how
// errors name the whole (the index file).
func mergeShards(name string, shards []*Weights, paths []string) (*Weights, error) {
	out := &Weights{Name: name, Tensors: map[string]*Tensor{}, Paths: paths, shardStarts: make([]int64, len(shards))}
	if len(paths) > 0 {
		out.Path = paths[0]
	}
	for i, s := range shards {
		out.shardStarts[i] = s.dataStart
		for n, t := range s.Tensors {
			if _, dup := out.Tensors[n]; dup {
				return nil, fmt.Errorf("%s: %w: tensor %q is in two shards (the second %s)", name, ErrSafetensors, clip.Clip(n, maxNameInError), s.Name)
			}
			t.shard = i
			out.Tensors[n] = t
		}
		if out.Metadata == nil {
			out.Metadata = s.Metadata
		}
	}
	return out, nil
}

// ParseSafetensors decodes a safetensors file held in memory. The returned
// tensors do not alias b.
func ParseSafetensors(b []byte) (*Weights, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("%w: file is %d bytes, shorter than the 8-byte header length", ErrSafetensors, len(b))
	}
	n, err := headerLength(b[:8], int64(len(b)))
	if err != nil {
		return nil, err
	}
	header, data := b[8:8+n], b[8+n:]
	w, err := parseHeader(header, int64(len(data)))
	if err != nil {
		return nil, err
	}
	for _, t := range w.Tensors {
		if !floatDtypes[t.Dtype] {
			continue // values of other dtypes are the worker's to read; Data stays nil
		}
		t.Data = make([]float32, t.Numel())
		decodeInto(t.Dtype, data[t.begin:t.end], t.Data)
	}
	return w, nil
}

// headerLength reads the header's length from the file's first 8 bytes
// and checks it against the limit and the file's size.
func headerLength(b []byte, fileSize int64) (int, error) {
	n := binary.LittleEndian.Uint64(b)
	switch {
	case bytes.HasPrefix(b, []byte("PK\x03\x04")):
		return 0, fmt.Errorf("%w: this is a zip archive, as torch.save writes, not safetensors; save the state_dict as safetensors (docs/models.md, \"Add your own model\")", ErrSafetensors)
	case b[0] == 0x80 && b[1] >= 2 && b[1] <= 5:
		return 0, fmt.Errorf("%w: this is a Python pickle (an old torch.save), not safetensors; save the state_dict as safetensors (docs/models.md, \"Add your own model\")", ErrSafetensors)
	}
	if n > maxSafetensorsHeader {
		return 0, fmt.Errorf("%w: header length %d exceeds the %d-byte limit", ErrSafetensors, n, maxSafetensorsHeader)
	}
	if n > uint64(fileSize-8) {
		return 0, fmt.Errorf("%w: header length %d runs past the end of the %d-byte file (truncated?)", ErrSafetensors, n, fileSize)
	}
	return int(n), nil
}

// parseHeader decodes a header for a data section of dataLen bytes: the
// tensors, without their values. Names read from the file are quoted
// clipped, and decoder errors are clipped, so that no error carries much
// of the file.
func parseHeader(header []byte, dataLen int64) (*Weights, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(header, &raw); err != nil {
		return nil, fmt.Errorf("%w: header is not a JSON object: %s", ErrSafetensors, clip.Clip(err.Error(), maxNameInError))
	}
	w := &Weights{Tensors: make(map[string]*Tensor, len(raw))}
	for name, msg := range raw {
		quoted := clip.Clip(name, maxNameInError)
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &w.Metadata); err != nil {
				return nil, fmt.Errorf("%w: __metadata__ must map strings to strings: %s", ErrSafetensors, clip.Clip(err.Error(), maxNameInError))
			}
			continue
		}
		var e safetensorsEntry
		dec := json.NewDecoder(bytes.NewReader(msg))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("%w: tensor %q: bad header entry: %s", ErrSafetensors, quoted, clip.Clip(err.Error(), maxNameInError))
		}
		size, ok := safetensorsDtypeSize[e.Dtype]
		if !ok {
			return nil, fmt.Errorf("%w: tensor %q: dtype %q is not supported; want F32, F16, BF16, F64, I64, I32, I16, I8, U8 or BOOL", ErrSafetensors, quoted, clip.Clip(e.Dtype, maxNameInError))
		}
		count := 1
		for _, d := range e.Shape {
			if d < 0 {
				return nil, fmt.Errorf("%w: tensor %q: negative dimension in shape %v", ErrSafetensors, quoted, e.Shape)
			}
			if d != 0 && count > math.MaxInt32/d {
				return nil, fmt.Errorf("%w: tensor %q: shape %v is too large", ErrSafetensors, quoted, e.Shape)
			}
			count *= d
		}
		if len(e.DataOffsets) != 2 {
			return nil, fmt.Errorf("%w: tensor %q: data_offsets must be [begin, end], got %v", ErrSafetensors, quoted, e.DataOffsets)
		}
		begin, end := int64(e.DataOffsets[0]), int64(e.DataOffsets[1])
		if begin < 0 || end < begin || end > dataLen {
			return nil, fmt.Errorf("%w: tensor %q: data_offsets [%d, %d] fall outside the %d-byte data section (truncated?)", ErrSafetensors, quoted, begin, end, dataLen)
		}
		if end-begin != int64(count*size) {
			return nil, fmt.Errorf("%w: tensor %q: data_offsets span %d bytes, but %s%v needs %d", ErrSafetensors, quoted, end-begin, e.Dtype, e.Shape, count*size)
		}
		w.Tensors[name] = &Tensor{Name: name, Dtype: e.Dtype, Shape: e.Shape, begin: begin, end: end}
	}

	// The format requires the tensors to tile the data section exactly: an
	// overlap or a hole means the header and the data disagree.
	spans := make([]*Tensor, 0, len(w.Tensors))
	for _, t := range w.Tensors {
		spans = append(spans, t)
	}
	slices.SortFunc(spans, func(a, b *Tensor) int { return cmp.Compare(a.begin, b.begin) })
	at, prev := int64(0), ""
	for _, s := range spans {
		if s.begin < at {
			return nil, fmt.Errorf("%w: tensor %q: data_offsets [%d, %d] overlap tensor %q", ErrSafetensors, clip.Clip(s.Name, maxNameInError), s.begin, s.end, clip.Clip(prev, maxNameInError))
		}
		if s.begin > at {
			return nil, fmt.Errorf("%w: tensor %q: %d unclaimed bytes before its data at offset %d", ErrSafetensors, clip.Clip(s.Name, maxNameInError), s.begin-at, s.begin)
		}
		at, prev = s.end, s.Name
	}
	if at != dataLen {
		return nil, fmt.Errorf("%w: %d bytes after the last tensor are claimed by none", ErrSafetensors, dataLen-at)
	}
	return w, nil
}

// decodeInto converts b, values stored as dtype, into dst.
func decodeInto(dtype string, b []byte, dst []float32) {
	switch dtype {
	case "F32":
		for i := range len(b) / 4 {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case "F16":
		for i := range len(b) / 2 {
			dst[i] = half.ToFloat32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case "BF16":
		for i := range len(b) / 2 {
			dst[i] = half.BFloat16ToFloat32(binary.LittleEndian.Uint16(b[2*i:]))
		}
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
