package grpcapi

import (
	"math"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/stepserve/stepserve/server/inferencepb"
)

// decodePlain decodes a ModelInferRequest that holds only what a plain
// request holds (names, version, id, shapes, parameters, requested
// outputs, raw_input_contents), with its raw_input_contents aliasing b
// rather than copied: b must outlive the request's decoding. It reports
// false for anything else (typed contents, fields it does not know,
// strings that are not UTF-8, malformed bytes), which proto.Unmarshal
// decodes, or refuses with its own words.
//
// proto.Unmarshal copies every raw input and allocates protobuf's
// bookkeeping for each part; on a single-row gRPC request that was 6% of
// the server's CPU, with shared-memory parameters (four map entries) 10%.
func decodePlain(b []byte) (*inferencepb.ModelInferRequest, bool) {
	r := new(inferencepb.ModelInferRequest)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType {
			return nil, false
		}
		b = b[n:]
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		switch num {
		case pbRequestModelName, pbRequestVersion, pbRequestID:
			if !utf8.Valid(v) {
				return nil, false
			}
			s := string(v)
			switch num {
			case pbRequestModelName:
				r.ModelName = s
			case pbRequestVersion:
				r.ModelVersion = s
			default:
				r.Id = s
			}
		case pbRequestInputs:
			in, ok := decodePlainInput(v)
			if !ok {
				return nil, false
			}
			r.Inputs = append(r.Inputs, in)
		case pbRequestOutputs:
			out := new(inferencepb.ModelInferRequest_InferRequestedOutputTensor)
			for len(v) > 0 {
				num, typ, n := protowire.ConsumeTag(v)
				if n < 0 || typ != protowire.BytesType || num != 1 && num != pbOutputParameters {
					return nil, false
				}
				f, m := protowire.ConsumeBytes(v[n:])
				if m < 0 {
					return nil, false
				}
				v = v[n+m:]
				if num == pbOutputParameters {
					if out.Parameters == nil {
						out.Parameters = map[string]*inferencepb.InferParameter{}
					}
					if !decodeParamEntry(f, out.Parameters) {
						return nil, false
					}
					continue
				}
				if !utf8.Valid(f) {
					return nil, false
				}
				out.Name = string(f)
			}
			r.Outputs = append(r.Outputs, out)
		case pbRequestParameters:
			if r.Parameters == nil {
				r.Parameters = map[string]*inferencepb.InferParameter{}
			}
			if !decodeParamEntry(v, r.Parameters) {
				return nil, false
			}
		case pbRequestRaw:
			r.RawInputContents = append(r.RawInputContents, v[:len(v):len(v)])
		default:
			return nil, false
		}
	}
	return r, true
}

// decodePlainInput decodes an InferInputTensor of a name, a datatype and
// a shape.
func decodePlainInput(b []byte) (*inferencepb.ModelInferRequest_InferInputTensor, bool) {
	in := new(inferencepb.ModelInferRequest_InferInputTensor)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		switch {
		case (num == 1 || num == 2) && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 || !utf8.Valid(v) {
				return nil, false
			}
			if num == 1 {
				in.Name = string(v)
			} else {
				in.Datatype = string(v)
			}
			b = b[m:]
		case num == pbInputShape && typ == protowire.BytesType: // packed
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil, false
			}
			if in.Shape == nil {
				in.Shape = make([]int64, 0, countVarints(v))
			}
			for len(v) > 0 {
				d, k := protowire.ConsumeVarint(v)
				if k < 0 {
					return nil, false
				}
				in.Shape = append(in.Shape, int64(d))
				v = v[k:]
			}
			b = b[m:]
		case num == pbInputParameters && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil, false
			}
			if in.Parameters == nil {
				in.Parameters = map[string]*inferencepb.InferParameter{}
			}
			if !decodeParamEntry(v, in.Parameters) {
				return nil, false
			}
			b = b[m:]
		case num == pbInputShape && typ == protowire.VarintType:
			d, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return nil, false
			}
			in.Shape = append(in.Shape, int64(d))
			b = b[m:]
		default:
			return nil, false
		}
	}
	return in, true
}

// decodeParamEntry decodes one entry of a map<string, InferParameter>
// into params (a later key replaces an earlier one, as in protobuf). An
// entry without its key or value, or a value with a field it does not
// know, is left to protobuf.
func decodeParamEntry(b []byte, params map[string]*inferencepb.InferParameter) bool {
	var key string
	var val *inferencepb.InferParameter
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType || num != 1 && num != 2 {
			return false
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return false
		}
		b = b[n+m:]
		if num == 1 {
			if !utf8.Valid(v) {
				return false
			}
			key = string(v)
			continue
		}
		if val == nil {
			val = new(inferencepb.InferParameter)
		}
		if !decodeParam(v, val) {
			return false
		}
	}
	if key == "" || val == nil {
		return false
	}
	params[key] = val
	return true
}

// decodeParam decodes an InferParameter into p, merging as protobuf
// does: the oneof's last field wins.
func decodeParam(b []byte, p *inferencepb.InferParameter) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var m int
		switch {
		case (num == 1 || num == 2 || num == 5) && typ == protowire.VarintType:
			var v uint64
			v, m = protowire.ConsumeVarint(b)
			switch num {
			case 1:
				p.ParameterChoice = &inferencepb.InferParameter_BoolParam{BoolParam: v != 0}
			case 2:
				p.ParameterChoice = &inferencepb.InferParameter_Int64Param{Int64Param: int64(v)}
			default:
				p.ParameterChoice = &inferencepb.InferParameter_Uint64Param{Uint64Param: v}
			}
		case num == 3 && typ == protowire.BytesType:
			var v []byte
			v, m = protowire.ConsumeBytes(b)
			if m >= 0 && !utf8.Valid(v) {
				return false
			}
			p.ParameterChoice = &inferencepb.InferParameter_StringParam{StringParam: string(v)}
		case num == 4 && typ == protowire.Fixed64Type:
			var v uint64
			v, m = protowire.ConsumeFixed64(b)
			p.ParameterChoice = &inferencepb.InferParameter_DoubleParam{DoubleParam: math.Float64frombits(v)}
		default:
			return false
		}
		if m < 0 {
			return false
		}
		b = b[m:]
	}
	return true
}
