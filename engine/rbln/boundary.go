// The graph boundary: how a bucket's inputs and outputs lie in the device
// staging the worker maps, and the conversion, on every step, between it
// and the host layout ([engine.NewLayout]) that callers of
// [engine.Program.Staging] fill and read.

package rbln

import (
	"fmt"
	"os"
	"slices"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/models"
)

// boundaryAlign is the device's rule for last dimensions: a multiple of 64
// elements (the reference's alignment rules and step structure).
const boundaryAlign = 64

// cpuDtypeEnv is worker.py's CPU_DTYPE_ENV: "device" makes a worker on the
// host CPU compute in the model's device_dtype.
const cpuDtypeEnv = "STEPSERVE_WORKER_CPU_DTYPE"

// computeDtype is the dtype a worker of opts computes cfg's model in, and
// so the one its staging carries floats in: the model's device_dtype, but
// float32 on the torch engine (the host CPU, whose torch has no float16
// matmul) unless the worker's environment sets cpuDtypeEnv=device. The
// worker keeps the same rule and refuses a load that says otherwise.
func computeDtype(opts *Options, cfg *models.Config) (dtype, error) {
	if opts.Device == DeviceCPU && workerEnv(opts, cpuDtypeEnv) != "device" {
		return dtFloat32, nil
	}
	return parseFloatDtype(cfg.DeviceDtype)
}

// ComputeDtype implements [engine.DtypeEngine]: the dtype computeDtype
// chooses, the one the worker computes in (a load that would differ is
// refused).
func (e *Engine) ComputeDtype(cfg *models.Config) string {
	d, err := computeDtype(&e.opts, cfg)
	if err != nil {
		return ""
	}
	return d.String()
}

// workerEnv is a variable as the workers see it: Options.Env over the
// server's own environment.
func workerEnv(opts *Options, key string) string {
	if v, ok := opts.Env[key]; ok {
		return v
	}
	return os.Getenv(key)
}

// hostDtype is the element type of a host-layout tensor of datatype d, and
// whether the worker stages it (architecture torch's datatypes).
func hostDtype(d models.Datatype) (dtype, bool) {
	switch d {
	case models.FP32:
		return dtFloat32, true
	case models.FP16:
		return dtFloat16, true
	case models.BF16:
		return dtBFloat16, true
	case models.INT64:
		return dtInt64, true
	case models.INT32:
		return dtInt32, true
	case models.UINT8:
		return dtUint8, true
	case models.BOOL:
		return dtBool, true
	case models.INT8:
		return dtInt8, true
	case models.INT16:
		return dtInt16, true
	case models.UINT16:
		return dtUint16, true
	case models.UINT32:
		return dtUint32, true
	case models.UINT64:
		return dtUint64, true
	case models.FP64:
		return dtFloat64, true
	}
	return 0, false
}

// deviceDtype is the element type host type d travels in on the device,
// floats aside (they travel in the compute dtype): the unsigned types
// torch cannot compute with in the next wider signed one (uint64 in
// int64, saturated at 2^63-1); worker.py's usermodel keeps the same
// table.
func deviceDtype(d dtype) dtype {
	switch d {
	case dtUint16:
		return dtInt32
	case dtUint32, dtUint64:
		return dtInt64
	}
	return d
}

// boundary is one bucket's graph boundary. The step graph takes one
// [batch, in.row] tensor and returns one [batch, out.row] tensor. Each row
// holds the host tensors' rows side by side (for an encoder: input_ids,
// attention_mask, token_type_ids), then zeros up to a multiple of
// boundaryAlign elements, which the graph slices off its input and pads
// its output with.
type boundary struct {
	batch   int
	in, out side
}

// side is one of a boundary's two staging buffers.
type side struct {
	dt      dtype // its element type (uint8 for a byte row)
	cols    int   // elements of each row that hold data
	row     int   // elements in each row: cols rounded up to boundaryAlign
	tensors []column
	// byteRow: a byte row, whose tensors each have their own device type
	// (column.to) and start at column.at bytes, with gaps between them.
	byteRow bool
}

// column is one host tensor's place in a side's rows.
type column struct {
	from   dtype // its element type in the host layout
	to     dtype // its element type in a byte row (else the side's)
	offset int   // where the tensor starts in the host buffer, in bytes
	width  int   // its elements per row
	at     int   // its first element in a device row (its first byte in a byte row)
}

// newBoundary lays out bucket l's device staging: floats in floats, int64
// inputs as int32 (token ids, masks and type ids: models.PrepareInputs
// keeps every id below vocab_size, at most 2^22, so none is narrowed; one
// that were would saturate, never wrap). A model of architecture torch
// (torch) keeps each tensor's own device type (floats in floats, the
// others as declared): a row of that type where a side's tensors share
// one, else a row of bytes with each at a multiple of 64 bytes, which the
// user's step body views out of the one buffer (newTorchSide).
func newBoundary(l engine.Layout, floats dtype, torch bool) (boundary, error) {
	newSide := newSide
	if torch {
		newSide = newTorchSide
	}
	in, err := newSide(l.Inputs, floats)
	if err != nil {
		return boundary{}, fmt.Errorf("bucket %s inputs: %w", l.Bucket.Label(), err)
	}
	out, err := newSide(l.Outputs, floats)
	if err != nil {
		return boundary{}, fmt.Errorf("bucket %s outputs: %w", l.Bucket.Label(), err)
	}
	return boundary{batch: l.Bucket.Batch, in: in, out: out}, nil
}

func newSide(tensors []engine.TensorLayout, floats dtype) (side, error) {
	var s side
	for i, t := range tensors {
		var from, to dtype
		switch t.Datatype {
		case models.FP32:
			from, to = dtFloat32, floats
		case models.INT64:
			from, to = dtInt64, dtInt32
		case models.INT32: // a decoder's step rows
			from, to = dtInt32, dtInt32
		default:
			return side{}, fmt.Errorf("tensor %q is %s; the worker stages FP32, INT64 and INT32 tensors only", t.Name, t.Datatype)
		}
		if i > 0 && to != s.dt {
			return side{}, fmt.Errorf("tensors %q and %q would share one device tensor as %s and %s", tensors[0].Name, t.Name, s.dt, to)
		}
		width := t.RowBytes / t.Datatype.Size()
		s.dt = to
		s.tensors = append(s.tensors, column{from: from, offset: t.Offset, width: width, at: s.cols})
		s.cols += width
	}
	s.row = (s.cols + boundaryAlign - 1) / boundaryAlign * boundaryAlign
	return s, nil
}

// newTorchSide lays out a side of an architecture torch model: every
// tensor in its device type (floats in floats, the others as declared).
// Where they all have the same one, the side is a row of that type, the
// tensors side by side as newSide lays them out, and the graph slices
// them out with no reinterpretation (step 3 of the recommended structure:
// one dtype at the boundary). Only a side that mixes types is a byte row
// (newByteSide), whose bitcasts the warm-up proves the frontend lowers.
func newTorchSide(tensors []engine.TensorLayout, floats dtype) (side, error) {
	var s side
	for i, t := range tensors {
		from, to, err := torchDtypes(t, floats)
		if err != nil {
			return side{}, err
		}
		if i > 0 && to != s.dt {
			return newByteSide(tensors, floats)
		}
		width := t.RowBytes / t.Datatype.Size()
		s.dt = to
		s.tensors = append(s.tensors, column{from: from, to: to, offset: t.Offset, width: width, at: s.cols})
		s.cols += width
	}
	s.row = (s.cols + boundaryAlign - 1) / boundaryAlign * boundaryAlign
	return s, nil
}

// newByteSide lays out a byte row: every tensor in its device type at a
// multiple of boundaryAlign bytes (the device's 64-element rule for a
// uint8 row, and a multiple of every element size).
func newByteSide(tensors []engine.TensorLayout, floats dtype) (side, error) {
	s := side{dt: dtUint8, byteRow: true}
	for _, t := range tensors {
		from, to, err := torchDtypes(t, floats)
		if err != nil {
			return side{}, err
		}
		width := t.RowBytes / t.Datatype.Size()
		s.tensors = append(s.tensors, column{from: from, to: to, offset: t.Offset, width: width, at: s.row})
		s.cols = s.row + width*to.size()
		s.row += (width*to.size() + boundaryAlign - 1) / boundaryAlign * boundaryAlign
	}
	s.row = max(s.row, boundaryAlign)
	return s, nil
}

// torchDtypes is an architecture torch tensor's element type in the host
// layout and on the device: floats in floats, the others as declared
// (the unsigned ones wider than a byte as the next wider signed type).
func torchDtypes(t engine.TensorLayout, floats dtype) (from, to dtype, err error) {
	from, ok := hostDtype(t.Datatype)
	if !ok {
		return 0, 0, fmt.Errorf("tensor %q is %s, which the worker does not stage", t.Name, t.Datatype)
	}
	if from.floating() {
		return from, floats, nil
	}
	return from, deviceDtype(from), nil
}

// bytes is the size of the side's staging for batch rows.
func (s *side) bytes(batch int) int { return batch * s.row * s.dt.size() }

// pack fills dev, the device staging, from host, the host layout: every
// row converted, and its padding zeroed.
func (s *side) pack(dev, host []byte, batch int) {
	if s.byteRow {
		for r := range batch {
			row := dev[r*s.row : (r+1)*s.row]
			clear(row) // the gaps, the padding
			for _, c := range s.tensors {
				hs := c.from.size()
				convert(row[c.at:c.at+c.width*c.to.size()], c.to, host[c.offset+r*c.width*hs:c.offset+(r+1)*c.width*hs], c.from)
			}
		}
		return
	}
	es := s.dt.size()
	for r := range batch {
		row := dev[r*s.row*es : (r+1)*s.row*es]
		for _, c := range s.tensors {
			hs := c.from.size()
			convert(row[c.at*es:(c.at+c.width)*es], s.dt, host[c.offset+r*c.width*hs:c.offset+(r+1)*c.width*hs], c.from)
		}
		clear(row[s.cols*es:])
	}
}

// unpack fills host from dev, leaving the padding behind.
func (s *side) unpack(host, dev []byte, batch int) {
	if s.byteRow {
		for r := range batch {
			row := dev[r*s.row : (r+1)*s.row]
			for _, c := range s.tensors {
				hs := c.from.size()
				convert(host[c.offset+r*c.width*hs:c.offset+(r+1)*c.width*hs], c.from, row[c.at:c.at+c.width*c.to.size()], c.to)
			}
		}
		return
	}
	es := s.dt.size()
	for r := range batch {
		row := dev[r*s.row*es : (r+1)*s.row*es]
		for _, c := range s.tensors {
			hs := c.from.size()
			convert(host[c.offset+r*c.width*hs:c.offset+(r+1)*c.width*hs], c.from, row[c.at*es:(c.at+c.width)*es], s.dt)
		}
	}
}

// pack converts a bucket's inputs from the host layout, where the caller
// put them, into the device staging the worker reads; before each step.
func (l *lane) pack(bucket int) {
	b := &l.p.bounds[bucket]
	b.in.pack(l.p.staging.buffer(l.in[bucket]), l.hostIn[bucket], b.batch)
}

// unpack converts a bucket's outputs from the device staging the worker
// wrote into the host layout the caller reads; after each step.
func (l *lane) unpack(bucket int) {
	b := &l.p.bounds[bucket]
	b.out.unpack(l.hostOut[bucket], l.p.staging.buffer(l.out[bucket]), b.batch)
}

// ResidentBytes is the host memory a model of cfg takes on the engine,
// beyond its weights, for the server's budget: every bucket's buffers in
// the host layout, which callers fill and read, and in the device layout,
// in the shared memory the worker maps.
func (e *Engine) ResidentBytes(cfg *models.Config, shapes []bucketing.Shape) int64 {
	floats, ferr := computeDtype(&e.opts, cfg)
	lanes := int64(max(e.opts.Lanes, 1))
	var host int64
	var sizes []int
	for _, s := range shapes {
		l := engine.NewLayout(cfg, s)
		host += int64(l.InBytes + l.OutBytes)
		if b, err := newBoundary(l, floats, cfg.Architecture == "torch"); ferr == nil && err == nil {
			sizes = append(sizes, b.in.bytes(b.batch), b.out.bytes(b.batch))
		} else {
			// The load will refuse the model; count the host layout again.
			sizes = append(sizes, l.InBytes, l.OutBytes)
		}
	}
	_, shared := layoutStaging(sizes)
	return lanes * (host + int64(shared))
}

// checkMapped holds the worker's view of each bucket's staging (its load
// reply) to the boundary laid out here: a worker that maps other dtypes or
// shapes would read and write other bytes than pack and unpack do.
func (p *program) checkMapped(views []stagingView) error {
	if len(views) != len(p.bounds) {
		return fmt.Errorf("the worker mapped staging for %d buckets, want %d", len(views), len(p.bounds))
	}
	for i, v := range views {
		b := &p.bounds[i]
		for _, c := range []struct {
			what string
			got  tensorView
			want *side
		}{{"input", v.In, &b.in}, {"output", v.Out, &b.out}} {
			want := tensorView{Dtype: c.want.dt.String(), Shape: []int{b.batch, c.want.row}, ElementBytes: c.want.dt.size()}
			if c.got.Dtype != want.Dtype || !slices.Equal(c.got.Shape, want.Shape) || c.got.ElementBytes != want.ElementBytes {
				return fmt.Errorf("bucket %s: the worker maps its %s staging as %s%v of %d-byte elements, want %s%v of %d",
					p.shapes[i].Label(), c.what, c.got.Dtype, c.got.Shape, c.got.ElementBytes, want.Dtype, want.Shape, want.ElementBytes)
			}
		}
	}
	return nil
}
