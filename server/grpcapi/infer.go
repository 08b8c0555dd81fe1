package grpcapi

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"

	"google.golang.org/protobuf/proto"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/inferencepb"
	"github.com/stepserve/stepserve/server/wire"
	"github.com/stepserve/stepserve/serving"
)

// ModelInfer is gRPC inference. The request is translated into the HTTP
// path's wire form (inputs with their raw data or typed contents, and
// parameters as JSON values) and from there takes the path every request
// takes: checkRequest, the in-flight budget, decodeValues, the model's
// batcher. Only the translation and the response's encoding are gRPC's.
//
// Outputs always come back as raw_output_contents, whichever form the
// inputs came in and whatever binary_data_output or binary_data say (they
// are checked, then have nothing to choose): Triton answers so, and its
// clients read nothing else (tritonclient's as_numpy reads
// raw_output_contents by index). BYTES outputs are raw as Triton
// serializes them: each element a 4-byte little-endian length, then its
// bytes. An output written to shared memory has an empty entry, and its
// region, offset and size as parameters. Inputs in shared memory have no
// raw_input_contents entry.
func (g *grpcServer) ModelInfer(ctx context.Context, r *inferencepb.ModelInferRequest) (*inferencepb.ModelInferResponse, error) {
	return g.modelInfer(ctx, r.GetModelName(), r.GetModelVersion(), protoRequestBytes(r), func(call *core.Call, _ *models.Model) (*inferencepb.ModelInferRequest, error) {
		// The message arrived decoded (a caller in this process): what
		// it holds is charged as an HTTP body is.
		return r, call.Take(protoRequestBytes(r), "the request body")
	})
}

// modelInferRaw is ModelInfer on the message as it arrived, which the
// server's ModelInfer handler hands it (grpcModelInferHandler): it is
// walked, bounded and charged for what it decodes to before it is
// decoded (grpc_limits.go).
func (g *grpcServer) modelInferRaw(ctx context.Context, raw *rawInfer) (*inferencepb.ModelInferResponse, error) {
	defer raw.free()
	wireBytes := int64(len(raw.bytes()))
	sc, scanErr := scanInferRequest(raw.bytes(), g.s.c.Opts.MaxRequestElements)
	malformed := errors.Is(scanErr, errProtoMalformed)
	if scanErr != nil && !malformed && sc.model == "" {
		// A limit the walk met before any model name: the same refusal
		// whatever the model (and not counted, as an unknown name is not).
		return nil, core.GRPCError(scanErr)
	}
	return g.modelInfer(ctx, sc.model, sc.version, wireBytes, func(call *core.Call, m *models.Model) (*inferencepb.ModelInferRequest, error) {
		if scanErr != nil && !malformed {
			return nil, scanErr
		}
		// Malformed bytes are bounded as well-formed ones are, up to where
		// the walk stopped: the protobuf library builds what comes before
		// them, then fails at the same place and says why.
		//
		// Counts a little past the model's are left to the checks after
		// decoding, which name a repeated input; far past, they are
		// refused here.
		cfg := m.Config
		if sc.inputs > len(cfg.Inputs)+pbExtraTensors {
			return nil, apierr.BadRequest(fmt.Sprintf("the request names %d inputs; model %s takes %s", sc.inputs, m.Name, wire.Signature(cfg.Inputs)))
		}
		if sc.outputs > len(cfg.Outputs)+pbExtraTensors {
			return nil, apierr.BadRequest(fmt.Sprintf("the request names %d outputs; model %s gives %s", sc.outputs, m.Name, wire.Signature(cfg.Outputs)))
		}
		if sc.raw > len(cfg.Inputs)+pbExtraTensors {
			return nil, apierr.BadRequest(fmt.Sprintf("raw_input_contents has %d entries; model %s takes %d %s", sc.raw, m.Name, len(cfg.Inputs), wire.Plural(len(cfg.Inputs), "input")))
		}
		if err := call.Take(sc.decoded, "the request body"); err != nil {
			return nil, err
		}
		if r, ok := decodePlain(raw.bytes()); ok {
			// Its raw contents are raw's bytes, held (and charged as raw)
			// until the call ends; decoding copies them to the request's
			// tensors. The charge taken for a decoded copy of them gives
			// them back.
			var aliased int64
			for _, b := range r.RawInputContents {
				aliased += int64(len(b))
			}
			call.Shrink(sc.decoded - aliased)
			return r, nil
		}
		r := new(inferencepb.ModelInferRequest)
		if err := proto.Unmarshal(raw.bytes(), r); err != nil {
			return nil, apierr.BadRequest(fmt.Sprintf("the message is not a ModelInferRequest: %v", err))
		}
		raw.free()
		if n := protoRequestBytes(r); n > sc.decoded { // not expected: the walk's bound is above it
			if err := call.Take(n-sc.decoded, "the request body"); err != nil {
				return nil, err
			}
		}
		return r, nil
	})
}

// protoDecoder yields a request's message once its model is known,
// charged to the call.
type protoDecoder func(call *core.Call, m *models.Model) (*inferencepb.ModelInferRequest, error)

// modelInfer answers a ModelInfer request for model and version, whose
// message decode yields; wireBytes is the message's size for the log
// when it was never decoded. The core's call runs its life (core.Call);
// gRPC writes the response after this returns, so what the request holds
// of the budget, its response included, is given back when its RPC ends.
func (g *grpcServer) modelInfer(ctx context.Context, model, version string, wireBytes int64, decode protoDecoder) (*inferencepb.ModelInferResponse, error) {
	call := g.s.c.Begin(ctx, core.ProtocolGRPC, "POST", "/inference.GRPCInferenceService/ModelInfer", nil)
	defer call.End()
	call.Bytes = wireBytes
	resp, err := g.s.inferGRPC(call, model, version, decode)
	if err != nil {
		call.Fail(err)
		return nil, refuse(ctx, err)
	}
	call.HoldUntil(ctx)
	return resp, nil
}

// inferGRPC answers one gRPC inference request through call.
func (s *API) inferGRPC(call *core.Call, model, version string, decode protoDecoder) (*inferencepb.ModelInferResponse, error) {
	m, err := call.Find(model, version)
	if err != nil {
		return nil, err
	}
	call.Trace()
	if err := call.Ready(); err != nil {
		return nil, err
	}
	r, err := decode(call, m.Model())
	if r != nil {
		call.Bytes = protoRequestBytes(r)
		call.Info.ID = r.GetId()
		if ins := r.GetInputs(); len(ins) > 0 && len(ins[0].GetShape()) > 0 {
			call.Info.Rows = int(ins[0].GetShape()[0])
		}
	}
	if err != nil {
		return nil, err
	}
	wr, err := wireFromProto(r)
	if err != nil {
		return nil, err
	}
	req, decoded, seq, err := wire.CheckRequest(&wr, nil, int(min(call.Bytes, math.MaxInt32)), m.Model(), s.c.Opts.MaxRequestElements)
	if err != nil {
		return nil, err
	}
	protoOutputs(req)
	fp := protoFootprint(m.Model(), req, decoded, seq)
	if _, compressed := compressedCall(call.Context()); compressed {
		// gRPC compresses the encoded response into a copy of its own as
		// it sends it: held with the outputs, not a part of the response's
		// size.
		fp.Outputs += fp.JSON
	}
	res, err := call.Infer(req, fp)
	if err != nil {
		return nil, err
	}
	resp := protoResponse(call.Model().Model(), req, res)
	call.Succeed(res)
	return resp, nil
}

// protoRequestBytes is the memory a decoded request holds, at least a byte
// for every value it carries (the bound checkInput puts on shapes): its
// typed values as Go holds them, its raw and string bytes, and room for
// its names and headers.
func protoRequestBytes(r *inferencepb.ModelInferRequest) int64 {
	n := int64(256 + len(r.GetId()) + 64*len(r.GetParameters()))
	for _, in := range r.GetInputs() {
		n += int64(128 + len(in.GetName()) + 8*len(in.GetShape()) + 64*len(in.GetParameters()))
		if c := in.GetContents(); c != nil {
			n += int64(len(c.BoolContents) + 4*len(c.IntContents) + 8*len(c.Int64Contents) + 4*len(c.UintContents) +
				8*len(c.Uint64Contents) + 4*len(c.Fp32Contents) + 8*len(c.Fp64Contents) + 24*len(c.BytesContents))
			for _, b := range c.BytesContents {
				n += int64(len(b))
			}
		}
	}
	for _, o := range r.GetOutputs() {
		n += int64(64 + len(o.GetName()) + 64*len(o.GetParameters()))
	}
	for _, b := range r.GetRawInputContents() {
		n += int64(24 + len(b))
	}
	return n
}

// wireFromProto translates a gRPC request into the wire form the HTTP
// decoders produce: raw_input_contents become each input's binary data
// (with its binary_data_size), typed contents stay typed, and parameters
// become the JSON values the shared checks read.
func wireFromProto(r *inferencepb.ModelInferRequest) (wire.WireRequest, error) {
	raw, ins := r.GetRawInputContents(), r.GetInputs()
	// Inputs in shared memory have no entry, as in Triton (tritonclient's
	// set_shared_memory drops the input's raw contents).
	inShm := 0
	for _, in := range ins {
		if _, ok := in.GetParameters()["shared_memory_region"]; ok {
			inShm++
		}
	}
	if len(raw) > 0 && len(raw) != len(ins)-inShm {
		if inShm > 0 {
			return wire.WireRequest{}, apierr.BadRequest(fmt.Sprintf("raw_input_contents has %d entries for %d inputs not in shared memory; send one per such input, in the inputs' order, or none", len(raw), len(ins)-inShm))
		}
		return wire.WireRequest{}, apierr.BadRequest(fmt.Sprintf("raw_input_contents has %d entries for %d inputs; send one per input, in the inputs' order, or none", len(raw), len(ins)))
	}
	wr := wire.WireRequest{ID: r.GetId(), Pairs: protoParams(r.GetParameters())}
	wr.Inputs = make([]wire.WireInput, len(ins))
	next := 0 // raw's entry for the next input not in shared memory
	for i, in := range ins {
		if len(in.GetShape()) > wire.MaxRank {
			return wire.WireRequest{}, apierr.BadRequest(fmt.Sprintf("input %q: the shape has more than %d dimensions", apierr.ClipName(in.GetName()), wire.MaxRank))
		}
		w := &wr.Inputs[i]
		w.Name, w.Datatype, w.Shape, w.Proto = in.GetName(), in.GetDatatype(), in.GetShape(), true
		w.Pairs = protoParams(in.GetParameters())
		if c := in.GetContents(); !contentsEmpty(c) {
			w.Contents = protoContents{c}
		}
		if _, ok := in.GetParameters()["shared_memory_region"]; len(raw) > 0 && !ok {
			w.Bin, w.BinSet = raw[next], true
			w.Pairs = append(w.Pairs, wire.ParamPair{Key: "binary_data_size", Raw: strconv.AppendInt(nil, int64(len(raw[next])), 10)})
			next++
		}
	}
	if outs := r.GetOutputs(); len(outs) > 0 {
		wr.Outputs = make([]wire.WireOutput, len(outs))
		for i, o := range outs {
			wr.Outputs[i] = wire.WireOutput{Name: o.GetName(), Pairs: protoParams(o.GetParameters())}
		}
	}
	return wr, nil
}

// protoParams are gRPC parameters as the JSON values the shared checks
// read: priority and timeout as integers, binary_data as a boolean.
func protoParams(params map[string]*inferencepb.InferParameter) wire.ParamPairs {
	if len(params) == 0 {
		return nil
	}
	pairs := make(wire.ParamPairs, 0, len(params))
	for k, p := range params {
		pairs = append(pairs, wire.ParamPair{Key: k, Raw: paramJSON(p)})
	}
	return pairs
}

func paramJSON(p *inferencepb.InferParameter) json.RawMessage {
	switch v := p.GetParameterChoice().(type) {
	case *inferencepb.InferParameter_BoolParam:
		return strconv.AppendBool(nil, v.BoolParam)
	case *inferencepb.InferParameter_Int64Param:
		return strconv.AppendInt(nil, v.Int64Param, 10)
	case *inferencepb.InferParameter_Uint64Param:
		return strconv.AppendUint(nil, v.Uint64Param, 10)
	case *inferencepb.InferParameter_DoubleParam:
		if math.IsNaN(v.DoubleParam) || math.IsInf(v.DoubleParam, 0) {
			return strconv.AppendQuote(nil, strconv.FormatFloat(v.DoubleParam, 'g', -1, 64))
		}
		return strconv.AppendFloat(nil, v.DoubleParam, 'g', -1, 64)
	case *inferencepb.InferParameter_StringParam:
		b, _ := json.Marshal(v.StringParam)
		return b
	}
	return json.RawMessage("null")
}

// protoContents are an input's typed contents ([typedContents]).
type protoContents struct {
	c *inferencepb.InferTensorContents
}

// contentsFields are InferTensorContents' fields, by name, with how many
// values each holds.
func contentsFields(c *inferencepb.InferTensorContents) [8]struct {
	name string
	n    int
} {
	return [8]struct {
		name string
		n    int
	}{
		{"bool_contents", len(c.GetBoolContents())}, {"int_contents", len(c.GetIntContents())},
		{"int64_contents", len(c.GetInt64Contents())}, {"uint_contents", len(c.GetUintContents())},
		{"uint64_contents", len(c.GetUint64Contents())}, {"fp32_contents", len(c.GetFp32Contents())},
		{"fp64_contents", len(c.GetFp64Contents())}, {"bytes_contents", len(c.GetBytesContents())},
	}
}

func contentsEmpty(c *inferencepb.InferTensorContents) bool {
	for _, f := range contentsFields(c) {
		if f.n > 0 {
			return false
		}
	}
	return true
}

// contentsField is the field of InferTensorContents that carries dt, as
// the protocol assigns them; "" for datatypes only raw contents carry.
func contentsField(dt models.Datatype) string {
	switch dt {
	case models.BOOL:
		return "bool_contents"
	case models.INT8, models.INT16, models.INT32:
		return "int_contents"
	case models.INT64:
		return "int64_contents"
	case models.UINT8, models.UINT16, models.UINT32:
		return "uint_contents"
	case models.UINT64:
		return "uint64_contents"
	case models.FP32:
		return "fp32_contents"
	case models.FP64:
		return "fp64_contents"
	case models.BYTES:
		return "bytes_contents"
	}
	return ""
}

func (p protoContents) Count(dt models.Datatype) (int, error) {
	want := contentsField(dt)
	if want == "" {
		return 0, fmt.Errorf("%s values have no typed contents field; send them as raw_input_contents", dt)
	}
	n := 0
	for _, f := range contentsFields(p.c) {
		switch {
		case f.name == want:
			n = f.n
		case f.n > 0:
			return 0, fmt.Errorf("contents hold %s, but a %s input's values go in %s", f.name, dt, want)
		}
	}
	return n, nil
}

func (p protoContents) Put(dt models.Datatype, dst []byte) error {
	c := p.c
	intRange := func(i int, v, lo, hi int64) error {
		if v < lo || v > hi {
			return fmt.Errorf("element %d: %d is not in the %s range", i, v, dt)
		}
		return nil
	}
	switch dt {
	case models.BOOL:
		for i, v := range c.BoolContents {
			dst[i] = 0
			if v {
				dst[i] = 1
			}
		}
	case models.INT8, models.INT16, models.INT32:
		size := dt.Size()
		lo, hi := int64(math.MinInt32), int64(math.MaxInt32)
		if size < 4 {
			hi = 1<<(8*size-1) - 1
			lo = -hi - 1
		}
		for i, v := range c.IntContents {
			if err := intRange(i, int64(v), lo, hi); err != nil {
				return err
			}
			wire.PutInt(dst[i*size:], uint64(int64(v)), size)
		}
	case models.INT64:
		for i, v := range c.Int64Contents {
			binary.LittleEndian.PutUint64(dst[8*i:], uint64(v))
		}
	case models.UINT8, models.UINT16, models.UINT32:
		size := dt.Size()
		hi := int64(1)<<(8*size) - 1
		for i, v := range c.UintContents {
			if err := intRange(i, int64(v), 0, hi); err != nil {
				return err
			}
			wire.PutInt(dst[i*size:], uint64(v), size)
		}
	case models.UINT64:
		for i, v := range c.Uint64Contents {
			binary.LittleEndian.PutUint64(dst[8*i:], v)
		}
	case models.FP32:
		for i, v := range c.Fp32Contents {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	case models.FP64:
		for i, v := range c.Fp64Contents {
			binary.LittleEndian.PutUint64(dst[8*i:], math.Float64bits(v))
		}
	default:
		return fmt.Errorf("%s values have no typed contents field; send them as raw_input_contents", dt)
	}
	return nil
}

func (p protoContents) Strings(out []string) []string {
	for _, b := range p.c.BytesContents {
		out = append(out, string(b))
	}
	return out
}

func (p protoContents) TextBytes() int64 {
	n := int64(0)
	for _, b := range p.c.BytesContents {
		n += int64(len(b))
	}
	return n
}

// protoOutputs makes a request's outputs all raw: a gRPC response
// carries raw_output_contents, as Triton's does.
func protoOutputs(req *wire.InferRequest) {
	for i := range req.Outputs {
		req.Outputs[i].Binary = true
	}
}

// shmParamsProto is the most an output's shared-memory parameters take in
// the encoded response, besides the region's name.
const shmParamsProto = 128

// protoFootprint is [wire.FootprintOf] with the response gRPC sends: its
// JSON is the encoded message, every output's raw bytes in it but those
// written to shared memory.
func protoFootprint(m *models.Model, req *wire.InferRequest, decoded int64, seq int) wire.Footprint {
	f := wire.FootprintOf(m, req, decoded, seq)
	cfg := m.Config
	if seq == 0 {
		seq = cfg.MaxSeq()
	}
	rows := int64(req.Rows)
	f.Protobuf, f.Binary = true, 0
	f.JSON = 64 + int64(len(m.Name)+len(m.Version)+len(req.ID))
	for _, c := range req.Outputs {
		o := cfg.Outputs[c.Index]
		f.JSON += 48 + int64(len(o.Name)+11*len(o.Shape))
		if c.SharedMemory != nil {
			f.JSON += shmParamsProto + int64(len(c.SharedMemory.Region)) // no data: it is in the region
			continue
		}
		f.JSON += rows * int64(o.RowBytes(seq))
	}
	return f
}

// protoResponse encodes the outputs of a request that ran, raw: the step's
// own output buffers, not copies (classification's BYTES built as Triton
// serializes them).
func protoResponse(m *models.Model, req *wire.InferRequest, res *serving.Result) *inferencepb.ModelInferResponse {
	resp := &inferencepb.ModelInferResponse{ModelName: m.Name, ModelVersion: m.Version, Id: req.ID}
	tensors := make([]inferencepb.ModelInferResponse_InferOutputTensor, len(req.Outputs))
	resp.Outputs = make([]*inferencepb.ModelInferResponse_InferOutputTensor, len(req.Outputs))
	for i, c := range req.Outputs {
		spec := m.Config.Outputs[c.Index]
		data := res.Outputs[c.Index]
		t := &tensors[i]
		resp.Outputs[i] = t
		t.Name, t.Datatype = spec.Name, string(spec.Datatype)
		t.Shape = make([]int64, len(spec.Shape))
		t.Shape[0] = int64(req.Rows)
		for d, n := range spec.Shape[1:] {
			t.Shape[1+d] = int64(n)
		}
		if shm := c.SharedMemory; shm != nil {
			// Written to its region: the metadata, where, and how much,
			// and an empty entry that keeps raw_output_contents one per
			// output, as Triton's.
			t.Parameters = map[string]*inferencepb.InferParameter{
				"shared_memory_region":    {ParameterChoice: &inferencepb.InferParameter_StringParam{StringParam: shm.Region}},
				"shared_memory_offset":    {ParameterChoice: &inferencepb.InferParameter_Int64Param{Int64Param: shm.Offset}},
				"shared_memory_byte_size": {ParameterChoice: &inferencepb.InferParameter_Int64Param{Int64Param: shm.Written}},
			}
			resp.RawOutputContents = append(resp.RawOutputContents, []byte{})
			continue
		}
		if c.Classes > 0 {
			// Triton's classification: the top classes per row, as BYTES.
			var labels []string
			if c.Index < len(m.Labels) {
				labels = m.Labels[c.Index]
			}
			t.Datatype, t.Shape = string(models.BYTES), []int64{int64(req.Rows), int64(c.Classes)}
			var raw []byte
			for _, v := range wire.Classify(spec, labels, data, req.Rows, c.Classes) {
				raw = binary.LittleEndian.AppendUint32(raw, uint32(len(v)))
				raw = append(raw, v...)
			}
			resp.RawOutputContents = append(resp.RawOutputContents, raw)
			continue
		}
		resp.RawOutputContents = append(resp.RawOutputContents, data)
	}
	return resp
}
