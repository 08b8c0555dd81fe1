package batching

import (
	"context"
	"testing"

	"github.com/stepserve/stepserve/steps"
)

// nopRunner answers every batch at once.
type nopRunner struct{}

func (nopRunner) MaxBatch() int { return 8 }

func (nopRunner) Run(context.Context, []*steps.Request) error { return nil }

// BenchmarkSubmit measures the batcher's own cost per single-step request,
// with allocations: alone (the request finds the model idle and runs on its
// own goroutine) and from many goroutines (requests queue and are batched).
func BenchmarkSubmit(b *testing.B) {
	for _, bc := range []struct {
		name     string
		parallel bool
	}{{"idle", false}, {"queued", true}} {
		b.Run(bc.name, func(b *testing.B) {
			bt, err := New(nopRunner{}, Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer bt.Shutdown(context.Background())
			b.ReportAllocs()
			if !bc.parallel {
				r := req(1, 1)
				for b.Loop() {
					if err := bt.Submit(context.Background(), r, Params{}); err != nil {
						b.Fatal(err)
					}
				}
				return
			}
			b.SetParallelism(16)
			b.RunParallel(func(pb *testing.PB) {
				r := req(1, 1)
				for pb.Next() {
					if err := bt.Submit(context.Background(), r, Params{}); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
