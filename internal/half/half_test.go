package half

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func f32(bits uint32) float32 { return math.Float32frombits(bits) }

// TestFloat16KnownValues holds the conversion to values torch and numpy
// agree on (x.to(torch.float16).view(torch.int16)).
func TestFloat16KnownValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   float32
		want uint16
	}{
		{"one", 1, 0x3c00},
		{"minus two", -2, 0xc000},
		{"zero", 0, 0x0000},
		{"minus zero", float32(math.Copysign(0, -1)), 0x8000},
		{"largest finite", 65504, 0x7bff},
		{"just under the overflow tie", f32(0x477fefff), 0x7bff},
		{"the overflow tie goes to inf (even)", 65520, 0x7c00},
		{"above the largest", 1e6, 0x7c00},
		{"minus above the largest", -1e6, 0xfc00},
		{"inf", float32(math.Inf(1)), 0x7c00},
		{"minus inf", float32(math.Inf(-1)), 0xfc00},
		{"smallest normal 2^-14", 6.103515625e-05, 0x0400},
		{"6.1e-5 is the largest subnormal", 6.1e-5, 0x03ff},
		{"just under 2^-14 rounds up to it", f32(0x387fffff), 0x0400},
		{"smallest subnormal 2^-24", 5.9604645e-08, 0x0001},
		{"2^-25 is a tie: to zero (even)", f32(0x33000000), 0x0000},
		{"just above 2^-25 rounds up", f32(0x33000001), 0x0001},
		{"3 x 2^-25 is a tie: to 2 x 2^-24 (even)", 3 * f32(0x33000000), 0x0002},
		{"5 x 2^-25 is a tie: to 2 x 2^-24 (even)", 5 * f32(0x33000000), 0x0002},
		{"minus smallest subnormal", -5.9604645e-08, 0x8001},
		{"below everything: zero", 1e-10, 0x0000},
		{"1 + 2^-11 is a tie: to 1 (even)", 1 + 1.0/2048, 0x3c00},
		{"1 + 3 x 2^-11 is a tie: to 1 + 2^-9 (even)", 1 + 3.0/2048, 0x3c02},
		{"1 + 2^-11 + 2^-23 rounds up", f32(0x3f801001), 0x3c01},
		{"mantissa carry into the exponent", f32(0x3ffff000), 0x4000},
		{"0.1", 0.1, 0x2e66},
		{"pi", math.Pi, 0x4248},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, fmt.Sprintf("%#04x", tc.want), fmt.Sprintf("%#04x", FromFloat32(tc.in)), "%g", tc.in)
		})
	}
	nan := FromFloat32(float32(math.NaN()))
	assert.True(t, nan&0x7c00 == 0x7c00 && nan&0x3ff != 0, "NaN stays NaN: %#04x", nan)
	assert.True(t, math.IsNaN(float64(ToFloat32(nan))))
	negNaN := FromFloat32(-float32(math.NaN()))
	assert.True(t, math.IsNaN(float64(ToFloat32(negNaN))))
	assert.Equal(t, uint16(0x8000), negNaN&0x8000, "and keeps its sign")
	assert.True(t, math.IsNaN(float64(ToFloat32(FromFloat32(f32(0x7f800001))))), "a signalling NaN whose payload is in the dropped bits is still NaN")
}

func TestFloat16ToFloat32KnownValues(t *testing.T) {
	for _, tc := range []struct {
		in   uint16
		want float32
	}{
		{0x3c00, 1}, {0xc000, -2}, {0x7bff, 65504}, {0x0400, 6.103515625e-05}, {0x03ff, 6.097555160522461e-05},
		{0x0001, 5.960464477539063e-08}, {0x8001, -5.960464477539063e-08}, {0x0200, 3.0517578125e-05},
		{0x7c00, float32(math.Inf(1))}, {0xfc00, float32(math.Inf(-1))}, {0x0000, 0},
	} {
		assert.Equal(t, tc.want, ToFloat32(tc.in), "%#04x", tc.in)
	}
	assert.True(t, math.Signbit(float64(ToFloat32(0x8000))), "-0 stays -0")
}

// TestFloat16RoundTripsEveryValue: every float16 converts to float32
// exactly and back to itself, and the float32s between two neighbours
// round to the nearer, a tie to the even one.
func TestFloat16RoundTripsEveryValue(t *testing.T) {
	for h := range 1 << 16 {
		h := uint16(h)
		f := ToFloat32(h)
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			require.True(t, math.IsNaN(float64(f)), "%#04x", h)
			require.True(t, math.IsNaN(float64(ToFloat32(FromFloat32(f)))), "%#04x", h)
			continue
		}
		require.Equal(t, h, FromFloat32(f), "%#04x -> %g", h, f)
		// The value as float64 from its parts: the float32 is exact.
		sign := 1.0
		if h&0x8000 != 0 {
			sign = -1
		}
		exp, man := int(h>>10&0x1f), float64(h&0x3ff)
		var want float64
		switch exp {
		case 0x1f:
			want = math.Inf(int(sign))
		case 0:
			want = sign * man * math.Ldexp(1, -24)
		default:
			want = sign * (1 + man/1024) * math.Ldexp(1, exp-15)
		}
		require.Equal(t, want, float64(f), "%#04x", h)
	}
	// Between each pair of neighbouring positive finite values: the exact
	// midpoint goes to the even one, one float32 step either side of it
	// to the nearer.
	for h := uint16(0); h < 0x7bff; h++ {
		lo, hi := float64(ToFloat32(h)), float64(ToFloat32(h+1))
		mid := float32((lo + hi) / 2) // exact: 12 significant bits
		even := h
		if h&1 == 1 {
			even = h + 1
		}
		require.Equal(t, even, FromFloat32(mid), "midpoint of %#04x and %#04x", h, h+1)
		require.Equal(t, h, FromFloat32(math.Nextafter32(mid, 0)), "just under the midpoint of %#04x", h)
		require.Equal(t, h+1, FromFloat32(math.Nextafter32(mid, 1e9)), "just over the midpoint of %#04x", h)
		require.Equal(t, h|0x8000, FromFloat32(-math.Nextafter32(mid, 0)), "negative, just under the midpoint of %#04x", h)
	}
}

func TestBFloat16KnownValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   float32
		want uint16
	}{
		{"one", 1, 0x3f80},
		{"minus zero", float32(math.Copysign(0, -1)), 0x8000},
		{"65504 rounds to 65536 (8 significant bits)", 65504, 0x4780},
		{"1 + 2^-8 is a tie: to 1 (even)", 1 + 1.0/256, 0x3f80},
		{"1 + 3 x 2^-8 is a tie: to 1 + 2^-6 (even)", 1 + 3.0/256, 0x3f82},
		{"1 + 2^-8 + 2^-23 rounds up", f32(0x3f808001), 0x3f81},
		{"largest float32 rounds to inf", math.MaxFloat32, 0x7f80},
		{"inf", float32(math.Inf(1)), 0x7f80},
		{"minus inf", float32(math.Inf(-1)), 0xff80},
		{"smallest float32 subnormal rounds to zero", f32(1), 0x0000},
		{"float32 subnormals keep their top bits", f32(0x00010000), 0x0001},
		{"0.1", 0.1, 0x3dcd},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, fmt.Sprintf("%#04x", tc.want), fmt.Sprintf("%#04x", BFloat16FromFloat32(tc.in)), "%g", tc.in)
		})
	}
	for _, nan := range []uint32{0x7fc00000, 0x7f800001, 0xff800001, 0x7fffffff} {
		b := BFloat16FromFloat32(f32(nan))
		assert.True(t, math.IsNaN(float64(BFloat16ToFloat32(b))), "NaN %#08x stays NaN (%#04x)", nan, b)
		assert.Equal(t, uint16(nan>>16)&0x8000, b&0x8000, "with its sign")
	}
	for h := range 1 << 16 {
		h := uint16(h)
		f := BFloat16ToFloat32(h)
		if math.IsNaN(float64(f)) {
			continue
		}
		require.Equal(t, h, BFloat16FromFloat32(f), "%#04x round trip", h)
	}
}
