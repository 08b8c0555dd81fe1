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
	"math/bits"
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

// float32ToFloat16 rounds f to the nearest IEEE 754 binary16, ties to even:
// magnitudes from 65520 up are +-inf, those below 2^-14 are subnormal (and
// at most 2^-25 round to zero), NaN stays NaN (quiet, sign and top payload
// bits kept).
func float32ToFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	if h, ok := toFloat16Normal(b); ok {
		return h
	}
	return float32ToFloat16Edge(b)
}

// toFloat16Normal converts the float32 bits b when the result is a normal
// float16 (2^-14 <= |f| < 65520), and reports whether it is. It is small
// enough to be inlined, so that the buffer loops call out only for the
// other values.
func toFloat16Normal(b uint32) (uint16, bool) {
	a := b & 0x7fffffff
	// Rebias the exponent (127 -> 15; (15-127)<<23 is 0xc8000000 modulo
	// 2^32) and round the 23-bit mantissa to 10: adding 0xfff, plus 1
	// when the kept part is odd, carries into the kept bits exactly when
	// the dropped 13 are above half, or half and the kept part odd. A
	// carry out of the mantissa lands in the exponent, which is the right
	// answer too.
	return uint16(b>>16)&0x8000 | uint16((a+0xc8000fff+(a>>13)&1)>>13), a-0x38800000 < 0x477ff000-0x38800000
}

// float32ToFloat16Edge converts the float32 bits b outside float16's
// normal range: NaN, overflow, subnormal results and zero.
func float32ToFloat16Edge(b uint32) uint16 {
	sign := uint16(b>>16) & 0x8000
	b &= 0x7fffffff
	switch {
	case b > 0x7f800000: // NaN
		return sign | 0x7e00 | uint16(b>>13)&0x3ff
	case b >= 0x477ff000: // 65520 and above round past 65504: inf
		return sign | 0x7c00
	case b > 0x33000000: // above 2^-25: subnormal, in units of 2^-24
		m := b&0x7fffff | 0x800000
		shift := 126 - b>>23 // 14..24
		q := m >> shift
		rest, half := m&(1<<shift-1), uint32(1)<<(shift-1)
		if rest > half || rest == half && q&1 == 1 {
			q++ // may reach 0x400, the smallest normal: the right bits
		}
		return sign | uint16(q)
	}
	return sign // 2^-25 (a tie, to even) and below: zero
}

// float16ToFloat32 is h's exact value.
func float16ToFloat32(h uint16) float32 {
	if f, ok := fromFloat16Normal(h); ok {
		return f
	}
	return float16ToFloat32Edge(h)
}

// fromFloat16Normal converts h when it is a normal float16, and reports
// whether it is; inlined, as toFloat16Normal is.
func fromFloat16Normal(h uint16) (float32, bool) {
	// The exponent and mantissa move up 13 bits; the exponent is
	// rebiased from 15 to 127.
	e := h & 0x7c00
	return math.Float32frombits(uint32(h&0x8000)<<16 | uint32(h&0x7fff)<<13 + 112<<23), e != 0 && e != 0x7c00
}

// float16ToFloat32Edge converts the float16s outside the normal range:
// zero, subnormals, inf and NaN.
func float16ToFloat32Edge(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	man := uint32(h & 0x3ff)
	switch {
	case h&0x7c00 == 0x7c00: // inf, NaN (payload kept)
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case man == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal, man * 2^-24: shift the top bit up to the implicit one's
	// place and lower the exponent as much.
	shift := uint32(bits.LeadingZeros32(man) - 21)
	return math.Float32frombits(sign | (113-shift)<<23 | (man<<shift)&0x3ff<<13)
}

// float32ToBFloat16 rounds f to the nearest bfloat16, ties to even; NaN
// stays NaN (quiet).
func float32ToBFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// bfloat16ToFloat32 is h's exact value.
func bfloat16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

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
			h, ok := toFloat16Normal(b)
			if !ok {
				h = float32ToFloat16Edge(b)
			}
			le.PutUint16(dst[2*i:2*i+2], h)
		}
	case from == dtFloat32 && to == dtBFloat16:
		for i := range min(len(src)/4, len(dst)/2) {
			le.PutUint16(dst[2*i:2*i+2], float32ToBFloat16(math.Float32frombits(le.Uint32(src[4*i:4*i+4]))))
		}
	case from == dtFloat16 && to == dtFloat32:
		for i := range min(len(src)/2, len(dst)/4) {
			h := le.Uint16(src[2*i : 2*i+2])
			f, ok := fromFloat16Normal(h)
			if !ok {
				f = float16ToFloat32Edge(h)
			}
			le.PutUint32(dst[4*i:4*i+4], math.Float32bits(f))
		}
	case from == dtBFloat16 && to == dtFloat32:
		for i := range min(len(src)/2, len(dst)/4) {
			le.PutUint32(dst[4*i:4*i+4], uint32(le.Uint16(src[2*i:2*i+2]))<<16)
		}
	case from == dtFloat16 && to == dtBFloat16:
		for i := range min(len(src)/2, len(dst)/2) {
			le.PutUint16(dst[2*i:2*i+2], float32ToBFloat16(float16ToFloat32(le.Uint16(src[2*i:2*i+2]))))
		}
	case from == dtBFloat16 && to == dtFloat16:
		for i := range min(len(src)/2, len(dst)/2) {
			le.PutUint16(dst[2*i:2*i+2], float32ToFloat16(bfloat16ToFloat32(le.Uint16(src[2*i:2*i+2]))))
		}
	case from == dtInt64 && to == dtInt32:
		for i := range min(len(src)/8, len(dst)/4) {
			le.PutUint32(dst[4*i:4*i+4], uint32(narrowInt64(int64(le.Uint64(src[8*i:8*i+8])))))
		}
	default:
		panic(fmt.Sprintf("rbln: no conversion from %s to %s", from, to))
	}
}
