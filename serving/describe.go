package serving

import (
	"context"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/steps"
)

// backend is what serves a model's requests on its engine, and what it
// reports of itself (its devices, replicas, programs and steps): a program
// and a runner per replica behind a batcher, with the failover engine's,
// or a language model's generation loop. A [Model] embeds it: the rest of
// the model is its lifetime (load, warm-up, readiness, drain) and its
// requests.
type backend struct {
	engine   string // the engine's name
	program  engine.Program
	runners  []*steps.Runner // one per replica; they share stats and explains
	replicas *replicas
	minReady int
	fbProg   engine.Program // the failover engine's, when there is one
	fallback *steps.Runner
	fbEngine string // the failover engine's name, when there is one
	batcher  *batching.Batcher

	// gen is a language model's loop (architecture decoder); nil for
	// the others, which program, runners and batcher serve.
	gen *generator
}

// Backend is what a model's endpoints report of its backend beyond
// model.yaml: how the server placed and batches it, and what it
// compiled and ran ([Model.Backend]).
type Backend struct{ b *backend }

// Backend reports on what serves the model's requests.
func (m *Model) Backend() Backend { return Backend{&m.backend} }

// Policy is the batching policy the model is served with: the server's
// defaults with model.yaml's batching keys over them.
func (v Backend) Policy() batching.Policy {
	b := v.b
	if b.gen != nil {
		return batching.Policy{}
	}
	return b.batcher.Policy()
}

// Devices names the device of each of the model's replicas on its own
// engine, in replica order (a device appears once per replica on it).
func (v Backend) Devices() []string {
	b := v.b
	if b.gen != nil {
		return []string{b.engine}
	}
	out := make([]string, len(b.runners))
	for i, r := range b.runners {
		out[i] = r.Device()
	}
	return out
}

// Failover is the engine that serves the model while none of its
// replicas is healthy, and the device of its one replica there; empty
// when it has none.
func (v Backend) Failover() (engine, device string) {
	b := v.b
	if b.fallback == nil {
		return "", ""
	}
	return b.fbEngine, b.fallback.Device()
}

// ProgramReport is one compiled program's report (engine's), as
// GET /v2/models/{model}/explain lists it: the doors read it from here,
// not from the engine.
type ProgramReport = engine.ProgramReport

// Replicas counts the model's replicas on its engine, and those healthy
// now.
func (v Backend) Replicas() (total, healthy int) {
	b := v.b
	if b.gen != nil {
		return 1, 1
	}
	return len(b.runners), b.replicas.Healthy()
}

// Explains lists the model's last non-clean steps, newest first, on any
// replica.
func (v Backend) Explains() []Record {
	b := v.b
	if b.gen != nil {
		return nil
	}
	return b.runners[0].Explains()
}

// Programs reports the model's compiled step programs, one per bucket
// (per replica, and per kind for a language model's prefill and decode
// buckets); nil where its engine reports none.
func (v Backend) Programs(ctx context.Context) []ProgramReport {
	b := v.b
	var src any = b.program
	if b.gen != nil {
		src = b.gen.dec
	}
	if r, ok := src.(engine.ProgramReporter); ok {
		return r.Programs(ctx)
	}
	return nil
}

// Stats summarises the model's steps per bucket since load, every
// replica's.
func (v Backend) Stats() []BucketStats {
	b := v.b
	if b.gen != nil {
		return nil
	}
	return b.runners[0].Stats()
}
