package wire

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/shm"
	"github.com/stepserve/stepserve/serving"
)

// Tensors in shared memory: an input or a requested output whose
// parameters name a registered region (shared_memory_region,
// shared_memory_byte_size, and shared_memory_offset, 0 when left out)
// takes its data from the region, or puts it there, instead of the
// request's body or the response. [CheckRequest] reads and checks the
// parameters against the tensor's shape; [Call.Infer] holds the regions
// while the request runs, copies each input out of its region (into
// memory the request owns and has charged, so that a client writing the
// region meanwhile cannot change what was checked), and copies each output
// in once the step has run.

// maxShmTensorBytes bounds a tensor's shared_memory_offset and
// shared_memory_byte_size as they are read, far above any region, so
// that no sum of them overflows before they are checked against one.
const maxShmTensorBytes = 1 << 48

// shmParamsJSON is the most a response's shared-memory parameters take
// besides the region's name: `,"parameters":{"shared_memory_region":"",
// "shared_memory_offset":N,"shared_memory_byte_size":N}`.
const shmParamsJSON = 160

// ShmTensor is where a tensor's data lies in a registered region.
type ShmTensor struct {
	Region   string
	Offset   int64
	ByteSize int64
	// Written is an output's size in the region once [Call.Infer] has
	// written it, which its response reports as shared_memory_byte_size.
	Written int64

	held *shm.Region // while the request runs
}

// shmParams reads a tensor's shared-memory parameters: nil when it has
// none. shared_memory_region and shared_memory_byte_size go together, and
// shared_memory_offset needs them, as in Triton.
func shmParams(p WireParams) (*ShmTensor, error) {
	rawRegion, hasRegion := p.Get("shared_memory_region")
	_, hasSize := p.Get("shared_memory_byte_size")
	_, hasOffset := p.Get("shared_memory_offset")
	switch {
	case !hasRegion && hasSize:
		return nil, errors.New("parameter shared_memory_byte_size needs shared_memory_region, the registered region the data is in")
	case !hasRegion && hasOffset:
		return nil, errors.New("parameter shared_memory_offset needs shared_memory_region, the registered region the data is in")
	case !hasRegion:
		return nil, nil
	case !hasSize:
		return nil, errors.New("parameter shared_memory_byte_size is required with shared_memory_region: the size of the tensor's data in the region")
	}
	t := &ShmTensor{}
	if err := json.Unmarshal(rawRegion, &t.Region); err != nil {
		return nil, fmt.Errorf("parameter shared_memory_region must be a string, the name of a registered region; got %s", excerpt(rawRegion))
	}
	var err error
	if t.ByteSize, err = shmSizeParam(p, "shared_memory_byte_size"); err != nil {
		return nil, err
	}
	if t.Offset, err = shmSizeParam(p, "shared_memory_offset"); err != nil {
		return nil, err
	}
	return t, nil
}

// shmSizeParam is a non-negative integer parameter of at most
// maxShmTensorBytes; 0 when it is absent.
func shmSizeParam(p WireParams, key string) (int64, error) {
	raw, ok := p.Get(key)
	if !ok {
		return 0, nil
	}
	v, ok := parseInt64(raw)
	if !ok {
		if json.Unmarshal(raw, &v) != nil {
			v = -1
		}
	}
	if v < 0 || v > maxShmTensorBytes {
		return 0, fmt.Errorf("parameter %s must be a non-negative integer (bytes) of at most %d, got %s", key, int64(maxShmTensorBytes), excerpt(raw))
	}
	return v, nil
}

// checkShmInput checks an input of elems elements whose data is in shared
// memory: it carries no data of its own, and its shared_memory_byte_size
// is what its shape takes (fixed-size datatypes), or room for at least a
// 4-byte length an element (BYTES, in Triton's serialization, read whole).
// It returns the bytes the input takes decoded: the copy out of the region
// (a fixed-size tensor is that copy), and for BYTES the strings besides.
func checkShmInput(in *WireInput, spec models.TensorSpec, elems int64) (int64, error) {
	if len(in.Data) > 0 && string(in.Data) != "null" || in.Contents != nil {
		return 0, fmt.Errorf("has both shared_memory_region and %s; send one", in.dataTerm())
	}
	if _, ok := (WireParams{in.Parameters, in.Pairs}).Get("binary_data_size"); ok || in.BinSet {
		return 0, fmt.Errorf("has both shared_memory_region and %s; send one", in.binTerm())
	}
	n := in.shm.ByteSize
	if spec.Datatype != models.BYTES {
		if need := elems * int64(spec.Datatype.Size()); n != need {
			return 0, fmt.Errorf("shared_memory_byte_size is %d bytes, but %s %v needs %d", n, spec.Datatype, in.Shape, need)
		}
		return n, nil
	}
	if n < 4*elems {
		return 0, fmt.Errorf("shared_memory_byte_size is %d bytes, too few for %d BYTES elements: each takes a 4-byte length, then its bytes (Triton's serialization)", n, elems)
	}
	const stringHeader = 16
	return n + stringHeader*elems + n, nil
}

// checkShmOutput checks an output of the request's rows that goes to
// shared memory: not as classes or binary data (the region holds the raw
// tensor), and into a range that holds it.
func checkShmOutput(t *ShmTensor, spec models.TensorSpec, rows int, classes int, binary bool) error {
	switch {
	case classes > 0:
		return errors.New("shared_memory_region and classification cannot both be set: the region takes the raw tensor")
	case binary:
		return errors.New("shared_memory_region and binary_data: true cannot both be set: the data goes to the region, not the response")
	}
	if !spec.HasSeq() && spec.Datatype != models.BYTES {
		if need := int64(rows) * int64(spec.RowBytes(0)); t.ByteSize < need {
			shape := append([]int{rows}, spec.Shape[1:]...)
			return fmt.Errorf("shared_memory_byte_size is %d bytes, too small for %s %v, which takes %d", t.ByteSize, spec.Datatype, shape, need)
		}
	}
	return nil
}

// HoldSharedMemory holds the regions the request's tensors name, each
// checked to hold its tensor's range; an error (a 400 naming the tensor)
// holds none.
func (req *InferRequest) HoldSharedMemory(s *shm.Regions, m *models.Model) error {
	hold := func(t *ShmTensor, kind, name string) error {
		r, err := s.Hold(t.Region, t.Offset, t.ByteSize)
		if err != nil {
			req.ReleaseSharedMemory(s)
			return apierr.BadRequest(fmt.Sprintf("%s %q: %s", kind, name, err.Error()))
		}
		t.held = r
		return nil
	}
	for i := range req.wire {
		if t := req.wire[i].shm; t != nil {
			if err := hold(t, "input", req.wire[i].Name); err != nil {
				return err
			}
		}
	}
	for _, c := range req.Outputs {
		if t := c.SharedMemory; t != nil {
			if err := hold(t, "output", m.Config.Outputs[c.Index].Name); err != nil {
				return err
			}
		}
	}
	return nil
}

// ReleaseSharedMemory lets go of the regions the request holds.
func (req *InferRequest) ReleaseSharedMemory(s *shm.Regions) {
	release := func(t *ShmTensor) {
		if t != nil && t.held != nil {
			s.Release(t.held)
			t.held = nil
		}
	}
	for i := range req.wire {
		release(req.wire[i].shm)
	}
	for _, c := range req.Outputs {
		release(c.SharedMemory)
	}
}

// ReadSharedMemory copies each input in shared memory out of its region,
// into memory the request owns (charged with its footprint), where
// decodeValues reads it as binary data.
func (req *InferRequest) ReadSharedMemory() error {
	for i := range req.wire {
		in := &req.wire[i]
		t := in.shm
		if t == nil {
			continue
		}
		buf := make([]byte, t.ByteSize)
		src := t.held.Data()[t.Offset : t.Offset+t.ByteSize]
		if err := shm.GuardFault(func() { copy(buf, src) }); err != nil {
			return apierr.BadRequest(fmt.Sprintf("input %q: shared memory region '%s': %v", in.Name, t.Region, err))
		}
		in.Bin, in.BinSet = buf, true
	}
	return nil
}

// WriteSharedMemory copies each output bound for shared memory into its
// region, once the step has run: an output larger than its range is a 400
// in Triton's words.
func (req *InferRequest) WriteSharedMemory(m *models.Model, res *serving.Result) error {
	for _, c := range req.Outputs {
		t := c.SharedMemory
		if t == nil {
			continue
		}
		data := res.Outputs[c.Index]
		name := m.Config.Outputs[c.Index].Name
		if int64(len(data)) > t.ByteSize {
			return apierr.BadRequest(fmt.Sprintf("shared memory size specified with the request for output '%s' (%d bytes) should be at least %d bytes to hold the results", name, t.ByteSize, len(data)))
		}
		dst := t.held.Data()[t.Offset : t.Offset+t.ByteSize]
		if err := shm.GuardFault(func() { copy(dst, data) }); err != nil {
			return apierr.BadRequest(fmt.Sprintf("output %q: shared memory region '%s': %v", name, t.Region, err))
		}
		t.Written = int64(len(data))
	}
	return nil
}
