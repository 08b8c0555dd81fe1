package serving

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/internal/trace"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/steps"
)

// The errors a request may meet on its way through a model, for the
// protocols to map to their statuses ([errors.Is] matches them).
var (
	// ErrQueueFull: the model's queue is at max_queue_size.
	ErrQueueFull = batching.ErrQueueFull
	// ErrDraining: the model stopped taking requests (an unload, a reload
	// to another signature, shutdown).
	ErrDraining = batching.ErrDraining
	// ErrDeadline: the request's timeout passed before it ran.
	ErrDeadline = batching.ErrDeadline
	// ErrBadParameter: a request parameter the model cannot take.
	ErrBadParameter = batching.ErrBadParameter
	// ErrUnavailable: the model's device cannot run steps now.
	ErrUnavailable = engine.ErrUnavailable
	// ErrNoTraffic: bucket advice asked of a model that has served none.
	ErrNoTraffic = bucketing.ErrNoTraffic
)

// What a model reports of its steps, for the protocols that show them.
type (
	// Record is one step that was not clean, as explain saw it.
	Record = steps.Record
	// BucketStats summarises one bucket's steps.
	BucketStats = steps.BucketStats
	// Advice is bucket advice from the traffic served.
	Advice = bucketing.Advice
)

// Params are a request's scheduling parameters, whichever protocol it came
// by.
type Params struct {
	// Priority is the level, 1 the highest; 0, or a level the model does
	// not have, means the default.
	Priority int
	// Timeout lowers the model's default timeout; 0 means the default.
	Timeout time.Duration
}

// Request is one inference request, decoded: its rows, one input per model
// input in model order (an optional input left out is the zero Input), its
// parameters and its trace (nil unless tracing sampled it).
type Request struct {
	Rows   int
	Inputs []models.Input
	Params Params
	Trace  *trace.Request
}

// Result is what a request ran to.
type Result struct {
	// Outputs holds one buffer per model output, in model order: Rows
	// rows of the output's row bytes at Seq.
	Outputs [][]byte
	// Rows is the request's rows; Seq the sequence length it ran at (0
	// for a model without one).
	Rows, Seq int

	step    *steps.Request
	encoder bool
}

// Tokens counts the tokens an encoder request ran (its attention masks'
// ones); 0 for other architectures.
func (r *Result) Tokens() int {
	if r == nil || !r.encoder || r.step == nil || len(r.step.Inputs) <= models.EncoderAttentionMask {
		return 0
	}
	mask := r.step.Inputs[models.EncoderAttentionMask]
	n := 0
	for i := 0; i+8 <= len(mask); i += 8 {
		if binary.LittleEndian.Uint64(mask[i:]) != 0 {
			n++
		}
	}
	return n
}

// Infer runs req on the model: it prepares the step inputs, queues them and
// waits for the outputs. A request that meets the model being replaced by
// a reload (it stopped taking requests between the caller's lookup and the
// queue) runs on its successor, when the successor has the same inputs
// and outputs. Infer returns the model that ran the request, which the
// caller reports to ([Model.Report]).
func (m *Model) Infer(ctx context.Context, req *Request) (*Model, *Result, error) {
	res, err := m.infer(ctx, req)
	if errors.Is(err, batching.ErrDraining) {
		if cur := m.Current(); cur != m && sameSignature(cur.model, m.model) {
			m = cur
			res, err = m.infer(ctx, req)
		}
	}
	return m, res, err
}

func (m *Model) infer(ctx context.Context, req *Request) (*Result, error) {
	if m.gen != nil {
		name := m.model.Name
		return nil, fmt.Errorf("model %s is a language model: use /v2/models/%s/generate, /v1/completions or /v1/chat/completions (%w)", name, name, ErrNotGenerative)
	}
	res, err := prepare(m.model, req)
	if err != nil {
		return nil, err
	}
	req.Trace.Stamp(trace.Prepared)
	res.step.Trace = req.Trace
	return res, m.submit(ctx, res.step, batching.Params(req.Params))
}

// submit queues a step request and waits for its outputs.
func (m *Model) submit(ctx context.Context, r *steps.Request, p batching.Params) error {
	return m.batcher.Submit(ctx, r, p)
}

// Current is the model served now under m's name and version: m, unless a
// reload replaced it.
func (m *Model) Current() *Model {
	if m.set == nil {
		return m
	}
	cur, ok := m.set.Model(m.model.Name)
	if !ok || cur == m || cur.model.Version != m.model.Version {
		return m
	}
	return cur
}

// sameSignature reports whether a request decoded for a's inputs and
// outputs fits b.
func sameSignature(a, b *models.Model) bool {
	return slices.EqualFunc(a.Config.Inputs, b.Config.Inputs, models.TensorSpec.Equal) &&
		slices.EqualFunc(a.Config.Outputs, b.Config.Outputs, models.TensorSpec.Equal)
}

// prepare builds the step request: the model prepares its step inputs from
// the decoded inputs, and every output gets room in one buffer.
func prepare(m *models.Model, req *Request) (*Result, error) {
	// The result, its step request and the usual few buffer headers in
	// one allocation.
	bundle := new(struct {
		res          Result
		sr           steps.Request
		inputs, outs [3][]byte
	})
	res, sr := &bundle.res, &bundle.sr
	res.step, res.encoder = sr, m.Config.Architecture == "encoder"
	sr.Rows = req.Rows
	var err error
	if sr.Inputs, sr.Seq, err = m.PrepareInputs(bundle.inputs[:0], req.Inputs); err != nil {
		return nil, err
	}
	for _, t := range req.Inputs {
		if n, ok := models.ShapeElements(t.Shape); ok {
			sr.Elements += int(n)
		}
	}
	outputs := m.Config.Outputs
	sr.Outputs = bundle.outs[:0]
	if len(outputs) > len(bundle.outs) {
		sr.Outputs = make([][]byte, 0, len(outputs))
	}
	total := 0
	for _, o := range outputs {
		total += req.Rows * o.RowBytes(sr.Seq)
	}
	outs := make([]byte, total)
	for _, o := range outputs {
		n := req.Rows * o.RowBytes(sr.Seq)
		sr.Outputs = append(sr.Outputs, outs[:n:n])
		outs = outs[n:]
	}
	res.Outputs, res.Rows, res.Seq = sr.Outputs, sr.Rows, sr.Seq
	return res, nil
}
