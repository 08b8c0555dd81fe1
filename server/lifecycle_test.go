package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stepserve/stepserve/server/core"
	pb "github.com/stepserve/stepserve/server/inferencepb"
)

// TestLifecycle runs one table of requests through every door (OIP
// inference over HTTP and gRPC, gRPC's stream, Triton's generate,
// OpenAI's completions and embeddings, TEI's /embed), each provoking one
// outcome of a request's life (core.Call), and asserts that every door
// gives the lifecycle's answer alike:
//
//   - the status: the lifecycle's (core.StatusOf's, a client that gave
//     up at its deadline 504), which the request log line and the trace
//     record and the metrics count, and the one the client sees: gRPC's
//     code mapped back by one fixed table (lcGRPCStatus), TEI's
//     documented statuses by its own (teiWire);
//   - stepserve_requests_total: the outcome counted once under the model
//     and the door's protocol, nothing for a model not served or a
//     request refused before it began;
//   - the model's statistics (Triton's /v2/models/{m}/stats): one
//     success or one failure once the model was found, nothing else;
//   - the in-flight budget: back to zero once the request is over;
//   - the trace (Triton's trace extension): a request that ran in a step
//     is written with its status, one that never reached a step is not.
//     Only the doors that run tensor steps are read: a generation's steps
//     are the generation loop's, which no trace records.
//
// Every row is a fresh server over one set of models, whose steps a row
// holds (a request waits in the queue behind them, or in its own
// generation step) or fails; nothing waits on a timer except the
// deadline rows' own deadlines.
func TestLifecycle(t *testing.T) {
	w := newLifecycleWorld(t)
	for _, d := range lifecycleDoors() {
		t.Run(d.name, func(t *testing.T) {
			for _, o := range lifecycleOutcomes {
				if _, out := d.without[o.kind]; out {
					continue // a cell the door cannot produce: see the door's without
				}
				t.Run(o.name, func(t *testing.T) { w.run(t, d, o) })
			}
		})
	}
}

// lcKind is an outcome a row provokes.
type lcKind int

const (
	lcSuccess lcKind = iota
	lcClientGone
	lcDeadline
	lcBudgetRefused
	lcScopeRefused
	lcModelMissing
	lcEngineFailure
)

// lcOutcome is what the lifecycle makes of an outcome, whichever door.
type lcOutcome struct {
	kind lcKind
	name string
	// status is the lifecycle's status: the request log line's, the
	// trace's, and (unless the door translates it) the client's; 499 is
	// a client that gave up and saw nothing.
	status int
	// counted is the requests_total outcome counted once; "" for none.
	counted string
	// stats is the model's statistics' count that grows by one:
	// "success", "fail", or "" for none.
	stats string
	// began: the call began (core.Core.Begin), so a request log line is
	// written; scope is checked before.
	began bool
	// stepped: the request ran in a step of a tensor model, so the
	// trace holds it with its status.
	stepped bool
}

var lifecycleOutcomes = []lcOutcome{
	{lcSuccess, "success", 200, "success", "success", true, true},
	{lcClientGone, "client gone", core.StatusClientClosed, "cancelled", "fail", true, false},
	{lcDeadline, "deadline", http.StatusGatewayTimeout, "timeout", "fail", true, false},
	{lcBudgetRefused, "budget refused", http.StatusServiceUnavailable, "rejected", "fail", true, false},
	{lcScopeRefused, "scope refused", http.StatusUnauthorized, "", "", false, false},
	{lcModelMissing, "model missing", http.StatusNotFound, "", "", true, false},
	{lcEngineFailure, "engine failure", http.StatusInternalServerError, "error", "fail", true, true},
}

// lcGRPCStatus maps the gRPC codes the doors answer back to HTTP statuses:
// core.grpcCode's table read backwards. RESOURCE_EXHAUSTED is the
// budget's busy answer (core.GRPCError of core.ErrBusy, a 503 over HTTP):
// no request here is too large (413) or rate limited (429).
var lcGRPCStatus = map[codes.Code]int{
	codes.OK:                http.StatusOK,
	codes.InvalidArgument:   http.StatusBadRequest,
	codes.Unauthenticated:   http.StatusUnauthorized,
	codes.PermissionDenied:  http.StatusForbidden,
	codes.NotFound:          http.StatusNotFound,
	codes.DeadlineExceeded:  http.StatusGatewayTimeout,
	codes.ResourceExhausted: http.StatusServiceUnavailable,
	codes.Canceled:          core.StatusClientClosed,
	codes.Unimplemented:     http.StatusNotImplemented,
	codes.Unavailable:       http.StatusServiceUnavailable,
	codes.Internal:          http.StatusInternalServerError,
}

// teiWire is TEI's statuses for the lifecycle's, as its clients expect
// them (tei.writeTEIError): a busy server and a request past its
// deadline are 429 Overloaded, a failed model 424 Backend.
func teiWire(st int) int {
	switch st {
	case http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return http.StatusTooManyRequests
	case http.StatusInternalServerError:
		return http.StatusFailedDependency
	}
	return st
}

// tgiWire is TGI's statuses for the lifecycle's (tgi.writeError): a
// busy server is 429 overloaded, a failed generation 424, a request
// refused as invalid 422.
func tgiWire(st int) int {
	switch st {
	case http.StatusServiceUnavailable:
		return http.StatusTooManyRequests
	case http.StatusInternalServerError:
		return http.StatusFailedDependency
	case http.StatusBadRequest:
		return http.StatusUnprocessableEntity
	}
	return st
}

// lcDoor is one door's adapter: how it sends a request, and what it
// serves it on.
type lcDoor struct {
	name     string
	protocol string // requests_total's protocol label
	model    string // the model its requests name
	// deadlineModel, when set, is the model a deadline row names: one
	// whose queue deadline (batching.default_timeout) is the deadline,
	// for a door whose protocol carries none.
	deadlineModel string
	grpc          bool // served over gRPC
	generative    bool // runs a generation: no tensor step, so no trace
	wire          func(status int) int
	// without are the outcomes the door cannot produce, and why.
	without map[lcKind]string
	// budgetRoom is the in-flight budget a budget row leaves free: room
	// for what the door reads before it knows the model (the stream's
	// flow-control window, the body of a door that names the model in
	// it), none for what the request takes once the model is found, so
	// that the refusal is the model's.
	budgetRoom int64
	send       func(r *lcRequest) int
}

// lcRequest is one request a row sends.
type lcRequest struct {
	t      *testing.T
	kind   lcKind
	ctx    context.Context // the client's: cancelled for client gone, a deadline for gRPC's deadline
	url    string
	http   *http.Client
	grpc   pb.GRPCInferenceServiceClient
	model  string
	bearer string // a token the server does not know, for scope refused
}

// post sends body to path over HTTP and returns the status the client
// saw; 499 when it gave up (its context cancelled) and saw none.
func (r *lcRequest) post(path, body string) int {
	req, err := http.NewRequestWithContext(r.ctx, http.MethodPost, r.url+path, strings.NewReader(body))
	if err != nil { // sent from the row's goroutine: no FailNow here
		r.t.Errorf("POST %s: %v", path, err)
		return 0
	}
	req.Header.Set("Content-Type", "application/json")
	if r.bearer != "" {
		req.Header.Set("Authorization", "Bearer "+r.bearer)
	}
	resp, err := r.http.Do(req)
	if err != nil {
		if errors.Is(err, context.Canceled) && r.ctx.Err() != nil {
			return core.StatusClientClosed
		}
		r.t.Errorf("POST %s: %v", path, err)
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// grpcContext is the request's context with its bearer token.
func (r *lcRequest) grpcContext() context.Context {
	if r.bearer == "" {
		return r.ctx
	}
	return metadata.AppendToOutgoingContext(r.ctx, "authorization", "Bearer "+r.bearer)
}

// grpcStatus is the HTTP status of a gRPC call's error.
func (r *lcRequest) grpcStatus(err error) int {
	return r.codeStatus(status.Code(err), fmt.Sprint(err))
}

func (r *lcRequest) codeStatus(code codes.Code, what string) int {
	st, ok := lcGRPCStatus[code]
	if !ok {
		r.t.Errorf("gRPC code %v, which the table does not map: %s", code, what)
	}
	return st
}

// rpcErrorCode reads the code in a stream response's error_message,
// written as a gRPC status error is ("rpc error: code = NotFound desc = ...").
var rpcErrorCode = regexp.MustCompile(`^rpc error: code = (\w+) desc = `)

func codeNamed(name string) (codes.Code, bool) {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if c.String() == name {
			return c, true
		}
	}
	return 0, false
}

const (
	lcPrompt       = "Once upon a time"
	lcTokens       = 16 // what a generation asks for: its events may hold 16 tokens' worth (serving.TextStream.MaxHeld)
	lcSummaxBody   = `"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]`
	lcEmbedderText = "hello world"
)

func lifecycleDoors() []lcDoor {
	noTimeout := func(door string) string {
		return door + " carries no deadline of its own (core.GenerateParams takes no timeout, and a generation has no queue deadline); " +
			"an HTTP client's deadline reaches the server only as its connection closing, which is the client-gone row"
	}
	return []lcDoor{
		{
			name: "OIP infer over HTTP", protocol: "http", model: "summax",
			// The model is known from the path before the body is read:
			// nothing needs room before it.
			budgetRoom: 0,
			send: func(r *lcRequest) int {
				params := ""
				if r.kind == lcDeadline {
					// OIP's timeout parameter (microseconds): the request
					// waits in the queue behind the held step past it.
					params = `"parameters":{"timeout":20000},`
				}
				return r.post("/v2/models/"+r.model+"/infer", "{"+params+lcSummaxBody+"}")
			},
		},
		{
			name: "OIP ModelInfer over gRPC", protocol: "grpc", model: "summax", grpc: true,
			// The stream's window (the message, no larger, is read into
			// it), charged before the call begins, and half a KiB: the
			// request's own charges (its decoded message, its footprint)
			// are refused.
			budgetRoom: lcWindow + 512,
			send: func(r *lcRequest) int {
				_, err := r.grpc.ModelInfer(r.grpcContext(), &pb.ModelInferRequest{ModelName: r.model,
					Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "x", Datatype: "FP32", Shape: []int64{1, 3},
						Contents: &pb.InferTensorContents{Fp32Contents: []float32{1, 2, 3}}}}})
				return r.grpcStatus(err)
			},
		},
		{
			name: "ModelStreamInfer over gRPC", protocol: "grpc", model: "tiny-llama", grpc: true, generative: true,
			// The stream's window, then its message as it is read and
			// decoded (under 2 KiB), before the call finds the model; the
			// generation's events (16 tokens' worth, 3 KiB) are refused.
			budgetRoom: lcWindow + 3<<10,
			send:       sendStream,
		},
		{
			name: "Triton generate over HTTP", protocol: "http", model: "tiny-llama", generative: true,
			without: map[lcKind]string{lcDeadline: noTimeout("Triton's generate")},
			// None: the route names the model, which is found before the
			// body is read (text.ServeOn), as OIP's infer finds it.
			budgetRoom: 0,
			send: func(r *lcRequest) int {
				return r.post("/v2/models/"+r.model+"/generate", fmt.Sprintf(
					`{"text_input":%q,"parameters":{"max_tokens":%d,"ignore_eos":true,"temperature":0}}`, lcPrompt, lcTokens))
			},
		},
		{
			name: "OpenAI completions", protocol: "openai", model: "tiny-llama", generative: true,
			without:    map[lcKind]string{lcDeadline: noTimeout("OpenAI's completions")},
			budgetRoom: 2 << 10,
			send: func(r *lcRequest) int {
				return r.post("/v1/completions", fmt.Sprintf(
					`{"model":%q,"prompt":%q,"max_tokens":%d,"ignore_eos":true,"temperature":0}`, r.model, lcPrompt, lcTokens))
			},
		},
		{
			name: "OpenAI responses", protocol: "openai", model: "tiny-llama", generative: true,
			without:    map[lcKind]string{lcDeadline: noTimeout("OpenAI's Responses API")},
			budgetRoom: 2 << 10,
			send: func(r *lcRequest) int {
				return r.post("/v1/responses", fmt.Sprintf(
					`{"model":%q,"input":%q,"max_output_tokens":%d,"temperature":0,"store":false}`, r.model, lcPrompt, lcTokens))
			},
		},
		{
			name: "Anthropic messages", protocol: "anthropic", model: "tiny-llama", generative: true,
			without:    map[lcKind]string{lcDeadline: noTimeout("Anthropic's Messages API")},
			budgetRoom: 2 << 10,
			send: func(r *lcRequest) int {
				return r.post("/v1/messages", fmt.Sprintf(
					`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":%q}],"temperature":0}`, r.model, lcTokens, lcPrompt))
			},
		},
		{
			name: "TGI generate", protocol: "tgi", model: "tiny-llama", generative: true, wire: tgiWire,
			without:    map[lcKind]string{lcDeadline: noTimeout("TGI's generate")},
			budgetRoom: 2 << 10,
			send: func(r *lcRequest) int {
				return r.post("/generate", fmt.Sprintf(
					`{"model":%q,"inputs":%q,"parameters":{"max_new_tokens":%d}}`, r.model, lcPrompt, lcTokens))
			},
		},
		{
			name: "OpenAI embeddings", protocol: "openai", model: "embedder", deadlineModel: "embedder-timeout",
			// The body, read before the model (named in it) is found; the
			// request's footprint (tiny-encoder's step, several KiB) is
			// refused.
			budgetRoom: 2 << 10,
			send: func(r *lcRequest) int {
				return r.post("/v1/embeddings", fmt.Sprintf(`{"model":%q,"input":%q}`, r.model, lcEmbedderText))
			},
		},
		{
			name: "TEI embed", protocol: "tei", model: "embedder", deadlineModel: "embedder-timeout", wire: teiWire,
			budgetRoom: 2 << 10,
			send: func(r *lcRequest) int {
				return r.post("/embed", fmt.Sprintf(`{"model":%q,"inputs":%q}`, r.model, lcEmbedderText))
			},
		},
	}
}

// sendStream sends one generation on a ModelStreamInfer stream and
// returns its status: 200 for a final response, an error response's
// code, or the stream's own.
func sendStream(r *lcRequest) int {
	stream, err := r.grpc.ModelStreamInfer(r.grpcContext())
	if err != nil {
		return r.grpcStatus(err)
	}
	prompt := binary.LittleEndian.AppendUint32(nil, uint32(len(lcPrompt)))
	req := &pb.ModelInferRequest{ModelName: r.model, Id: "lifecycle",
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "text_input", Datatype: "BYTES", Shape: []int64{1}}},
		RawInputContents: [][]byte{append(prompt, lcPrompt...)},
		Parameters: map[string]*pb.InferParameter{
			"max_tokens":  {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: lcTokens}},
			"ignore_eos":  {ParameterChoice: &pb.InferParameter_BoolParam{BoolParam: true}},
			"temperature": {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: 0}},
		}}
	// A send refused (the stream ended) leaves the stream's status to
	// Recv.
	if stream.Send(req) == nil {
		_ = stream.CloseSend()
	}
	got := 0
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			if got == 0 {
				r.t.Errorf("the stream ended with no final response")
			}
			return got
		}
		if err != nil {
			return r.grpcStatus(err)
		}
		if msg := resp.GetErrorMessage(); msg != "" {
			m := rpcErrorCode.FindStringSubmatch(msg)
			if m == nil {
				r.t.Errorf("an error response with no gRPC code: %q", msg)
				return 0
			}
			code, ok := codeNamed(m[1])
			if !ok {
				r.t.Errorf("an error response with an unknown gRPC code: %q", msg)
			}
			got = r.codeStatus(code, msg)
			continue
		}
		if resp.GetInferResponse().GetParameters()["triton_final_response"].GetBoolParam() {
			got = http.StatusOK
		}
	}
}
