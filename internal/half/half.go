// Package half converts between float32 and the two 16-bit floats the
// protocols and devices carry: IEEE 754 binary16 (FP16, float16) and
// bfloat16 (BF16). There is one rounding rule, to nearest with ties to
// even, for both; the conversions to float32 are exact.
//
// FromFloat32Normal and ToFloat32Normal are the common cases, small
// enough for the compiler to inline into a buffer loop, which calls the
// Edge functions only for the values they decline.
package half

import (
	"math"
	"math/bits"
)

// FromFloat32 rounds f to the nearest IEEE 754 binary16, ties to even:
// magnitudes from 65520 up are +-inf, those below 2^-14 are subnormal (and
// at most 2^-25 round to zero), NaN stays NaN (quiet, sign and top payload
// bits kept).
func FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	if h, ok := FromFloat32Normal(b); ok {
		return h
	}
	return FromFloat32Edge(b)
}

// FromFloat32Normal converts the float32 bits b when the result is a normal
// float16 (2^-14 <= |f| < 65520), and reports whether it is. It is small
// enough to be inlined, so that the buffer loops call out only for the
// other values.
func FromFloat32Normal(b uint32) (uint16, bool) {
	a := b & 0x7fffffff
	// Rebias the exponent (127 -> 15; (15-127)<<23 is 0xc8000000 modulo
	// 2^32) and round the 23-bit mantissa to 10: adding 0xfff, plus 1
	// when the kept part is odd, carries into the kept bits exactly when
	// the dropped 13 are above half, or half and the kept part odd. A
	// carry out of the mantissa lands in the exponent, which is the right
	// answer too.
	return uint16(b>>16)&0x8000 | uint16((a+0xc8000fff+(a>>13)&1)>>13), a-0x38800000 < 0x477ff000-0x38800000
}

// FromFloat32Edge converts the float32 bits b outside float16's
// normal range: NaN, overflow, subnormal results and zero.
func FromFloat32Edge(b uint32) uint16 {
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

// ToFloat32 is h's exact value.
func ToFloat32(h uint16) float32 {
	if f, ok := ToFloat32Normal(h); ok {
		return f
	}
	return ToFloat32Edge(h)
}

// ToFloat32Normal converts h when it is a normal float16, and reports
// whether it is; inlined, as FromFloat32Normal is.
func ToFloat32Normal(h uint16) (float32, bool) {
	// The exponent and mantissa move up 13 bits; the exponent is
	// rebiased from 15 to 127.
	e := h & 0x7c00
	return math.Float32frombits(uint32(h&0x8000)<<16 | uint32(h&0x7fff)<<13 + 112<<23), e != 0 && e != 0x7c00
}

// ToFloat32Edge converts the float16s outside the normal range:
// zero, subnormals, inf and NaN.
func ToFloat32Edge(h uint16) float32 {
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

// BFloat16FromFloat32 rounds f to the nearest bfloat16, ties to even; NaN
// stays NaN (quiet).
func BFloat16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// BFloat16ToFloat32 is h's exact value.
func BFloat16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }
