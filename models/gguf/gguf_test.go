package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/internal/half"
)

func write(t testing.TB, w *Writer) []byte {
	t.Helper()
	var b bytes.Buffer
	_, err := w.WriteTo(&b)
	require.NoError(t, err)
	return b.Bytes()
}

func parse(t testing.TB, b []byte) *File {
	t.Helper()
	f, err := Parse(bytes.NewReader(b), int64(len(b)))
	require.NoError(t, err)
	return f
}

func randn(r *rand.Rand, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(r.NormFloat64())
	}
	return out
}

// Every metadata type the format has, arrays of arrays included, reads
// back as it was written, keys in order.
func TestMetadataRoundTrip(t *testing.T) {
	var w Writer
	vals := []struct {
		key string
		v   any
	}{
		{"u8", uint8(200)}, {"i8", int8(-100)}, {"u16", uint16(60000)}, {"i16", int16(-30000)},
		{"u32", uint32(4e9)}, {"i32", int32(-2e9)}, {"f32", float32(1.5)}, {"bool", true},
		{"str", "héllo"}, {"u64", uint64(1) << 60}, {"i64", int64(-1) << 60}, {"f64", math.Pi},
		{"a.u8", []uint8{1, 2}}, {"a.i8", []int8{-1}}, {"a.u16", []uint16{7}}, {"a.i16", []int16{-7}},
		{"a.u32", []uint32{1, 2, 3}}, {"a.i32", []int32{-1, 5}}, {"a.f32", []float32{0.25}},
		{"a.bool", []bool{true, false}}, {"a.str", []string{"a", "", "▁b"}}, {"a.u64", []uint64{9}},
		{"a.i64", []int64{-9}}, {"a.f64", []float64{2.5}}, {"a.empty", []string{}},
		{"a.nested", []any{[]int32{1, 2}, []string{"x"}, []any{[]uint8{3}}}},
	}
	for _, v := range vals {
		w.Set(v.key, v.v)
	}
	f := parse(t, write(t, &w))
	assert.Equal(t, uint32(3), f.Version)
	require.Len(t, f.Keys, len(vals))
	for i, v := range vals {
		assert.Equal(t, v.key, f.Keys[i])
		assert.Equal(t, v.v, f.Metadata[v.key], v.key)
	}
	u, ok, err := f.Uint("u16")
	assert.True(t, ok)
	assert.NoError(t, err)
	assert.Equal(t, uint64(60000), u)
	_, _, err = f.Uint("i8")
	assert.ErrorIs(t, err, ErrMalformed, "a negative count")
	_, _, err = f.String("u8")
	assert.ErrorContains(t, err, `metadata "u8" is uint8; want string`)
	ints, _, err := f.Ints("a.u32")
	assert.NoError(t, err)
	assert.Equal(t, []int64{1, 2, 3}, ints)
	_, ok, _ = f.Uint("absent")
	assert.False(t, ok)
}

// Tensors of every written type read back: F32 exactly, F16 and BF16 as
// their rounding, Q8_0 and Q4_0 within their step, with the dims
// innermost first.
func TestTensorRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	data := randn(r, 4*64)
	data[5] = 0
	for i := 64; i < 96; i++ {
		data[i] = 0 // an all-zero block: scale 0
	}
	var w Writer
	w.Uint32("general.alignment", 64)
	for _, typ := range []Type{F32, F16, BF16, Q8_0, Q4_0} {
		require.NoError(t, w.Tensor("t."+typ.String(), []int{4, 64}, typ, data))
	}
	require.NoError(t, w.Tensor("vec", []int{3}, F32, []float32{1, 2, 3}))
	f := parse(t, write(t, &w))
	assert.Equal(t, uint64(64), f.Alignment)
	assert.Zero(t, f.DataOffset%64)
	for _, typ := range []Type{F32, F16, BF16, Q8_0, Q4_0} {
		ti, ok := f.TensorByName("t." + typ.String())
		require.True(t, ok)
		assert.Equal(t, []uint64{64, 4}, ti.Dims)
		assert.Equal(t, []int{4, 64}, ti.Shape())
		assert.Equal(t, typ, ti.Type)
		got, err := f.ReadFloat32(ti)
		require.NoError(t, err)
		require.Len(t, got, len(data))
		for i, x := range data {
			var want float32
			tol := 0.0
			switch typ {
			case F32:
				want = x
			case F16:
				want = half.ToFloat32(half.FromFloat32(x))
			case BF16:
				want = half.BFloat16ToFloat32(half.BFloat16FromFloat32(x))
			case Q8_0, Q4_0:
				want, tol = x, blockMax(data, i)/127*0.51+1e-3*blockMax(data, i)
				if typ == Q4_0 {
					tol = blockMax(data, i) / 8 * 1.01 // the largest value of the other sign clamps at 7 steps
				}
			}
			require.InDelta(t, want, got[i], tol, "%s [%d]", typ, i)
		}
	}
	v, _ := f.TensorByName("vec")
	got, err := f.ReadFloat32(v)
	require.NoError(t, err)
	assert.Equal(t, []float32{1, 2, 3}, got)
}

func blockMax(x []float32, i int) float64 {
	var m float64
	for _, v := range x[i/32*32 : i/32*32+32] {
		m = max(m, math.Abs(float64(v)))
	}
	return m
}

// Q8_0 is llama.cpp's: d = max|x|/127 as float16, q = round(x/d); the
// raw blocks come back as written, and dequantize to q*d.
func TestQ8_0(t *testing.T) {
	x := make([]float32, 64)
	for i := range x {
		x[i] = float32(i-10) / 10
	}
	x[40] = -12.7 // block 1's largest magnitude: d = 0.1, q = -127
	// block 0's largest magnitude is x[31] = 2.1: q = 127
	var w Writer
	require.NoError(t, w.Tensor("q", []int{2, 32}, Q8_0, x))
	f := parse(t, write(t, &w))
	ti, _ := f.TensorByName("q")
	assert.Equal(t, uint64(68), ti.Bytes)
	q, err := f.ReadQ8_0(ti)
	require.NoError(t, err)
	require.Len(t, q.Scales, 2)
	assert.Equal(t, half.FromFloat32(2.1/127), q.ScaleBits[0], "block 0: max |x| = 2.1")
	assert.Equal(t, half.FromFloat32(12.7/127), q.ScaleBits[1])
	assert.Equal(t, int8(-127), q.Quants[40])
	assert.Equal(t, int8(127), q.Quants[31])
	d0 := float64(float32(2.1) / 127)
	for i := range 32 {
		assert.Equal(t, int8(math.Round(float64(x[i])*(1/d0))), q.Quants[i], i)
	}
	vals, err := f.ReadFloat32(ti)
	require.NoError(t, err)
	for i := range x {
		assert.Equal(t, float32(q.Quants[i])*q.Scales[i/32], vals[i])
	}
	_, err = f.ReadQ8_0(&f.Tensors[0])
	assert.NoError(t, err)
	var w2 Writer
	require.NoError(t, w2.Tensor("f", []int{32}, F32, x[:32]))
	f2 := parse(t, write(t, &w2))
	_, err = f2.ReadQ8_0(&f2.Tensors[0])
	assert.ErrorContains(t, err, "is F32, not Q8_0")
}

// Q4_K super-blocks, packed as ggml's quantize_row_q4_K_ref packs them,
// dequantize to d*scale*q - dmin*min per 32-value sub-block.
func TestQ4_K(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const blocks = 3
	var raw []byte
	var want []float32
	for range blocks {
		d, dmin := half.FromFloat32(0.01+r.Float32()/10), half.FromFloat32(r.Float32()/10)
		var ls, lm [8]uint8
		for j := range 8 {
			ls[j], lm[j] = uint8(r.IntN(64)), uint8(r.IntN(64))
		}
		var L [256]uint8
		for i := range L {
			L[i] = uint8(r.IntN(16))
		}
		scales := packScalesK4(ls, lm)
		var qs [128]uint8
		for j := 0; j < 256; j += 64 {
			for l := range 32 {
				qs[j/2+l] = L[j+l] | L[j+l+32]<<4
			}
		}
		raw = binary.LittleEndian.AppendUint16(raw, d)
		raw = binary.LittleEndian.AppendUint16(raw, dmin)
		raw = append(raw, scales[:]...)
		raw = append(raw, qs[:]...)
		for i := range 256 {
			sub := i / 32
			want = append(want, half.ToFloat32(d)*float32(ls[sub])*float32(L[i])-half.ToFloat32(dmin)*float32(lm[sub]))
		}
	}
	got := readK(t, Q4_K, blocks, raw)
	for i := range want {
		require.InDelta(t, want[i], got[i], 1e-6*math.Abs(float64(want[i]))+1e-7, i)
	}
}

// packScalesK4 packs eight 6-bit scales and mins as ggml's Q4_K and Q5_K
// quantizers do.
func packScalesK4(ls, lm [8]uint8) (scales [12]uint8) {
	for j := range 8 {
		if j < 4 {
			scales[j], scales[j+4] = ls[j], lm[j]
		} else {
			scales[j+4] = ls[j]&0xF | (lm[j]&0xF)<<4
			scales[j-4] |= (ls[j] >> 4) << 6
			scales[j] |= (lm[j] >> 4) << 6
		}
	}
	return scales
}

// readK reads blocks super-blocks raw of typ back through a file.
func readK(t *testing.T, typ Type, blocks int, raw []byte) []float32 {
	t.Helper()
	var w Writer
	require.NoError(t, w.RawTensor("k", []int{blocks, 256}, typ, raw))
	f := parse(t, write(t, &w))
	ti, _ := f.TensorByName("k")
	assert.Equal(t, uint64(len(raw)), ti.Bytes)
	got, err := f.ReadFloat32(ti)
	require.NoError(t, err)
	return got
}

// Q5_K super-blocks, packed as ggml's quantize_row_q5_K_ref packs them
// (5-bit values: the low nibbles in 128 bytes, the fifth bits in 32),
// dequantize to d*scale*q - dmin*min per 32-value sub-block.
func TestQ5_K(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const blocks = 3
	var raw []byte
	var want []float32
	for range blocks {
		d, dmin := half.FromFloat32(0.01+r.Float32()/10), half.FromFloat32(r.Float32()/10)
		var ls, lm [8]uint8
		for j := range 8 {
			ls[j], lm[j] = uint8(r.IntN(64)), uint8(r.IntN(64))
		}
		var L [256]uint8
		for i := range L {
			L[i] = uint8(r.IntN(32))
		}
		var qh [32]uint8
		var qs [128]uint8
		m1, m2 := uint8(1), uint8(2)
		for n := 0; n < 256; n += 64 {
			for j := range 32 {
				l1, l2 := L[n+j], L[n+j+32]
				if l1 > 15 {
					l1 -= 16
					qh[j] |= m1
				}
				if l2 > 15 {
					l2 -= 16
					qh[j] |= m2
				}
				qs[n/2+j] = l1 | l2<<4
			}
			m1, m2 = m1<<2, m2<<2
		}
		scales := packScalesK4(ls, lm)
		raw = binary.LittleEndian.AppendUint16(raw, d)
		raw = binary.LittleEndian.AppendUint16(raw, dmin)
		raw = append(raw, scales[:]...)
		raw = append(raw, qh[:]...)
		raw = append(raw, qs[:]...)
		for i := range 256 {
			sub := i / 32
			want = append(want, half.ToFloat32(d)*float32(ls[sub])*float32(L[i])-half.ToFloat32(dmin)*float32(lm[sub]))
		}
	}
	got := readK(t, Q5_K, blocks, raw)
	for i := range want {
		require.InDelta(t, want[i], got[i], 1e-6*math.Abs(float64(want[i]))+1e-7, i)
	}
}

// Q6_K super-blocks, packed as ggml's quantize_row_q6_K_ref packs them (6-bit
// values q+32: low nibbles in 128 bytes, top bit pairs in 64; a signed
// scale a 16 values), dequantize to d*scale*q.
func TestQ6_K(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const blocks = 3
	var raw []byte
	var want []float32
	for range blocks {
		d := half.FromFloat32(0.001 + r.Float32()/100)
		var sc [16]int8
		for j := range sc {
			sc[j] = int8(r.IntN(256) - 128)
		}
		var L [256]uint8 // q + 32
		for i := range L {
			L[i] = uint8(r.IntN(64))
		}
		var ql [128]uint8
		var qh [64]uint8
		for j := 0; j < 256; j += 128 {
			for l := range 32 {
				q1, q2, q3, q4 := L[j+l]&0xF, L[j+l+32]&0xF, L[j+l+64]&0xF, L[j+l+96]&0xF
				ql[j/2+l] = q1 | q3<<4
				ql[j/2+l+32] = q2 | q4<<4
				qh[j/4+l] = L[j+l]>>4 | (L[j+l+32]>>4)<<2 | (L[j+l+64]>>4)<<4 | (L[j+l+96]>>4)<<6
			}
		}
		raw = append(raw, ql[:]...)
		raw = append(raw, qh[:]...)
		for _, v := range sc {
			raw = append(raw, uint8(v))
		}
		raw = binary.LittleEndian.AppendUint16(raw, d)
		for i := range 256 {
			want = append(want, half.ToFloat32(d)*float32(sc[i/16])*float32(int(L[i])-32))
		}
	}
	got := readK(t, Q6_K, blocks, raw)
	for i := range want {
		require.InDelta(t, want[i], got[i], 1e-6*math.Abs(float64(want[i]))+1e-7, i)
	}
}

// A tensor larger than one read chunk is read whole, in order.
func TestLargeTensor(t *testing.T) {
	n := readChunk/4 + 96
	data := make([]float32, n)
	for i := range data {
		data[i] = float32(i)
	}
	var w Writer
	require.NoError(t, w.Tensor("big", []int{n}, F32, data))
	require.NoError(t, w.Tensor("big8", []int{n / 32, 32}, Q8_0, data))
	f := parse(t, write(t, &w))
	got, err := f.ReadFloat32(&f.Tensors[0])
	require.NoError(t, err)
	assert.Equal(t, data, got)
	got, err = f.ReadFloat32(&f.Tensors[1])
	require.NoError(t, err)
	assert.InDelta(t, float32(n-1), got[n-1], float64(n)/127)
}

// Types known but not read are described and refused by name.
func TestUnsupportedType(t *testing.T) {
	var w Writer
	require.NoError(t, w.RawTensor("q3", []int{256}, Q3_K, make([]byte, 110)))
	f := parse(t, write(t, &w))
	_, err := f.ReadFloat32(&f.Tensors[0])
	assert.ErrorIs(t, err, ErrUnsupported)
	assert.ErrorContains(t, err, "type Q3_K")
	assert.Equal(t, "type(99)", Type(99).String())
}

// header builds a file by hand, for the hostile cases.
type header struct{ b []byte }

func (h *header) u32(v uint32) *header { h.b = binary.LittleEndian.AppendUint32(h.b, v); return h }
func (h *header) u64(v uint64) *header { h.b = binary.LittleEndian.AppendUint64(h.b, v); return h }
func (h *header) str(s string) *header { h.u64(uint64(len(s))); h.b = append(h.b, s...); return h }
func (h *header) raw(b ...byte) *header {
	h.b = append(h.b, b...)
	return h
}

func gguf(version uint32, tensors, kvs uint64) *header {
	h := &header{b: []byte("GGUF")}
	return h.u32(version).u64(tensors).u64(kvs)
}

// Hostile and malformed files are refused with an error naming what is
// wrong, before anything is allocated by the number at fault.
func TestMalformed(t *testing.T) {
	valid := func() []byte {
		var w Writer
		w.String("general.architecture", "llama")
		require.NoError(t, w.Tensor("a", []int{2, 32}, F32, make([]float32, 64)))
		require.NoError(t, w.Tensor("b", []int{32}, Q8_0, make([]float32, 32)))
		return write(t, &w)
	}()
	// tensor "a"'s offset field: after the header, the key/value and a's
	// name, n_dims, two dims and type.
	kvLen := 8 + len("general.architecture") + 4 + 8 + len("llama")
	aOffset := 24 + kvLen + 8 + 1 + 4 + 16 + 4
	patch := func(at int, v uint64) []byte {
		b := bytes.Clone(valid)
		binary.LittleEndian.PutUint64(b[at:], v)
		return b
	}
	for _, c := range []struct {
		name string
		b    []byte
		err  error
		want string
	}{
		{"empty", nil, ErrMalformed, "header at offset 0"},
		{"magic", []byte("GGML\x03\x00\x00\x00"), ErrMalformed, "not a GGUF file"},
		{"version 1", gguf(1, 0, 0).b, ErrUnsupported, "version 1"},
		{"version 9", gguf(9, 0, 0).b, ErrMalformed, "version at offset 4: 9"},
		{"big-endian", append([]byte("GGUF"), 0, 0, 0, 3), ErrUnsupported, "big-endian"},
		{"tensor count 2^60", gguf(3, 1<<60, 0).b, ErrMalformed, "tensor_count at offset 8: 1152921504606846976 items"},
		{"kv count 2^60", gguf(3, 0, 1<<60).b, ErrMalformed, "metadata_kv_count"},
		{"key length 2^60", gguf(3, 0, 1).u64(1 << 60).raw(make([]byte, 16)...).b, ErrMalformed, "length 1152921504606846976; want at most 65535"},
		{"string length 2^60", gguf(3, 0, 1).str("k").u32(8).u64(1 << 60).raw(make([]byte, 16)...).b, ErrMalformed, `metadata "k" at offset 37: length 1152921504606846976; want at most`},
		{"string past the end", gguf(3, 0, 1).str("k").u32(8).u64(100).raw(1, 2).b, ErrMalformed, "the file has 2 bytes left"},
		{"array length 2^60", gguf(3, 0, 1).str("k").u32(9).u32(4).u64(1 << 60).b, ErrMalformed, "array length at offset 41: 1152921504606846976 items of at least 4 bytes"},
		{"string array length", gguf(3, 0, 1).str("k").u32(9).u32(8).u64(3).u64(0).b, ErrMalformed, "3 items of at least 8 bytes"},
		{"value type", gguf(3, 0, 1).str("k").u32(13).raw(0).b, ErrMalformed, "13 is not a metadata value type"},
		{"array type", gguf(3, 0, 1).str("k").u32(9).u32(77).u64(0).b, ErrMalformed, "77 is not a metadata value type"},
		{"bool 2", gguf(3, 0, 1).str("k").u32(7).raw(2).b, ErrMalformed, "bool 2"},
		{"empty key", gguf(3, 0, 1).str("").u32(0).raw(0, 0).b, ErrMalformed, "an empty key"},
		{"duplicate key", gguf(3, 0, 2).str("k").u32(0).raw(0).str("k").u32(0).raw(0).b, ErrMalformed, `"k" appears twice`},
		{"nested too deep", func() []byte {
			h := gguf(3, 0, 1).str("k").u32(9)
			for range 9 {
				h.u32(9).u64(1)
			}
			return h.u32(0).u64(0).b
		}(), ErrMalformed, "nested more than 8 deep"},
		{"alignment type", gguf(3, 0, 1).str("general.alignment").u32(10).u64(32).b, ErrMalformed, "general.alignment\" is uint64; want uint32"},
		{"alignment 48", gguf(3, 0, 1).str("general.alignment").u32(4).u32(48).b, ErrMalformed, "48; want a power of two"},
		{"truncated", valid[:len(valid)-31], ErrMalformed, `tensor "b": 34 bytes (Q8_0, dims [32]) at data offset 256 end past the file`},
		{"tensor offset past the end", patch(aOffset, 1<<62), ErrMalformed, `tensor "a": 256 bytes`},
		{"misaligned offset", patch(aOffset, 4), ErrMalformed, "4; want a multiple of the alignment 32"},
		{"overlap", patch(aOffset+33, 32), ErrMalformed, `tensor "b" at data offset 32 overlaps tensor "a", which ends at 256`},
		{"n_dims 5", gguf(3, 1, 0).str("t").u32(5).raw(make([]byte, 64)...).b, ErrMalformed, `tensor "t" n_dims at offset 33: 5; want 1..4`},
		{"dim 0", gguf(3, 1, 0).str("t").u32(1).u64(0).u32(0).u64(0).b, ErrMalformed, "dimension 0 at offset 37: 0"},
		{"dims overflow", gguf(3, 1, 0).str("t").u32(2).u64(1 << 40).u64(1 << 40).u32(0).u64(0).b, ErrMalformed, "fewer than 2^63"},
		{"huge tensor", gguf(3, 1, 0).str("t").u32(2).u64(1 << 31).u64(1 << 31).u32(0).u64(0).raw(make([]byte, 64)...).b, ErrMalformed, "[2147483648 2147483648] of F32 take 4611686018427387904×4 bytes"},
		{"ggml type 99", gguf(3, 1, 0).str("t").u32(1).u64(32).u32(99).u64(0).b, ErrMalformed, "99 is not a ggml type"},
		{"block multiple", gguf(3, 1, 0).str("t").u32(1).u64(33).u32(8).u64(0).b, ErrMalformed, "Q8_0 packs blocks of 32 values; the innermost dimension 33"},
		{"duplicate tensor", gguf(3, 2, 0).str("t").u32(1).u64(1).u32(0).u64(0).str("t").u32(1).u64(1).u32(0).u64(32).b, ErrMalformed, `"t" appears twice`},
		{"long tensor name", gguf(3, 1, 0).str(strings.Repeat("x", 65)).raw(make([]byte, 64)...).b, ErrMalformed, "length 65; want at most 64"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(bytes.NewReader(c.b), int64(len(c.b)))
			require.Error(t, err)
			assert.True(t, errors.Is(err, c.err), "%v", err)
			assert.ErrorContains(t, err, c.want)
		})
	}
	parse(t, valid)
}

// A count the file cannot hold fails before anything sized by it is
// allocated.
func TestHugeCountsAllocateNothing(t *testing.T) {
	for _, b := range [][]byte{
		gguf(3, 1<<60, 0).b,
		gguf(3, 0, 1).str("k").u32(9).u32(0).u64(1 << 60).b,
		gguf(3, 0, 1).str("k").u32(8).u64(1 << 60).b,
	} {
		allocs := testing.AllocsPerRun(10, func() { _, _ = Parse(bytes.NewReader(b), int64(len(b))) })
		assert.Less(t, allocs, 40.0)
	}
}
