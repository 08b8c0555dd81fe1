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
	// Host-only element types of architecture torch's rarer datatypes:
	// the staging carries them as dtInt8, dtInt16, a wider signed integer
	// (torch has no unsigned 16-, 32- or 64-bit type to compute with), or
	// the compute dtype (float64).
	dtInt8
	dtInt16
	dtUint16
	dtUint32
	dtUint64
	dtFloat64
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
	case dtInt8:
		return "int8"
	case dtInt16:
		return "int16"
	case dtUint16:
		return "uint16"
	case dtUint32:
		return "uint32"
	case dtUint64:
		return "uint64"
	case dtFloat64:
		return "float64"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// size is the bytes one element takes.
func (d dtype) size() int {
	switch d {
	case dtFloat16, dtBFloat16, dtInt16, dtUint16:
		return 2
	case dtFloat32, dtInt32, dtUint32:
		return 4
	case dtInt64, dtUint64, dtFloat64:
		return 8
	case dtUint8, dtBool, dtInt8:
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
	case from.floating() && to.floating():
		for i := range min(len(src)/from.size(), len(dst)/to.size()) {
			putFloat(dst, to, i, getFloat(src, from, i))
		}
	case from.integer() && to.integer():
		// The rarer integer datatypes: widened exactly, or narrowed to
		// the nearest value the type holds (saturated, never wrapped).
		for i := range min(len(src)/from.size(), len(dst)/to.size()) {
			putInt(dst, to, i, getInt(src, from, i))
		}
	default:
		panic(fmt.Sprintf("rbln: no conversion from %s to %s", from, to))
	}
}

func (d dtype) floating() bool {
	return d == dtFloat32 || d == dtFloat16 || d == dtBFloat16 || d == dtFloat64
}

func (d dtype) integer() bool {
	switch d {
	case dtInt8, dtInt16, dtInt32, dtInt64, dtUint8, dtUint16, dtUint32, dtUint64, dtBool:
		return true
	}
	return false
}

func getFloat(b []byte, d dtype, i int) float64 {
	le := binary.LittleEndian
	switch d {
	case dtFloat16:
		return float64(half.ToFloat32(le.Uint16(b[2*i:])))
	case dtBFloat16:
		return float64(half.BFloat16ToFloat32(le.Uint16(b[2*i:])))
	case dtFloat32:
		return float64(math.Float32frombits(le.Uint32(b[4*i:])))
	}
	return math.Float64frombits(le.Uint64(b[8*i:]))
}

func putFloat(b []byte, d dtype, i int, v float64) {
	le := binary.LittleEndian
	switch d {
	case dtFloat16:
		le.PutUint16(b[2*i:], half.FromFloat32(float32(v)))
	case dtBFloat16:
		le.PutUint16(b[2*i:], half.BFloat16FromFloat32(float32(v)))
	case dtFloat32:
		le.PutUint32(b[4*i:], math.Float32bits(float32(v)))
	default:
		le.PutUint64(b[8*i:], math.Float64bits(v))
	}
}

// intValue is an integer element: a uint64 above MaxInt64 keeps its
// magnitude in big.
type intValue struct {
	v   int64
	big bool
}

func getInt(b []byte, d dtype, i int) intValue {
	le := binary.LittleEndian
	switch d {
	case dtInt8:
		return intValue{v: int64(int8(b[i]))}
	case dtUint8, dtBool:
		return intValue{v: int64(b[i])}
	case dtInt16:
		return intValue{v: int64(int16(le.Uint16(b[2*i:])))}
	case dtUint16:
		return intValue{v: int64(le.Uint16(b[2*i:]))}
	case dtInt32:
		return intValue{v: int64(int32(le.Uint32(b[4*i:])))}
	case dtUint32:
		return intValue{v: int64(le.Uint32(b[4*i:]))}
	case dtUint64:
		u := le.Uint64(b[8*i:])
		if u > math.MaxInt64 {
			return intValue{v: math.MaxInt64, big: true}
		}
		return intValue{v: int64(u)}
	}
	return intValue{v: int64(le.Uint64(b[8*i:]))}
}

func putInt(b []byte, d dtype, i int, x intValue) {
	le := binary.LittleEndian
	clamp := func(lo, hi int64) int64 { return min(max(x.v, lo), hi) }
	switch d {
	case dtInt8:
		b[i] = byte(int8(clamp(math.MinInt8, math.MaxInt8)))
	case dtUint8:
		b[i] = byte(clamp(0, math.MaxUint8))
	case dtBool:
		b[i] = 0
		if x.v != 0 || x.big {
			b[i] = 1
		}
	case dtInt16:
		le.PutUint16(b[2*i:], uint16(int16(clamp(math.MinInt16, math.MaxInt16))))
	case dtUint16:
		le.PutUint16(b[2*i:], uint16(clamp(0, math.MaxUint16)))
	case dtInt32:
		le.PutUint32(b[4*i:], uint32(int32(clamp(math.MinInt32, math.MaxInt32))))
	case dtUint32:
		le.PutUint32(b[4*i:], uint32(clamp(0, math.MaxUint32)))
	case dtUint64:
		le.PutUint64(b[8*i:], uint64(clamp(0, math.MaxInt64)))
	default:
		le.PutUint64(b[8*i:], uint64(x.v))
	}
}
