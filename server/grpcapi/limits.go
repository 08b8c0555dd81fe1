package grpcapi

import (
	"errors"
	"fmt"

	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/wire"
	"google.golang.org/protobuf/encoding/protowire"
)

// A ModelInfer message is bounded before it is decoded. gRPC's receive
// limit bounds its wire bytes, not what they decode to: an empty input is
// two wire bytes and a Go struct of over a hundred, a one-byte varint an
// eight-byte int64. So the handler reads the message as it arrived
// (rawInfer), walks it once with protowire (protoScan), refuses it at the
// first count past a limit (the same limits as JSON's: the model's inputs
// and outputs, maxRank, maxParameters, server.max_request_elements), and
// charges the in-flight budget for what it would decode to before the
// protobuf library builds any of it.

// Field numbers of inference.proto's ModelInferRequest and its parts.
const (
	pbRequestModelName  = 1
	pbRequestVersion    = 2
	pbRequestID         = 3
	pbRequestParameters = 4
	pbRequestInputs     = 5
	pbRequestOutputs    = 6
	pbRequestRaw        = 7

	pbInputShape      = 3
	pbInputParameters = 4
	pbInputContents   = 5

	pbOutputParameters = 2

	pbContentsBool   = 1
	pbContentsInt    = 2
	pbContentsInt64  = 3
	pbContentsUint   = 4
	pbContentsUint64 = 5
	pbContentsFP32   = 6
	pbContentsFP64   = 7
	pbContentsBytes  = 8
)

// The hard limits of the walk (see scanInferRequest): 16 times the checks'
// that follow decoding, and the model's tensors plus pbExtraTensors.
const (
	pbMaxRank       = 16 * wire.MaxRank
	pbMaxParameters = 16 * wire.MaxParameters
	pbExtraTensors  = 64
)

// What decoded parts cost in Go, at most: a struct with protobuf's
// bookkeeping and its slot in a slice that grows by doubling, a map entry
// with its InferParameter, a slice element grown by appending.
const (
	pbMessageBytes = 256 // the request itself
	pbInputBytes   = 192
	pbOutputBytes  = 128
	pbParamBytes   = 192
	pbSliceSlot    = 2 // appending doubles: up to twice the elements
	pbStringBytes  = 16
	pbBytesEntry   = 2 * 24 // a []byte header, twice
)

// protoScan is what a ModelInferRequest holds, counted on the wire.
type protoScan struct {
	model, version       string
	inputs, outputs, raw int
	elements             int64 // typed contents values, all inputs
	// decoded bounds what decoding the message allocates: each part at
	// its Go size with slice growth, and the message's bytes once more
	// (strings, bytes and unknown fields copied out of it); within a
	// small constant factor of what protobuf builds, never a multiple of
	// the wire size beyond that.
	decoded int64
}

// errProtoMalformed: the walk met bytes that are not a ModelInferRequest;
// the protobuf library says what is wrong when it decodes them.
var errProtoMalformed = errors.New("server: malformed protobuf")

// scanInferRequest walks a ModelInferRequest's wire bytes. It returns an
// error a client can act on at the first count past a hard limit, and
// errProtoMalformed for bytes it cannot follow; the counts it read so far
// (the model's name among them) come back either way. The hard limits are
// far enough above the checks that follow decoding (maxRank, maxParameters,
// the model's inputs) that those still answer every request a client
// might send by mistake with their own message; they stop what no client
// sends but to make decoding cost many times the message. maxElements
// bounds the typed contents' values as it bounds declared elements: more
// values than that cannot match a shape the server accepts.
func scanInferRequest(b []byte, maxElements int64) (*protoScan, error) {
	sc := &protoScan{decoded: pbMessageBytes + int64(len(b))}
	params := 0
	err := walkFields(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch {
		case num == pbRequestModelName && typ == protowire.BytesType:
			sc.model = string(v) // the last wins, as in decoding
		case num == pbRequestVersion && typ == protowire.BytesType:
			sc.version = string(v)
		case num == pbRequestID && typ == protowire.BytesType:
			sc.decoded += pbStringBytes
		case num == pbRequestParameters && typ == protowire.BytesType:
			if params++; params > pbMaxParameters {
				return apierr.BadRequest(fmt.Sprintf("the request's parameters have more than %d entries", pbMaxParameters))
			}
			sc.decoded += pbParamBytes
		case num == pbRequestInputs && typ == protowire.BytesType:
			sc.inputs++
			sc.decoded += pbInputBytes * pbSliceSlot
			return sc.input(v, maxElements)
		case num == pbRequestOutputs && typ == protowire.BytesType:
			sc.outputs++
			sc.decoded += pbOutputBytes * pbSliceSlot
			params := 0
			return walkFields(v, func(num protowire.Number, typ protowire.Type, _ []byte) error {
				if num == pbOutputParameters && typ == protowire.BytesType {
					if params++; params > pbMaxParameters {
						return apierr.BadRequest(fmt.Sprintf("an output's parameters have more than %d entries", pbMaxParameters))
					}
					sc.decoded += pbParamBytes
				}
				return nil
			})
		case num == pbRequestRaw && typ == protowire.BytesType:
			sc.raw++
			sc.decoded += pbBytesEntry
		}
		return nil
	})
	return sc, err
}

// input walks one InferInputTensor.
func (sc *protoScan) input(b []byte, maxElements int64) error {
	dims, params := 0, 0
	return walkFields(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch num {
		case pbInputShape:
			n := 1
			if typ == protowire.BytesType { // packed
				n = countVarints(v)
			}
			if dims += n; dims > pbMaxRank {
				return apierr.BadRequest(fmt.Sprintf("an input's shape has more than %d dimensions", pbMaxRank))
			}
			sc.decoded += int64(8 * n * pbSliceSlot)
		case pbInputParameters:
			if params++; params > pbMaxParameters {
				return apierr.BadRequest(fmt.Sprintf("an input's parameters have more than %d entries", pbMaxParameters))
			}
			sc.decoded += pbParamBytes
		case pbInputContents:
			if typ != protowire.BytesType {
				return nil
			}
			return walkFields(v, func(num protowire.Number, typ protowire.Type, v []byte) error {
				n, width := int64(1), int64(0)
				switch num {
				case pbContentsBool:
					width = 1
				case pbContentsInt, pbContentsUint, pbContentsFP32:
					width = 4
				case pbContentsInt64, pbContentsUint64, pbContentsFP64:
					width = 8
				case pbContentsBytes:
					sc.decoded += pbBytesEntry
				default:
					return nil
				}
				if width > 0 && typ == protowire.BytesType { // packed
					switch num {
					case pbContentsFP32:
						n = int64(len(v) / 4)
					case pbContentsFP64:
						n = int64(len(v) / 8)
					default:
						n = int64(countVarints(v))
					}
				}
				if sc.elements += n; sc.elements > maxElements {
					return apierr.BadRequest(fmt.Sprintf("the inputs' contents hold more than %d values, the limit (server.max_request_elements)", maxElements))
				}
				sc.decoded += n * width * pbSliceSlot
				return nil
			})
		}
		return nil
	})
}

// walkFields calls f with each field of the message b: its number, wire
// type and, for length-delimited fields, its bytes (nil otherwise).
func walkFields(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errProtoMalformed
		}
		b = b[n:]
		var v []byte
		if typ == protowire.BytesType {
			v, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return errProtoMalformed
		}
		b = b[n:]
		if err := f(num, typ, v); err != nil {
			return err
		}
	}
	return nil
}

// countVarints counts the varints packed in b: the bytes without the
// continuation bit.
func countVarints(b []byte) int {
	n := 0
	for _, c := range b {
		if c < 0x80 {
			n++
		}
	}
	return n
}
