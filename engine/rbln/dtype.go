// Element types at the graph boundary, and the conversions between the
// engine's host layout (little-endian FP32 and INT64, [engine.NewLayout])
// and the device staging the worker reads and writes: floats in the
// program's compute dtype (float32, float16 or bfloat16), integers as
// int32. They run on every step, so they allocate nothing and branch
// little.

package rbln

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/stepserve/stepserve/internal/half"
)

// dtype is an element type in device staging, named as torch names it.
type dtype uint8

const (
	dtFloat32 dtype = iota + 1
	dtFloat16
	dtBFloat16
	dtInt32
	dtInt64
	dtUint8
	dtBool
)

func (d dtype) String() string {
	switch d {
	case dtFloat32:
		return "float32"
	case dtFloat16:
		return "float16"
	case dtBFloat16:
		return "bfloat16"
	case dtInt32:
		return "int32"
	case dtInt64:
		return "int64"
	case dtUint8:
		return "uint8"
	case dtBool:
		return "bool"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// size is the bytes one element takes.
func (d dtype) size() int {
	switch d {
	case dtFloat16, dtBFloat16:
		return 2
	case dtFloat32, dtInt32:
		return 4
	case dtInt64:
		return 8
	case dtUint8, dtBool:
		return 1
	}
	return 0
}

// parseFloatDtype reads a compute dtype: model.yaml's device_dtype, or
// float32.
func parseFloatDtype(s string) (dtype, error) {
	switch s {
	case "float32":
		return dtFloat32, nil
	case "float16":
		return dtFloat16, nil
	case "bfloat16":
		return dtBFloat16, nil
	}
	return 0, fmt.Errorf("rbln: compute dtype %q; want float16, bfloat16 or float32", s)
}

// narrowInt64 is v as an int32, saturated rather than wrapped.
func narrowInt64(v int64) int32 {
	return int32(min(max(v, math.MinInt32), math.MaxInt32))
}

// convert writes src, elements of from, into dst as elements of to; dst
// holds exactly as many elements as src. The pairs are the ones a
// [boundary] makes; any other is a bug in it. (Each loop slices both
// buffers per element with constant widths, which the compiler checks
// once per slice: about half the cost of indexing from an offset.)
func convert(dst []byte, to dtype, src []byte, from dtype) {
	le := binary.LittleEndian
	switch {
	case to == from:
		copy(dst, src)
	case from == dtFloat32 && to == dtFloat16:
		for i := range min(len(src)/4, len(dst)/2) {
			b := le.Uint32(src[4*i : 4*i+4])
			h, ok := half.FromFloat32Normal(b)
			if !ok {
				h = half.FromFloat32Edge(b)
			}
			le.PutUint16(dst[2*i:2*i+2], h)
		}
	case from == dtFloat32 && to == dtBFloat16:
		for i := range min(len(src)/4, len(dst)/2) {
			le.PutUint16(dst[2*i:2*i+2], half.BFloat16FromFloat32(math.Float32frombits(le.Uint32(src[4*i:4*i+4]))))
		}
	case from == dtFloat16 && to == dtFloat32:
		for i := range min(len(src)/2, len(dst)/4) {
			h := le.Uint16(src[2*i : 2*i+2])
			f, ok := half.ToFloat32Normal(h)
			if !ok {
				f = half.ToFloat32Edge(h)
			}
			le.PutUint32(dst[4*i:4*i+4], math.Float32bits(f))
		}
	case from == dtBFloat16 && to == dtFloat32:
		for i := range min(len(src)/2, len(dst)/4) {
			le.PutUint32(dst[4*i:4*i+4], uint32(le.Uint16(src[2*i:2*i+2]))<<16)
		}
	case from == dtFloat16 && to == dtBFloat16:
		for i := range min(len(src)/2, len(dst)/2) {
			le.PutUint16(dst[2*i:2*i+2], half.BFloat16FromFloat32(half.ToFloat32(le.Uint16(src[2*i:2*i+2]))))
		}
	case from == dtBFloat16 && to == dtFloat16:
		for i := range min(len(src)/2, len(dst)/2) {
			le.PutUint16(dst[2*i:2*i+2], half.FromFloat32(half.BFloat16ToFloat32(le.Uint16(src[2*i:2*i+2]))))
		}
	case from == dtInt64 && to == dtInt32:
		for i := range min(len(src)/8, len(dst)/4) {
			le.PutUint32(dst[4*i:4*i+4], uint32(narrowInt64(int64(le.Uint64(src[8*i:8*i+8])))))
		}
	default:
		panic(fmt.Sprintf("rbln: no conversion from %s to %s", from, to))
	}
}
