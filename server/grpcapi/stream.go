package grpcapi

// ModelStreamInfer with Triton's decoupled semantics, for language models:
// every request on the stream is a generation, answered by a response per
// piece of text as it is generated (text_output, BYTES [1], raw) and, at
// its end, one flagged triton_final_response: true (an empty one when the
// request asks for it with triton_enable_empty_final_response, as
// tritonclient's enable_empty_final_response does). Requests on one stream
// run side by side; their responses carry their ids. A request's error is
// a response with error_message, and the stream goes on. When the client
// closes the stream or goes away, its generations stop at their next step
// and free their KV cache blocks.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/apierr"
	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/inferencepb"
	"github.com/stepserve/stepserve/server/wire"
	"github.com/stepserve/stepserve/serving"
)

// streamGenerations bounds the generations one stream runs at once: a
// request past it waits for one to end before the stream is read on.
const streamGenerations = 64

// Request parameters Triton's clients set that are not generation
// parameters.
var tritonStreamParams = map[string]bool{
	"triton_enable_empty_final_response": true, "sequence_id": true, "sequence_start": true, "sequence_end": true,
	"timeout": true, "priority": false,
}

// ModelStreamInfer implements the streaming RPC.
func (g *grpcServer) ModelStreamInfer(stream grpc.BidiStreamingServer[inferencepb.ModelInferRequest, inferencepb.ModelStreamInferResponse]) error {
	ctx := stream.Context()
	sio := newStreamIO(g.s, stream)
	slots := make(chan struct{}, streamGenerations)
	var wg sync.WaitGroup
	defer wg.Wait() // the generations of a half-closed stream end first
	for {
		req, ch, err := sio.recv()
		if errors.Is(err, io.EOF) {
			// The generations of the half-closed stream end first. If the
			// stream's deadline passed (or its client went) meanwhile,
			// their answers were not sent: the status says so, not that
			// the stream ended well with nothing in it.
			wg.Wait()
			if err := ctx.Err(); err != nil {
				return status.FromContextError(err).Err()
			}
			return nil
		}
		if err != nil {
			return err
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			ch.Release()
			return ctx.Err()
		}
		sio.begin()
		wg.Go(func() {
			defer func() { <-slots }()
			defer sio.done()
			defer ch.Release() // what the request and its generation held
			defer func() {
				// This goroutine is the stream's own: the server's
				// recovery does not reach it.
				if p := recover(); p != nil {
					g.s.c.Logger.Error("panic serving a ModelStreamInfer request", "model", apierr.ClipName(req.GetModelName()), "panic", p)
					sio.send(errorResponse(req, "internal error: the request's generation failed"))
				}
			}()
			g.streamGenerate(ctx, req, &ch, sio.send)
		})
	}
}

// streamGenerate answers one request of a stream, through the core's
// call (core.Call), which takes ch: what the request holds, to which the
// generation's events are charged too.
func (g *grpcServer) streamGenerate(ctx context.Context, req *inferencepb.ModelInferRequest, ch *core.Charge, send func(*inferencepb.ModelStreamInferResponse) error) {
	head := &inferencepb.ModelInferResponse{ModelName: req.GetModelName(), ModelVersion: req.GetModelVersion(), Id: req.GetId()}
	call := g.s.c.Begin(ctx, core.ProtocolGRPC, "POST", "/inference.GRPCInferenceService/ModelStreamInfer", func(_ int, err error) {
		if ctx.Err() != nil {
			return // nobody is listening
		}
		r := errorResponse(req, core.GRPCError(err).Error())
		r.InferResponse.ModelName, r.InferResponse.ModelVersion = apierr.ClipName(head.ModelName), apierr.ClipName(head.ModelVersion)
		send(r)
	})
	defer call.End()
	call.Adopt(ch)
	call.Arrived()
	call.Bytes, call.Info.ID, call.Info.Rows = protoRequestBytes(req), req.GetId(), 1
	if err := wire.CheckRequestID(req.GetId()); err != nil {
		call.Info.ID = ""
		call.Fail(err)
		return
	}
	m, err := call.Find(req.GetModelName(), req.GetModelVersion())
	if err != nil {
		call.Fail(err)
		return
	}
	head.ModelName, head.ModelVersion = m.Model().Name, m.Model().Version
	gr, emptyFinal, streaming, err := streamRequest(m, req)
	if err == nil {
		err = call.Ready()
	}
	if err != nil {
		call.Fail(err)
		return
	}
	ts, err := call.Generate(gr)
	if err != nil {
		call.Fail(err)
		return
	}
	defer ts.Close()
	var whole []byte
	for {
		ev, ok := ts.Next(ctx)
		if !ok {
			break
		}
		if ev.Err != nil {
			call.Fail(ev.Err)
			return
		}
		last := ev.Finish != ""
		if !streaming {
			whole = append(whole, ev.Text...)
			if !last {
				continue
			}
			ev.Text = string(whole)
		}
		if ev.Text != "" || (last && !emptyFinal) {
			if send(textResponse(head, ev.Text, last && !emptyFinal, ev.Finish)) != nil {
				call.Gone()
				return
			}
		}
		if last {
			if emptyFinal {
				r := &inferencepb.ModelInferResponse{ModelName: head.ModelName, ModelVersion: head.ModelVersion, Id: head.Id,
					Parameters: map[string]*inferencepb.InferParameter{
						"triton_final_response": {ParameterChoice: &inferencepb.InferParameter_BoolParam{BoolParam: true}},
						"finish_reason":         {ParameterChoice: &inferencepb.InferParameter_StringParam{StringParam: ev.Finish}},
					}}
				send(&inferencepb.ModelStreamInferResponse{InferResponse: r})
			}
			call.Succeed(nil)
			return
		}
	}
	call.Gone()
}

// errorResponse is the last response of a request that failed: its
// error, flagged final as Triton flags a decoupled request's last.
// Its names and id are clipped: an id past wire.MaxRequestIDBytes is
// refused, not echoed in full.
func errorResponse(req *inferencepb.ModelInferRequest, msg string) *inferencepb.ModelStreamInferResponse {
	return &inferencepb.ModelStreamInferResponse{ErrorMessage: msg, InferResponse: &inferencepb.ModelInferResponse{
		ModelName: apierr.ClipName(req.GetModelName()), ModelVersion: apierr.ClipName(req.GetModelVersion()), Id: apierr.ClipName(req.GetId()),
		Parameters: map[string]*inferencepb.InferParameter{
			"triton_final_response": {ParameterChoice: &inferencepb.InferParameter_BoolParam{BoolParam: true}},
		}}}
}

// textResponse is a response carrying a piece of text.
func textResponse(head *inferencepb.ModelInferResponse, text string, final bool, finish string) *inferencepb.ModelStreamInferResponse {
	raw := binary.LittleEndian.AppendUint32(make([]byte, 0, 4+len(text)), uint32(len(text)))
	raw = append(raw, text...)
	params := map[string]*inferencepb.InferParameter{
		"triton_final_response": {ParameterChoice: &inferencepb.InferParameter_BoolParam{BoolParam: final}},
	}
	if finish != "" {
		params["finish_reason"] = &inferencepb.InferParameter{ParameterChoice: &inferencepb.InferParameter_StringParam{StringParam: finish}}
	}
	return &inferencepb.ModelStreamInferResponse{InferResponse: &inferencepb.ModelInferResponse{
		ModelName: head.ModelName, ModelVersion: head.ModelVersion, Id: head.Id, Parameters: params,
		Outputs:           []*inferencepb.ModelInferResponse_InferOutputTensor{{Name: models.TextOutput, Datatype: string(models.BYTES), Shape: []int64{1}}},
		RawOutputContents: [][]byte{raw},
	}}
}

// streamRequest reads a stream request as a generation: text_input, and
// the parameters as Triton's LLM backends take them (request parameters,
// inputs of one element by name, a sampling_parameters JSON input).
func streamRequest(m *serving.Model, req *inferencepb.ModelInferRequest) (gr *serving.GenerateRequest, emptyFinal, streaming bool, err error) {
	if !m.Generative() {
		return nil, false, false, apierr.BadRequest(fmt.Sprintf("model %s is not a language model: ModelStreamInfer serves generation here; use ModelInfer", m.Model().Name))
	}
	if err := refuseStreamSharedMemory(req); err != nil {
		return nil, false, false, err
	}
	params := map[string]json.RawMessage{}
	var text *string
	raw := req.GetRawInputContents()
	if len(raw) > 0 && len(raw) != len(req.GetInputs()) {
		return nil, false, false, apierr.BadRequest(fmt.Sprintf("%d raw_input_contents for %d inputs; want one each", len(raw), len(req.GetInputs())))
	}
	for i, in := range req.GetInputs() {
		var r []byte
		if len(raw) > 0 {
			r = raw[i]
		}
		v, err := oneElement(in, r)
		if err != nil {
			return nil, false, false, err
		}
		switch name := in.GetName(); name {
		case models.GenerateInput:
			var s string
			if json.Unmarshal(v, &s) != nil {
				return nil, false, false, apierr.BadRequest("input text_input: want BYTES, one element")
			}
			text = &s
		case "sampling_parameters":
			var s string
			var sp map[string]json.RawMessage
			if json.Unmarshal(v, &s) != nil || json.Unmarshal([]byte(s), &sp) != nil {
				return nil, false, false, apierr.BadRequest("input sampling_parameters: want BYTES, one element holding a JSON object")
			}
			for k, x := range sp {
				params[k] = x
			}
		default:
			params[name] = v
		}
	}
	if text == nil {
		return nil, false, false, apierr.BadRequest("input text_input is required: the prompt, BYTES, one element")
	}
	for k, p := range req.GetParameters() {
		if k == "triton_enable_empty_final_response" {
			emptyFinal = p.GetBoolParam()
			continue
		}
		if tritonStreamParams[k] {
			continue
		}
		v, err := streamParamJSON(p)
		if err != nil {
			return nil, false, false, apierr.BadRequest(fmt.Sprintf("parameter %s: %v", apierr.ClipName(k), err))
		}
		params[k] = v
	}
	gr, stream, err := wire.GenerateParams(params)
	if err != nil {
		return nil, false, false, err
	}
	gr.Prompt = *text
	return gr, emptyFinal, stream == nil || *stream, nil
}

// oneElement is an input of one element as a JSON value (a BYTES
// element as a string).
func oneElement(in *inferencepb.ModelInferRequest_InferInputTensor, raw []byte) (json.RawMessage, error) {
	n := int64(1)
	for _, d := range in.GetShape() {
		n *= d
	}
	bad := func(why string) error {
		return apierr.BadRequest(fmt.Sprintf("input %s: %s", apierr.ClipName(in.GetName()), why))
	}
	if n != 1 {
		return nil, bad(fmt.Sprintf("shape %v holds %d elements; a generation's inputs hold one", in.GetShape(), n))
	}
	c := in.GetContents()
	num := func(v any) (json.RawMessage, error) { return json.Marshal(v) }
	le := binary.LittleEndian
	switch models.Datatype(in.GetDatatype()) {
	case models.BYTES:
		var b []byte
		switch {
		case raw != nil:
			if len(raw) < 4 || int(le.Uint32(raw)) != len(raw)-4 {
				return nil, bad("raw BYTES: want a 4-byte length, then that many bytes")
			}
			b = raw[4:]
		case len(c.GetBytesContents()) == 1:
			b = c.GetBytesContents()[0]
		default:
			return nil, bad("want one bytes_contents element")
		}
		return json.Marshal(string(b))
	case models.BOOL:
		switch {
		case len(raw) == 1:
			return num(raw[0] != 0)
		case len(c.GetBoolContents()) == 1:
			return num(c.GetBoolContents()[0])
		}
	case models.INT32:
		switch {
		case len(raw) == 4:
			return num(int32(le.Uint32(raw)))
		case len(c.GetIntContents()) == 1:
			return num(c.GetIntContents()[0])
		}
	case models.INT64:
		switch {
		case len(raw) == 8:
			return num(int64(le.Uint64(raw)))
		case len(c.GetInt64Contents()) == 1:
			return num(c.GetInt64Contents()[0])
		}
	case models.UINT64:
		switch {
		case len(raw) == 8:
			return num(le.Uint64(raw))
		case len(c.GetUint64Contents()) == 1:
			return num(c.GetUint64Contents()[0])
		}
	case models.FP32:
		switch {
		case len(raw) == 4:
			return finite(float64(math.Float32frombits(le.Uint32(raw))), bad)
		case len(c.GetFp32Contents()) == 1:
			return finite(float64(c.GetFp32Contents()[0]), bad)
		}
	case models.FP64:
		switch {
		case len(raw) == 8:
			return finite(math.Float64frombits(le.Uint64(raw)), bad)
		case len(c.GetFp64Contents()) == 1:
			return finite(c.GetFp64Contents()[0], bad)
		}
	default:
		return nil, bad(fmt.Sprintf("datatype %s is not taken; want BYTES, BOOL, INT32, INT64, UINT64, FP32 or FP64", apierr.ClipName(in.GetDatatype())))
	}
	return nil, bad(fmt.Sprintf("want one %s element, in its contents or raw", in.GetDatatype()))
}

func finite(v float64, bad func(string) error) (json.RawMessage, error) {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil, bad("want a finite number")
	}
	return json.RawMessage(strconv.FormatFloat(v, 'g', -1, 64)), nil
}

// streamParamJSON is a request parameter as a JSON value.
func streamParamJSON(p *inferencepb.InferParameter) (json.RawMessage, error) {
	switch v := p.GetParameterChoice().(type) {
	case *inferencepb.InferParameter_BoolParam:
		return json.Marshal(v.BoolParam)
	case *inferencepb.InferParameter_Int64Param:
		return json.Marshal(v.Int64Param)
	case *inferencepb.InferParameter_Uint64Param:
		return json.Marshal(v.Uint64Param)
	case *inferencepb.InferParameter_StringParam:
		// A string may hold a JSON value (stop lists); else it is one.
		if json.Valid([]byte(v.StringParam)) && len(v.StringParam) > 0 && (v.StringParam[0] == '[' || v.StringParam[0] == '"') {
			return json.RawMessage(v.StringParam), nil
		}
		return json.Marshal(v.StringParam)
	case *inferencepb.InferParameter_DoubleParam:
		if math.IsNaN(v.DoubleParam) || math.IsInf(v.DoubleParam, 0) {
			return nil, errors.New("want a finite number")
		}
		return json.RawMessage(strconv.FormatFloat(v.DoubleParam, 'g', -1, 64)), nil
	}
	return nil, errors.New("has no value")
}

// refuseStreamSharedMemory refuses tensors in shared memory on a stream:
// a generation's prompt and text are small and travel in the messages;
// ModelInfer serves tensors in shared memory.
func refuseStreamSharedMemory(req *inferencepb.ModelInferRequest) error {
	for _, in := range req.GetInputs() {
		if _, ok := in.GetParameters()["shared_memory_region"]; ok {
			return apierr.BadRequest(fmt.Sprintf("input %s: ModelStreamInfer takes its inputs in the message, not in shared memory; ModelInfer serves tensors in shared memory", apierr.ClipName(in.GetName())))
		}
	}
	for _, o := range req.GetOutputs() {
		if _, ok := o.GetParameters()["shared_memory_region"]; ok {
			return apierr.BadRequest(fmt.Sprintf("output %s: ModelStreamInfer answers in its messages, not in shared memory; ModelInfer serves tensors in shared memory", apierr.ClipName(o.GetName())))
		}
	}
	return nil
}
