package server

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/server/wire"
	"github.com/stepserve/stepserve/serving"
)

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
