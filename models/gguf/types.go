package gguf

import "fmt"

// Type is a tensor's element type in ggml's numbering (ggml.h's enum
// ggml_type, gguf-py's GGMLQuantizationType).
type Type uint32

// The ggml types. The numbers are the file's; the gaps (4, 5, 31-33,
// 36-38) are types ggml has since removed.
const (
	F32     Type = 0
	F16     Type = 1
	Q4_0    Type = 2
	Q4_1    Type = 3
	Q5_0    Type = 6
	Q5_1    Type = 7
	Q8_0    Type = 8
	Q8_1    Type = 9
	Q2_K    Type = 10
	Q3_K    Type = 11
	Q4_K    Type = 12
	Q5_K    Type = 13
	Q6_K    Type = 14
	Q8_K    Type = 15
	IQ2_XXS Type = 16
	IQ2_XS  Type = 17
	IQ3_XXS Type = 18
	IQ1_S   Type = 19
	IQ4_NL  Type = 20
	IQ3_S   Type = 21
	IQ2_S   Type = 22
	IQ4_XS  Type = 23
	I8      Type = 24
	I16     Type = 25
	I32     Type = 26
	I64     Type = 27
	F64     Type = 28
	IQ1_M   Type = 29
	BF16    Type = 30
	TQ1_0   Type = 34
	TQ2_0   Type = 35
	MXFP4   Type = 39
)

// typeInfo is a type's name and block: blockElems values are stored in
// blockBytes bytes (gguf-py's GGML_QUANT_SIZES). Every known type has its
// size, so that a file is checked whole even where a tensor's type cannot
// be read; readable says it can.
type typeInfo struct {
	name                   string
	blockElems, blockBytes uint64
	readable               bool
}

const qk = 256 // the K-quants' super-block

var types = map[Type]typeInfo{
	F32:     {"F32", 1, 4, true},
	F16:     {"F16", 1, 2, true},
	Q4_0:    {"Q4_0", 32, 2 + 16, true},
	Q4_1:    {"Q4_1", 32, 2 + 2 + 16, false},
	Q5_0:    {"Q5_0", 32, 2 + 4 + 16, false},
	Q5_1:    {"Q5_1", 32, 2 + 2 + 4 + 16, false},
	Q8_0:    {"Q8_0", 32, 2 + 32, true},
	Q8_1:    {"Q8_1", 32, 4 + 4 + 32, false},
	Q2_K:    {"Q2_K", qk, 2 + 2 + qk/16 + qk/4, false},
	Q3_K:    {"Q3_K", qk, 2 + qk/4 + qk/8 + 12, false},
	Q4_K:    {"Q4_K", qk, 2 + 2 + qk/2 + 12, true},
	Q5_K:    {"Q5_K", qk, 2 + 2 + qk/2 + qk/8 + 12, true},
	Q6_K:    {"Q6_K", qk, 2 + qk/2 + qk/4 + qk/16, true},
	Q8_K:    {"Q8_K", qk, 4 + qk + qk/8, false},
	IQ2_XXS: {"IQ2_XXS", qk, 2 + qk/4, false},
	IQ2_XS:  {"IQ2_XS", qk, 2 + qk/4 + qk/32, false},
	IQ3_XXS: {"IQ3_XXS", qk, 2 + qk/4 + qk/8, false},
	IQ1_S:   {"IQ1_S", qk, 2 + qk/8 + qk/16, false},
	IQ4_NL:  {"IQ4_NL", 32, 2 + 16, false},
	IQ3_S:   {"IQ3_S", qk, 2 + qk/4 + qk/8 + qk/32 + 4, false},
	IQ2_S:   {"IQ2_S", qk, 2 + qk/4 + qk/16, false},
	IQ4_XS:  {"IQ4_XS", qk, 2 + 2 + qk/2 + qk/64, false},
	I8:      {"I8", 1, 1, false},
	I16:     {"I16", 1, 2, false},
	I32:     {"I32", 1, 4, false},
	I64:     {"I64", 1, 8, false},
	F64:     {"F64", 1, 8, false},
	IQ1_M:   {"IQ1_M", qk, qk/8 + qk/16 + qk/32, false},
	BF16:    {"BF16", 1, 2, true},
	TQ1_0:   {"TQ1_0", qk, 2 + 4*13, false},
	TQ2_0:   {"TQ2_0", qk, 2 + 64, false},
	MXFP4:   {"MXFP4", 32, 1 + 16, false},
}

// String is the type's ggml name (Q8_0), or type(N) for a number ggml
// does not define.
func (t Type) String() string {
	if ti, ok := types[t]; ok {
		return ti.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// Known says ggml defines the type.
func (t Type) Known() bool { _, ok := types[t]; return ok }

// Readable says this package reads the type as float32 ([File.ReadFloat32]).
func (t Type) Readable() bool { return types[t].readable }

// Block is how many values one block of the type holds and how many bytes
// it takes (1 and the element's size for F32, F16 and BF16); 0, 0 for an
// unknown type.
func (t Type) Block() (elems, bytes int) {
	ti := types[t]
	return int(ti.blockElems), int(ti.blockBytes)
}

// ValueType is a metadata value's type.
type ValueType uint32

// The metadata value types (gguf.md's gguf_metadata_value_type).
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64", "float64"}

func (v ValueType) String() string {
	if int(v) < len(valueTypeNames) {
		return valueTypeNames[v]
	}
	return fmt.Sprintf("value type(%d)", uint32(v))
}

// size is a scalar value type's size in bytes; 0 for string and array.
func (v ValueType) size() uint64 {
	switch v {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// The token types of tokenizer.ggml.token_type (llama.cpp's
// llama_token_type, gguf-py's TokenType).
const (
	TokenNormal      = 1
	TokenUnknown     = 2
	TokenControl     = 3
	TokenUserDefined = 4
	TokenUnused      = 5
	TokenByte        = 6
)
