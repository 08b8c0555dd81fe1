package models

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/stepserve/stepserve/internal/half"
)

// Datatype is a tensor element type, spelled as the Open Inference Protocol
// spells it ("FP32", "INT64", "BYTES", ...).
type Datatype string

// The datatypes of the Open Inference Protocol v2.
const (
	BOOL   Datatype = "BOOL"
	UINT8  Datatype = "UINT8"
	UINT16 Datatype = "UINT16"
	UINT32 Datatype = "UINT32"
	UINT64 Datatype = "UINT64"
	INT8   Datatype = "INT8"
	INT16  Datatype = "INT16"
	INT32  Datatype = "INT32"
	INT64  Datatype = "INT64"
	FP16   Datatype = "FP16"
	BF16   Datatype = "BF16"
	FP32   Datatype = "FP32"
	FP64   Datatype = "FP64"
	BYTES  Datatype = "BYTES"
)

var datatypeSizes = map[Datatype]int{
	BOOL: 1, UINT8: 1, INT8: 1,
	UINT16: 2, INT16: 2, FP16: 2, BF16: 2,
	UINT32: 4, INT32: 4, FP32: 4,
	UINT64: 8, INT64: 8, FP64: 8,
	BYTES: 0,
}

// Size is the number of bytes one element takes in a packed buffer; BYTES,
// whose elements vary in length, reports 0.
func (d Datatype) Size() int { return datatypeSizes[d] }

// Valid reports whether d is one of the protocol's datatypes.
func (d Datatype) Valid() bool {
	_, ok := datatypeSizes[d]
	return ok
}

// Encode is v as one element of d, little-endian (rounded toward zero for
// integers; BOOL is v != 0); nil for BYTES.
func (d Datatype) Encode(v float64) []byte {
	b := make([]byte, d.Size())
	switch d {
	case BOOL:
		if v != 0 {
			b[0] = 1
		}
	case UINT8, INT8:
		b[0] = byte(int64(v))
	case UINT16, INT16:
		binary.LittleEndian.PutUint16(b, uint16(int64(v)))
	case UINT32, INT32:
		binary.LittleEndian.PutUint32(b, uint32(int64(v)))
	case UINT64, INT64:
		binary.LittleEndian.PutUint64(b, uint64(int64(v)))
	case FP16:
		binary.LittleEndian.PutUint16(b, half.FromFloat32(float32(v)))
	case BF16:
		binary.LittleEndian.PutUint16(b, half.BFloat16FromFloat32(float32(v)))
	case FP32:
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v)))
	case FP64:
		binary.LittleEndian.PutUint64(b, math.Float64bits(v))
	default:
		return nil
	}
	return b
}

// ParseDatatype checks that s names a protocol datatype.
func ParseDatatype(s string) (Datatype, error) {
	d := Datatype(s)
	if !d.Valid() {
		return "", fmt.Errorf("unknown datatype %q; want one of BOOL, UINT8..UINT64, INT8..INT64, FP16, BF16, FP32, FP64, BYTES", s)
	}
	return d, nil
}
