package server

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/core"
	pb "github.com/stepserve/stepserve/server/inferencepb"
	"github.com/stepserve/stepserve/server/wire"
	"github.com/stepserve/stepserve/serving"
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
			// The body (text.Serve reads it before the model is found);
			// the generation's events (3 KiB) are refused.
			budgetRoom: 2 << 10,
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

// lcHold holds a model's steps, or fails them, as a row asks.
type lcHold struct {
	mu      sync.Mutex
	gate    chan struct{} // set: steps wait for it to close
	fail    error         // set: steps fail with it
	entered chan struct{} // a step that waits at the gate says so here
}

func newLCHold() *lcHold { return &lcHold{entered: make(chan struct{}, 64)} }

// step is a step's first move: wait while held, then fail if failing.
func (h *lcHold) step(ctx context.Context) error {
	h.mu.Lock()
	gate, fail := h.gate, h.fail
	h.mu.Unlock()
	if gate != nil {
		select {
		case h.entered <- struct{}{}:
		default:
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return fail
}

// hold holds the steps from now until release.
func (h *lcHold) hold() (release func()) {
	gate := make(chan struct{})
	h.mu.Lock()
	h.gate = gate
	for len(h.entered) > 0 {
		<-h.entered
	}
	h.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			h.gate = nil
			h.mu.Unlock()
			close(gate)
		})
	}
}

// waitEntered waits for a step to wait at the gate.
func (h *lcHold) waitEntered(t *testing.T, what string) {
	t.Helper()
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no step reached the held gate", what)
	}
}

// failSteps fails the steps with err until restore.
func (h *lcHold) failSteps(err error) (restore func()) {
	h.mu.Lock()
	h.fail = err
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		h.fail = nil
		h.mu.Unlock()
	}
}

// lcDecoders is the CPU engine, its decoders' steps under a hold.
type lcDecoders struct {
	cpufallback.Engine
	h *lcHold
}

func (e *lcDecoders) LoadDecoder(ctx context.Context, m *models.Model) (engine.Decoder, error) {
	d, err := e.Engine.LoadDecoder(ctx, m)
	if err != nil {
		return nil, err
	}
	return &lcDecoder{d, e.h}, nil
}

type lcDecoder struct {
	engine.Decoder
	h *lcHold
}

func (d *lcDecoder) Step(ctx context.Context, step *generation.Step) ([]generation.Sampled, error) {
	if err := d.h.step(ctx); err != nil {
		return nil, err
	}
	return d.Decoder.Step(ctx, step)
}

// lcWorld is the models every row's server serves: summax on the fake
// engine, tiny-llama on the CPU engine, and tiny-encoder's layout on the
// fake engine as "embedder" and as "embedder-timeout" (a queue deadline
// of 30ms), each engine's steps under a hold.
type lcWorld struct {
	set   *serving.Set
	reg   *prometheus.Registry // the set's: the batchers' queue depth
	stats *Server              // a plain server over the set: the statistics clients read
	holds map[string]*lcHold   // by model
}

func newLifecycleWorld(t *testing.T) *lcWorld {
	repo := t.TempDir()
	require.NoError(t, enginetest.WriteSumMax(filepath.Join(repo, "summax")))
	enginetest.CopyModel(t, "../model_repository/tiny-llama", filepath.Join(repo, "tiny-llama"), "")
	yaml, err := os.ReadFile("../model_repository/tiny-encoder/model.yaml")
	require.NoError(t, err)
	encoder := strings.Replace(string(yaml), "engine: cpu", "engine: torch", 1)
	require.NotEqual(t, string(yaml), encoder, "tiny-encoder's model.yaml names its engine")
	enginetest.CopyModel(t, "../model_repository/tiny-encoder", filepath.Join(repo, "embedder"), encoder)
	enginetest.CopyModel(t, "../model_repository/tiny-encoder", filepath.Join(repo, "embedder-timeout"),
		encoder+"\nbatching:\n  default_timeout: 30ms\n")

	tensor, encoders, gen := newLCHold(), newLCHold(), newLCHold()
	held := func(h *lcHold, f enginetest.StepFunc) enginetest.StepFunc {
		return func(l engine.Layout, in, out []byte) error {
			if err := h.step(context.Background()); err != nil {
				return err
			}
			return f(l, in, out)
		}
	}
	ones := func(_ engine.Layout, _, out []byte) error { // a pooled embedding of ones: any vector will do
		for i := 0; i+4 <= len(out); i += 4 {
			binary.LittleEndian.PutUint32(out[i:], math.Float32bits(1))
		}
		return nil
	}
	reg := prometheus.NewRegistry()
	batchMetrics, err := batching.NewMetrics(reg)
	require.NoError(t, err)
	set, err := serving.New(serving.Options{Repository: repo, DefaultEngine: "fake", BatchMetrics: batchMetrics, Engines: map[string]serving.Engine{
		"fake":  {Engine: &enginetest.Engine{Func: held(tensor, enginetest.SumMax)}},
		"torch": {Engine: &enginetest.Engine{Label: "torch", Func: held(encoders, ones)}},
		"cpu":   {Engine: &lcDecoders{h: gen}},
	}})
	require.NoError(t, err)
	t.Cleanup(func() { set.Close() })
	require.NoError(t, set.LoadAll(context.Background()))
	require.NoError(t, set.Warmup(context.Background()))
	stats, err := New(Options{Models: set, MaxInflightBytes: 64 << 20})
	require.NoError(t, err)
	return &lcWorld{set: set, reg: reg, stats: stats, holds: map[string]*lcHold{
		"summax": tensor, "embedder": encoders, "embedder-timeout": encoders, "tiny-llama": gen}}
}

// lcStat is a model's statistics' request counts.
type lcStat struct{ Success, Fail uint64 }

// statistics are every model's request counts, as GET /v2/models/stats
// answers them.
func (w *lcWorld) statistics(t *testing.T) map[string]lcStat {
	t.Helper()
	rec := do(t, w.stats, "GET", "/v2/models/stats", nil)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var body struct {
		ModelStats []struct {
			Name           string `json:"name"`
			InferenceStats struct {
				Success struct {
					Count uint64 `json:"count"`
				} `json:"success"`
				Fail struct {
					Count uint64 `json:"count"`
				} `json:"fail"`
			} `json:"inference_stats"`
		} `json:"model_stats"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	out := map[string]lcStat{}
	for _, m := range body.ModelStats {
		out[m.Name] = lcStat{m.InferenceStats.Success.Count, m.InferenceStats.Fail.Count}
	}
	require.Len(t, out, 4, "every model's statistics")
	return out
}

// queued is how many requests wait in model's queue.
func (w *lcWorld) queued(t *testing.T, model string) float64 {
	t.Helper()
	mfs, err := w.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "stepserve_queue_depth" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "model" && l.GetValue() == model {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// occupy runs a request on model straight on the model (no door: it is
// neither counted nor reported), its step held, so that the requests
// after it wait in the queue; release lets it end.
func (w *lcWorld) occupy(t *testing.T, model string) (release func()) {
	t.Helper()
	m, ok := w.set.Model(model)
	require.True(t, ok, model)
	body := `{` + lcSummaxBody + `}`
	if model != "summax" {
		body = fmt.Sprintf(`{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":[%q]}]}`, lcEmbedderText)
	}
	req, err := wire.DecodeRequest([]byte(body), -1, m.Model(), 1<<20)
	require.NoError(t, err)
	h := w.holds[model]
	open := h.hold()
	done := make(chan error, 1)
	go func() {
		_, _, err := m.Infer(context.Background(), req.ForModel())
		done <- err
	}()
	h.waitEntered(t, "the request occupying "+model)
	var once sync.Once
	return func() {
		once.Do(func() {
			open()
			select {
			case err := <-done:
				assert.NoError(t, err, "the request occupying %s", model)
			case <-time.After(10 * time.Second):
				t.Errorf("the request occupying %s did not end", model)
			}
		})
	}
}

// lcLine is a request log line (core.Core.LogRequest): written once a
// call ends (core.Call.End), after its metrics.
type lcLine struct {
	protocol, model string
	status          int
}

// lcLog keeps the request log lines a server writes.
type lcLog struct {
	mu    sync.Mutex
	lines []lcLine
}

func (l *lcLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *lcLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *lcLog) WithGroup(string) slog.Handler            { return l }

func (l *lcLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "request" {
		return nil
	}
	var line lcLine
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "protocol":
			line.protocol = a.Value.String()
		case "model":
			line.model = a.Value.String()
		case "status":
			line.status = int(a.Value.Int64())
		}
		return true
	})
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
	return nil
}

func (l *lcLog) written() []lcLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]lcLine(nil), l.lines...)
}

// requestCounts are the nonzero stepserve_requests_total series, as
// "model outcome protocol".
func requestCounts(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "stepserve_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetCounter().GetValue() == 0 {
				continue
			}
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out[labels["model"]+" "+labels["outcome"]+" "+labels["protocol"]] = m.GetCounter().GetValue()
		}
	}
	return out
}

// tracedStatuses are the statuses of the requests the tracer wrote, once
// it has written every trace it was taking.
func tracedStatuses(t *testing.T, tracer *trace.Tracer) []int {
	t.Helper()
	tracer.Close()
	files, err := tracer.Files().List()
	require.NoError(t, err)
	var out []int
	for _, fi := range files {
		f, _, err := tracer.Files().Open(fi.Name)
		require.NoError(t, err)
		var doc struct {
			TraceEvents []struct {
				Name string         `json:"name"`
				Args map[string]any `json:"args"`
			} `json:"traceEvents"`
		}
		err = json.NewDecoder(f).Decode(&doc)
		f.Close()
		require.NoError(t, err, fi.Name)
		for _, ev := range doc.TraceEvents {
			if ev.Name == "request" {
				st, _ := ev.Args["status"].(float64)
				out = append(out, int(st))
			}
		}
	}
	return out
}

const lcToken = "lifecycle-token-0123456789"

// lcBudget is a budget row's in-flight budget; lcWindow the flow-control
// window a gRPC stream charges of it as it opens (a 256th of it:
// grpcapi's window).
const (
	lcBudget = 1 << 20
	lcWindow = lcBudget / 256
)

// run sends d's request of outcome o to a fresh server and asserts what
// the lifecycle made of it.
func (w *lcWorld) run(t *testing.T, d lcDoor, o lcOutcome) {
	model := d.model
	if o.kind == lcDeadline && d.deadlineModel != "" {
		model = d.deadlineModel
	}
	named := model
	if o.kind == lcModelMissing {
		named = "nope"
	}

	// The server: its own metrics, log and tracer over the shared models.
	reg := prometheus.NewRegistry()
	log := &lcLog{}
	tracer := trace.New(trace.Options{Dir: t.TempDir()})
	t.Cleanup(tracer.Close)
	_, err := tracer.Update("", []byte(`{"trace_level":["TIMESTAMPS"]}`))
	require.NoError(t, err)
	opts := Options{Models: w.set, Version: "test", Registerer: reg, Gatherer: reg, Logger: slog.New(log),
		Tracer: tracer, MaxInflightBytes: 64 << 20}
	switch o.kind {
	case lcScopeRefused:
		opts.InferenceTokens = []string{lcToken}
	case lcBudgetRefused:
		// A small budget, and messages no larger than a gRPC stream's
		// window: what the doors take before the model is known is small
		// and known (lcDoor.budgetRoom).
		opts.MaxInflightBytes, opts.MaxBodyBytes = lcBudget, lcWindow
	}
	s, err := New(opts)
	require.NoError(t, err)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if o.kind == lcDeadline && d.grpc {
		ctx, cancel = context.WithTimeout(ctx, 250*time.Millisecond)
		defer cancel()
	}
	r := &lcRequest{t: t, kind: o.kind, ctx: ctx, url: srv.URL, http: srv.Client(), model: named}
	if d.grpc {
		r.grpc, _ = grpcClients(t, s)
	}
	if o.kind == lcScopeRefused {
		r.bearer = "not-" + lcToken
	}
	before := w.statistics(t)

	// The conditions of the outcome.
	h := w.holds[model]
	var release func()
	switch o.kind {
	case lcClientGone, lcDeadline:
		if d.generative {
			release = h.hold() // the generation's own step waits
		} else {
			release = w.occupy(t, model) // the request waits in the queue
		}
	case lcEngineFailure:
		release = h.failSteps(errors.New("device on fire"))
	case lcBudgetRefused:
		s.c.BudgetWait = 10 * time.Millisecond
		others := s.c.Budget.Limit() - d.budgetRoom
		require.True(t, s.c.Budget.TryTake(others), "other requests hold all but %d bytes", d.budgetRoom)
		release = func() { s.c.Budget.Give(others) }
	}
	if release != nil {
		defer release()
	}

	answered := make(chan int, 1)
	go func() { answered <- d.send(r) }()
	if o.kind == lcClientGone {
		// The client leaves once its request has reached the model: its
		// generation's step is held, or it waits in the queue.
		if d.generative {
			h.waitEntered(t, "the request")
		} else {
			require.Eventually(t, func() bool { return w.queued(t, model) == 1 }, 10*time.Second, time.Millisecond,
				"the request waits in %s's queue", model)
		}
		cancel()
	}
	var seen int
	select {
	case seen = <-answered:
	case <-time.After(20 * time.Second):
		t.Fatal("no answer")
	}

	// The request is over once its log line is written (core.Call.End
	// writes it after the metrics): a call that began writes one. A
	// client that gave up (or whose deadline passed) has its answer at
	// once; the server learns of it a moment later, and the held step is
	// let go only then: before, the request would still be running, and
	// answered by its step.
	wantLines := 0
	if o.began {
		wantLines = 1
	}
	ended := assert.Eventually(t, func() bool { return len(log.written()) >= wantLines }, 10*time.Second, time.Millisecond,
		"the request's log line (core.Call.End), status seen %d", seen)
	if release != nil {
		release()
	}
	if !ended {
		return
	}
	wantStatus := o.status
	wire := o.status
	if d.wire != nil && o.kind != lcClientGone {
		wire = d.wire(o.status)
	}
	assert.Equal(t, wire, seen, "the status the client saw")
	if lines := log.written(); o.began && assert.Len(t, lines, 1, "one request log line") {
		wantModel := model
		if o.kind == lcModelMissing {
			wantModel = "" // not found: the line names none
		}
		assert.Equal(t, lcLine{d.protocol, wantModel, wantStatus}, lines[0], "the request log line")
	} else if !o.began {
		assert.Empty(t, lines, "refused before the call began: no request log line")
	}

	// requests_total: the outcome once, under the model and protocol.
	want := map[string]float64{}
	if o.counted != "" {
		want[model+" "+o.counted+" "+d.protocol] = 1
	}
	assert.Equal(t, want, requestCounts(t, reg), "stepserve_requests_total")

	// The model's statistics: one success or failure, nothing else.
	wantStats := before
	if o.stats != "" {
		st := wantStats[model]
		if o.stats == "success" {
			st.Success++
		} else {
			st.Fail++
		}
		wantStats = map[string]lcStat{}
		for k, v := range before {
			wantStats[k] = v
		}
		wantStats[model] = st
	}
	assert.Equal(t, wantStats, w.statistics(t), "the models' statistics")

	// The budget: all given back (a gRPC response's charge once its RPC
	// ends, after the handler).
	assert.Eventually(t, func() bool { return s.c.Budget.InUse() == 0 }, 10*time.Second, time.Millisecond,
		"the in-flight budget is given back")

	// The trace: a request that ran in a step, with its status.
	if !d.generative {
		var wantTraced []int
		if o.stepped {
			wantTraced = []int{wantStatus}
		}
		assert.Equal(t, wantTraced, tracedStatuses(t, tracer), "the statuses traced")
	}

	// Nothing left running on the shared models for the next row.
	if d.generative {
		m, _ := w.set.Model("tiny-llama")
		require.Eventually(t, func() bool { return m.Generations() == 0 }, 10*time.Second, time.Millisecond, "no generation left")
	} else {
		require.Eventually(t, func() bool { return w.queued(t, model) == 0 }, 10*time.Second, time.Millisecond, "nothing queued")
	}
}
