package core

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/server/wire"
	"github.com/stepserve/stepserve/serving"
)

// A Call is one inference request's life in the server, the same
// whichever door brought it (OIP over HTTP or gRPC, gRPC's stream,
// Triton's generate, OpenAI's and TEI's APIs). A door decodes its wire
// form into the call's steps and encodes what they give; everything
// else happens here, once:
//
//   - [Core.Begin] starts the clock and an empty charge on the in-flight
//     budget; [Call.Read] reads an HTTP body within server.max_body_bytes
//     and [Call.Take] charges what a wire form will build before it is
//     built;
//   - [Call.Find] looks the model up (a name that is not served is
//     answered, not counted: counting it would let any client create
//     series) and [Call.Ready] refuses a model still loading;
//   - [Call.Infer] runs a tensor request (its footprint charged, shared
//     memory held, the trace stamped) and [Call.Generate] starts a
//     generation (what its events may hold charged until it ends);
//   - [Call.Succeed] and [Call.Fail] close the request: the model's
//     statistics, the error taxonomy's status (a client that gave up at
//     its deadline is a timeout, one that left is cancelled), a log line
//     for the server's own failures, and the door's error shape (the
//     sink given to Begin);
//   - [Call.End] records the trace's status, the request metrics and the
//     request's log line, and gives its charge back, or, after
//     [Call.HoldUntil], when a context ends (a gRPC response is written
//     after its handler returns).
//
// Cancellation is the request's context: a client that disconnects, or
// whose deadline passes, cancels every wait above (budget, queue, step,
// generation) through it. Scope (bearer tokens) is checked before a call
// begins, by the wrappers every route and RPC passes: [Bearer],
// [BearerAs] and the gRPC interceptors.
type Call struct {
	c            *Core
	ctx          context.Context
	protocol     int
	method, path string
	start        time.Time // arrival
	began        time.Time // body read: the model's statistics time from here
	charge       Charge
	model        *serving.Model
	sink         func(status int, err error)
	// An HTTP door's refusal writer and its response: a function and
	// the writer rather than a closure over it, so that a request
	// allocates no sink (BeginHTTP).
	w         http.ResponseWriter
	writeHTTP func(w http.ResponseWriter, status int, err error)
	// Info is what the request's log line says of it beyond its status:
	// the door sets its id, the steps its rows and trace.
	Info RequestInfo
	// Bytes is the request's size in its log line.
	Bytes    int64
	status   int
	reported bool            // the model's statistics have the request
	hold     context.Context // the charge is given back when it ends
}

// Begin starts a call for a request of protocol (one of the Protocol
// constants) that arrived as method and path (an RPC's full method for
// gRPC). sink writes a refusal in the door's shape; nil for a door that
// returns it instead (gRPC).
func (c *Core) Begin(ctx context.Context, protocol int, method, path string, sink func(status int, err error)) *Call {
	if protocol != ProtocolHTTP && protocol != ProtocolGRPC {
		// A text API's series appear with its first request: a server
		// whose clients never use it does not list them.
		c.served[protocol].Do(func() { c.Metrics.Serve(protocol) })
	}
	now := time.Now()
	return &Call{c: c, ctx: ctx, protocol: protocol, method: method, path: path, start: now, began: now,
		charge: c.Charge(), sink: sink, status: http.StatusOK}
}

// BeginHTTP is Begin for an HTTP request r, answered on w: writeError
// writes a refusal in the door's shape (a sink given with Sink takes its
// place, as a stream's error events do).
func (c *Core) BeginHTTP(w http.ResponseWriter, r *http.Request, protocol int, writeError func(w http.ResponseWriter, status int, err error)) *Call {
	k := c.Begin(r.Context(), protocol, r.Method, r.URL.Path, nil)
	k.w, k.writeHTTP = w, writeError
	return k
}

// Relabel counts the call under protocol, answering refusals with
// writeError, from now on: for a route that learns which API a request
// speaks from its body (POST /, which TEI and TGI share), before it runs
// anything.
func (k *Call) Relabel(protocol int, writeError func(w http.ResponseWriter, status int, err error)) {
	if protocol != ProtocolHTTP && protocol != ProtocolGRPC {
		k.c.served[protocol].Do(func() { k.c.Metrics.Serve(protocol) })
	}
	k.protocol, k.writeHTTP = protocol, writeError
}

// Context is the request's context: its client's, cancelled when the
// client leaves or its deadline passes.
func (k *Call) Context() context.Context { return k.ctx }

// Core is the core the call runs in.
func (k *Call) Core() *Core { return k.c }

// Model is the model the request runs on; nil until it is found.
func (k *Call) Model() *serving.Model { return k.model }

// Status is the status the call ended with (so far 200).
func (k *Call) Status() int { return k.status }

// Find looks up the model a request names, by name and, when v is not
// empty, version; the call runs on it from here.
func (k *Call) Find(name, v string) (*serving.Model, error) {
	m, err := k.c.Lookup(name, v)
	if err != nil {
		return nil, err
	}
	k.model = m
	return m, nil
}

// Use has the call run on m, which the door chose itself (TEI's requests
// that name no model go to the only one of their kind).
func (k *Call) Use(m *serving.Model) { k.model = m }

// Ready refuses a model that has not loaded, or is loading again.
func (k *Call) Ready() error {
	if !k.model.Ready() {
		return NotReady(k.model.Model().Name)
	}
	return nil
}

// Read reads an HTTP request's whole body within server.max_body_bytes,
// charged as it arrives. The model's statistics time the request from
// when it has arrived (a slow upload is the client's), and a reload that
// replaced the model meanwhile has the request go to the version served
// now.
func (k *Call) Read(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	k.Bytes = r.ContentLength
	body, err := k.c.ReadBody(w, r, &k.charge)
	if err != nil {
		return nil, err
	}
	k.began = time.Now()
	if k.model != nil {
		k.model = k.model.Current()
	}
	return body, nil
}

// Arrived marks the request as arrived whole (a gRPC message), for the
// model's statistics.
func (k *Call) Arrived() { k.began = time.Now() }

// Take charges n bytes, what the request is about to build, to the
// in-flight budget, waiting briefly for what others hold; what names
// them in a refusal.
func (k *Call) Take(n int64, what string) error { return k.charge.Take(k.ctx, n, what) }

// Shrink gives back what the call's charge holds beyond n bytes.
func (k *Call) Shrink(n int64) { k.charge.Shrink(n) }

// Adopt makes ch, taken before the call began (a gRPC stream's message,
// charged as it was read), the call's; ch is left empty.
func (k *Call) Adopt(ch *Charge) {
	k.charge.held += ch.held
	ch.held = 0
}

// Trace is the request's trace: sampled once its model is known, nil
// unless the trace extension samples it (one atomic load while tracing
// is off).
func (k *Call) Trace() *trace.Request {
	if k.Info.Trace == nil && k.model != nil {
		k.Info.Trace = k.c.Opts.Tracer.Sample(k.model.Model().Name)
	}
	return k.Info.Trace
}

// Infer runs a checked request on the call's model, its footprint f
// charged first (see [Core.run]); the model becomes the one that ran it,
// a reload's successor if one replaced it.
func (k *Call) Infer(req *wire.InferRequest, f wire.Footprint) (*serving.Result, error) {
	if tr := k.Trace(); tr != nil {
		req.Trace, tr.ID, tr.Rows = tr, req.ID, req.Rows
	}
	k.Info.Rows = req.Rows
	if k.Info.ID == "" {
		k.Info.ID = req.ID
	}
	m, res, err := k.c.run(k.ctx, &k.charge, k.model, req, f)
	k.model = m
	return res, err
}

// Generate starts gr on the call's model, and charges what its events
// may hold while they wait for the client, until the call ends. The
// caller closes the stream.
func (k *Call) Generate(gr *serving.GenerateRequest) (*serving.TextStream, error) {
	k.Info.Rows = 1
	ts, err := k.model.Generate(k.ctx, gr)
	if err != nil {
		return nil, err
	}
	if err := k.charge.Take(k.ctx, ts.MaxHeld(), "the generation's output"); err != nil {
		ts.Close()
		return nil, err
	}
	return ts, nil
}

// Succeed records an answered request in its model's statistics, with
// res when a step ran it (nil for a generation), and returns 200. A
// request that ran no step on a model that does not generate (TEI's
// /tokenize, /decode) is no inference: the statistics do not count it.
func (k *Call) Succeed(res *serving.Result) int {
	k.status = http.StatusOK
	if res == nil && k.model != nil && !k.model.Generative() {
		k.reported = true
	}
	if k.model != nil && !k.reported {
		k.reported = true
		k.model.Report(res, true, time.Since(k.began))
	}
	return k.status
}

// NotInference marks a request that runs nothing on its model (a token
// count): the model's statistics do not count it.
func (k *Call) NotInference() { k.reported = true }

// deadlineSlack is how close to its deadline a request cancelled by its
// client counts as timed out rather than cancelled: a client cancels its
// call at its deadline, which arrives before the server's own copy of the
// deadline (gRPC's grpc-timeout, counted from a moment later) passes.
const deadlineSlack = 20 * time.Millisecond

// Fail closes a refused or failed request: its status from the error
// taxonomy ([StatusOf]; a client that gave up at its deadline is 504),
// a failure in its model's statistics, a log line (at error for the
// server's own failures only: a line per bad or cancelled request would
// let any client flood the log), and the refusal written by the sink.
// It returns the status.
func (k *Call) Fail(err error) int { return k.fail(err, true) }

// fail is Fail, writing the refusal when write is set.
func (k *Call) fail(err error, write bool) int {
	st := StatusOf(err)
	if st == StatusClientClosed {
		if dl, ok := k.ctx.Deadline(); ok && time.Until(dl) < deadlineSlack {
			st = http.StatusGatewayTimeout
		}
	}
	k.status = st
	name := ""
	if k.model != nil {
		name = k.model.Model().Name
		if !k.reported {
			k.reported = true
			k.model.Report(nil, false, time.Since(k.began))
		}
	}
	level := slog.LevelDebug
	if st >= 500 && st != http.StatusServiceUnavailable && st != http.StatusGatewayTimeout {
		level = slog.LevelError
	}
	if k.c.Logger.Enabled(k.ctx, level) { // no arguments boxed for a line nobody logs
		k.c.Logger.Log(k.ctx, level, "inference failed", "protocol", ProtocolLabels[k.protocol], "model", name, "status", st, "err", err)
	}
	switch {
	case !write:
	case k.sink != nil:
		k.sink(st, err)
	case k.writeHTTP != nil:
		k.writeHTTP(k.w, st, err)
	}
	return st
}

// Gone closes a request whose client left while its answer was being
// written (a stream cut short): cancelled, nothing more written.
func (k *Call) Gone() int { return k.fail(context.Canceled, false) }

// Sink replaces the call's error writer: a stream that has begun writes
// its errors as events of its own.
func (k *Call) Sink(sink func(status int, err error)) { k.sink = sink }

// HoldUntil keeps the call's charge past End, until ctx ends: gRPC writes
// a unary response after its handler returns.
func (k *Call) HoldUntil(ctx context.Context) { k.hold = ctx }

// End ends the call: its trace records its status (its response is
// written), the request metrics count it under its model (when one was
// found), its log line is written, and its charge is given back.
func (k *Call) End() {
	k.Info.Trace.Done(k.status)
	took := time.Since(k.start)
	name := ""
	if k.model != nil {
		name = k.model.Model().Name
		k.c.Metrics.Observe(k.protocol, name, k.status, took)
	}
	k.c.LogRequest(k.ctx, k.protocol, k.method, k.path, name, k.status, k.Info, k.Bytes, took)
	if k.hold != nil {
		ch := k.charge
		k.charge.held = 0
		context.AfterFunc(k.hold, ch.Release)
		return
	}
	k.charge.Release()
}
