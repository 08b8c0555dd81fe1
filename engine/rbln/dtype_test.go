package rbln

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/stepserve/stepserve/internal/half"
)

func TestNarrowInt64Saturates(t *testing.T) {
	for in, want := range map[int64]int32{0: 0, 1023: 1023, -5: -5, math.MaxInt32: math.MaxInt32,
		math.MaxInt32 + 1: math.MaxInt32, math.MinInt32 - 1: math.MinInt32, math.MaxInt64: math.MaxInt32} {
		assert.Equal(t, want, narrowInt64(in), "%d", in)
	}
}

// TestConvertBuffers: the buffer loops agree with the scalar conversions
// and round-trip what the device dtype can hold.
func TestConvertBuffers(t *testing.T) {
	vals := []float32{0, 1, -1.5, 65504, 1e6, 6.1e-5, 3.14159, float32(math.Inf(-1))}
	src := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(src[4*i:], math.Float32bits(v))
	}
	for _, tc := range []struct {
		to    dtype
		round func(float32) float32
	}{
		{dtFloat32, func(f float32) float32 { return f }},
		{dtFloat16, func(f float32) float32 { return half.ToFloat32(half.FromFloat32(f)) }},
		{dtBFloat16, func(f float32) float32 { return half.BFloat16ToFloat32(half.BFloat16FromFloat32(f)) }},
	} {
		dev := make([]byte, tc.to.size()*len(vals))
		convert(dev, tc.to, src, dtFloat32)
		back := make([]byte, len(src))
		convert(back, dtFloat32, dev, tc.to)
		for i, v := range vals {
			got := math.Float32frombits(binary.LittleEndian.Uint32(back[4*i:]))
			assert.Equal(t, tc.round(v), got, "%s: %g", tc.to, v)
		}
	}
	ints := make([]byte, 8*3)
	for i, v := range []int64{7, -1, 1 << 40} {
		binary.LittleEndian.PutUint64(ints[8*i:], uint64(v))
	}
	narrow := make([]byte, 4*3)
	convert(narrow, dtInt32, ints, dtInt64)
	for i, want := range []int32{7, -1, math.MaxInt32} {
		assert.Equal(t, want, int32(binary.LittleEndian.Uint32(narrow[4*i:])))
	}
}

// BenchmarkConvert reports the conversions' cost per element, on a
// row of 4096 values (a few rows of a large bucket).
func BenchmarkConvert(b *testing.B) {
	const n = 4096
	for _, tc := range []struct{ from, to dtype }{
		{dtFloat32, dtFloat16}, {dtFloat16, dtFloat32},
		{dtFloat32, dtBFloat16}, {dtBFloat16, dtFloat32},
		{dtInt64, dtInt32}, {dtFloat32, dtFloat32},
	} {
		src, dst := make([]byte, n*tc.from.size()), make([]byte, n*tc.to.size())
		for i := range n {
			v := float32(math.Sin(float64(i))) * 1000
			switch tc.from {
			case dtFloat32:
				binary.LittleEndian.PutUint32(src[4*i:], math.Float32bits(v))
			case dtFloat16:
				binary.LittleEndian.PutUint16(src[2*i:], half.FromFloat32(v))
			case dtBFloat16:
				binary.LittleEndian.PutUint16(src[2*i:], half.BFloat16FromFloat32(v))
			case dtInt64:
				binary.LittleEndian.PutUint64(src[8*i:], uint64(i))
			}
		}
		b.Run(tc.from.String()+"-"+tc.to.String(), func(b *testing.B) {
			b.SetBytes(int64(n * tc.from.size()))
			for b.Loop() {
				convert(dst, tc.to, src, tc.from)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/element")
		})
	}
}

// TestConvertWiderIntegers: the rarer datatypes' device types widen
// exactly, and coming back narrow to the nearest value the host type
// holds, never wrapping; UINT64 from 2^63 saturates into int64.
func TestConvertWiderIntegers(t *testing.T) {
	le := binary.LittleEndian
	u64 := le.AppendUint64(le.AppendUint64(nil, math.MaxUint64), 7)
	dev := make([]byte, 16)
	convert(dev, deviceDtype(dtUint64), u64, dtUint64)
	assert.Equal(t, []int64{math.MaxInt64, 7}, []int64{int64(le.Uint64(dev)), int64(le.Uint64(dev[8:]))})

	u16 := le.AppendUint16(le.AppendUint16(nil, 65535), 0)
	wide := make([]byte, 8)
	convert(wide, deviceDtype(dtUint16), u16, dtUint16)
	assert.Equal(t, []int32{65535, 0}, []int32{int32(le.Uint32(wide)), int32(le.Uint32(wide[4:]))})

	// Back from the device: out of range saturates.
	i32 := le.AppendUint32(le.AppendUint32(nil, uint32(0xffffffff)), 70000) // -1, 70000
	back := make([]byte, 4)
	convert(back, dtUint16, i32, dtInt32)
	assert.Equal(t, []uint16{0, 65535}, []uint16{le.Uint16(back), le.Uint16(back[2:])})
	i8 := make([]byte, 2)
	convert(i8, dtInt8, i32, dtInt32)
	assert.Equal(t, []int8{-1, 127}, []int8{int8(i8[0]), int8(i8[1])})

	f64 := le.AppendUint64(nil, math.Float64bits(-2.25))
	f32 := make([]byte, 4)
	convert(f32, dtFloat32, f64, dtFloat64)
	assert.Equal(t, float32(-2.25), math.Float32frombits(le.Uint32(f32)))
}
