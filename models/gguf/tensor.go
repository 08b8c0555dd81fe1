package gguf

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/stepserve/stepserve/internal/half"
)

// readChunk is how many bytes of a tensor are read at a time: the file's
// bytes are never held whole beside the values they become.
const readChunk = 1 << 20

// ReadRaw returns a tensor's bytes as stored.
func (f *File) ReadRaw(t *TensorInfo) ([]byte, error) {
	if err := f.mine(t); err != nil {
		return nil, err
	}
	b := make([]byte, t.Bytes)
	if n, err := f.r.ReadAt(b, f.DataOffset+int64(t.Offset)); n < len(b) {
		return nil, fmt.Errorf("gguf: tensor %q: reading %d bytes at %d: %w", t.Name, t.Bytes, f.DataOffset+int64(t.Offset), err)
	}
	return b, nil
}

// mine checks t is one of f's tensors, whose range Parse checked, and not
// a description made elsewhere.
func (f *File) mine(t *TensorInfo) error {
	if u, ok := f.TensorByName(t.Name); !ok || u != t {
		return fmt.Errorf("gguf: tensor %q is not this file's", t.Name)
	}
	return nil
}

// ReadFloat32 reads a tensor's values as float32 in the file's order
// (innermost dimension fastest, which is row-major for [TensorInfo.Shape]):
// F32, F16 and BF16 converted, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K
// dequantized as ggml does. Another type is an error wrapping ErrUnsupported.
func (f *File) ReadFloat32(t *TensorInfo) ([]float32, error) {
	if err := f.mine(t); err != nil {
		return nil, err
	}
	ti := types[t.Type]
	if !ti.readable {
		return nil, fmt.Errorf("%w: tensor %q: type %s (readable: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K)", ErrUnsupported, t.Name, t.Type)
	}
	if t.Elements() > math.MaxInt/4 {
		return nil, fmt.Errorf("%w: tensor %q: %d values do not fit in memory", ErrUnsupported, t.Name, t.Elements())
	}
	out := make([]float32, t.Elements())
	chunk := readChunk / ti.blockBytes * ti.blockBytes
	buf := make([]byte, min(chunk, t.Bytes))
	at := f.DataOffset + int64(t.Offset)
	var done uint64 // values written
	for left := t.Bytes; left > 0; {
		b := buf[:min(left, chunk)]
		// A ReaderAt may answer io.EOF with the last byte: only a short
		// read is an error.
		if n, err := f.r.ReadAt(b, at); n < len(b) {
			return nil, fmt.Errorf("gguf: tensor %q: reading %d bytes at %d: %w", t.Name, len(b), at, err)
		}
		n := uint64(len(b)) / ti.blockBytes * ti.blockElems
		dequantize(t.Type, out[done:done+n], b)
		done += n
		at += int64(len(b))
		left -= uint64(len(b))
	}
	return out, nil
}

// dequantize converts whole blocks of b into dst, which holds exactly
// their values.
func dequantize(typ Type, dst []float32, b []byte) {
	le := binary.LittleEndian
	switch typ {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(le.Uint32(b[4*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = half.ToFloat32(le.Uint16(b[2*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = half.BFloat16ToFloat32(le.Uint16(b[2*i:]))
		}
	case Q8_0:
		for len(dst) > 0 {
			d := half.ToFloat32(le.Uint16(b))
			for j := range 32 {
				dst[j] = float32(int8(b[2+j])) * d
			}
			b, dst = b[34:], dst[32:]
		}
	case Q4_0:
		// ggml's block_q4_0: a float16 scale, then 16 bytes whose low
		// nibbles are values 0..15 and high nibbles 16..31, offset by 8.
		for len(dst) > 0 {
			d := half.ToFloat32(le.Uint16(b))
			for j := range 16 {
				q := b[2+j]
				dst[j] = float32(int(q&0xF)-8) * d
				dst[j+16] = float32(int(q>>4)-8) * d
			}
			b, dst = b[18:], dst[32:]
		}
	case Q4_K:
		for len(dst) > 0 {
			dequantizeQ4K(dst[:qk], b[:144])
			b, dst = b[144:], dst[qk:]
		}
	case Q5_K:
		for len(dst) > 0 {
			dequantizeQ5K(dst[:qk], b[:176])
			b, dst = b[176:], dst[qk:]
		}
	case Q6_K:
		for len(dst) > 0 {
			dequantizeQ6K(dst[:qk], b[:210])
			b, dst = b[210:], dst[qk:]
		}
	}
}

// dequantizeQ5K is ggml's dequantize_row_q5_K for one super-block: as
// Q4_K's, with 32 bytes of fifth bits between the scales and the nibbles.
func dequantizeQ5K(dst []float32, b []byte) { dequantizeK(dst, b[:16], b[16:48], b[48:]) }

// dequantizeQ6K is ggml's dequantize_row_q6_K for one super-block: 128
// bytes of low nibbles, 64 of high bit pairs, sixteen int8 scales (one a
// 16 values) and a float16 scale d; each value d*scale*(q-32), q 6 bits.
// In each half (128 values, 64 low bytes, 32 high ones), value l and l+64
// take low byte l's low and high nibble, l+32 and l+96 low byte l+32's,
// and high byte l holds their top two bits at shifts 0, 4, 2 and 6 (for
// l, l+64, l+32, l+96).
func dequantizeQ6K(dst []float32, b []byte) {
	ql, qh, sc := b[:128], b[128:192], b[192:208]
	d := half.ToFloat32(binary.LittleEndian.Uint16(b[208:]))
	for n := 0; n < qk; n += 128 {
		for l := range 32 {
			is := l / 16
			q1 := int(ql[l]&0xF|(qh[l]>>0&3)<<4) - 32
			q2 := int(ql[l+32]&0xF|(qh[l]>>2&3)<<4) - 32
			q3 := int(ql[l]>>4|(qh[l]>>4&3)<<4) - 32
			q4 := int(ql[l+32]>>4|(qh[l]>>6&3)<<4) - 32
			dst[n+l] = d * float32(int8(sc[is])) * float32(q1)
			dst[n+l+32] = d * float32(int8(sc[is+2])) * float32(q2)
			dst[n+l+64] = d * float32(int8(sc[is+4])) * float32(q3)
			dst[n+l+96] = d * float32(int8(sc[is+6])) * float32(q4)
		}
		ql, qh, sc = ql[64:], qh[32:], sc[8:]
	}
}

// dequantizeQ4K is ggml's dequantize_row_q4_K for one super-block: a
// float16 scale d and min dmin, twelve bytes packing eight 6-bit scales
// and mins, then 128 bytes of nibbles, each 32-value sub-block
// d*scale*q - dmin*min.
func dequantizeQ4K(dst []float32, b []byte) { dequantizeK(dst, b[:16], nil, b[16:]) }

// dequantizeK is Q4_K's and Q5_K's super-block: head holds d, dmin and
// the packed scales and mins; in the 64 values j..j+63, value j+l takes
// nibble byte l's low half and j+32+l its high half, and where qh is
// given (Q5_K) bit 2j/64 of qh[l] and the next one add 16 to them.
func dequantizeK(dst []float32, head, qh, q []byte) {
	le := binary.LittleEndian
	d := half.ToFloat32(le.Uint16(head))
	dmin := half.ToFloat32(le.Uint16(head[2:]))
	scales := head[4:16]
	u1, u2 := uint8(1), uint8(2)
	for j, is := 0, 0; j < qk; j, is = j+64, is+2 {
		sc, m := scaleMinK4(is, scales)
		d1, m1 := d*float32(sc), dmin*float32(m)
		sc, m = scaleMinK4(is+1, scales)
		d2, m2 := d*float32(sc), dmin*float32(m)
		for l := range 32 {
			lo, hi := q[l]&0xF, q[l]>>4
			if qh != nil {
				if qh[l]&u1 != 0 {
					lo += 16
				}
				if qh[l]&u2 != 0 {
					hi += 16
				}
			}
			dst[j+l] = d1*float32(lo) - m1
			dst[j+32+l] = d2*float32(hi) - m2
		}
		q = q[32:]
		u1, u2 = u1<<2, u2<<2
	}
}

// scaleMinK4 is ggml's get_scale_min_k4: sub-block j's 6-bit scale and
// min.
func scaleMinK4(j int, q []byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xF | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

// Q8Blocks is a Q8_0 tensor as stored: every 32 consecutive values (in
// the file's order) are Quants[32*i:32*i+32] times Scales[i], so an
// engine can keep the 8-bit weights without quantizing them again.
type Q8Blocks struct {
	Quants []int8
	// Scales are the blocks' float16 scales, converted; ScaleBits the
	// float16 bits as stored.
	Scales    []float32
	ScaleBits []uint16
}

// ReadQ8_0 reads a Q8_0 tensor's blocks.
func (f *File) ReadQ8_0(t *TensorInfo) (*Q8Blocks, error) {
	if t.Type != Q8_0 {
		return nil, fmt.Errorf("gguf: tensor %q is %s, not Q8_0", t.Name, t.Type)
	}
	raw, err := f.ReadRaw(t)
	if err != nil {
		return nil, err
	}
	nb := len(raw) / 34
	q := &Q8Blocks{Quants: make([]int8, nb*32), Scales: make([]float32, nb), ScaleBits: make([]uint16, nb)}
	for i := range nb {
		b := raw[34*i : 34*i+34]
		q.ScaleBits[i] = binary.LittleEndian.Uint16(b)
		q.Scales[i] = half.ToFloat32(q.ScaleBits[i])
		for j := range 32 {
			q.Quants[32*i+j] = int8(b[2+j])
		}
	}
	return q, nil
}
