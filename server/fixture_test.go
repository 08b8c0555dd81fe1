package server

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/serving"
)

// fixture is a live model set serving summax ([enginetest.SumMaxYAML]) on
// the fake engine, warmed up.
type fixture struct {
	repo string
	set  *serving.Set
	eng  *enginetest.Engine
}

func newSumMax(tb testing.TB) *fixture {
	tb.Helper()
	f := &fixture{repo: tb.TempDir(), eng: &enginetest.Engine{Func: enginetest.SumMax}}
	require.NoError(tb, enginetest.WriteSumMax(filepath.Join(f.repo, "summax")))
	f.set = liveSet(tb, f.repo, f.eng)
	return f
}

// liveSet is a model set over repo on the fake engine eng, every model
// loaded and warmed up, closed when the test ends.
func liveSet(tb testing.TB, repo string, eng *enginetest.Engine) *serving.Set {
	tb.Helper()
	set, err := serving.New(serving.Options{Repository: repo, DefaultEngine: "fake",
		Engines: map[string]serving.Engine{"fake": {Engine: eng}}})
	require.NoError(tb, err)
	tb.Cleanup(func() { set.Close() })
	require.NoError(tb, set.LoadAll(context.Background()))
	require.NoError(tb, set.Warmup(context.Background()))
	return set
}

// gatedSumMax serves summax on an engine whose steps wait while the
// returned gate is set.
func gatedSumMax(tb testing.TB) (*serving.Set, *enginetest.Engine, *atomic.Pointer[chan struct{}]) {
	var gate atomic.Pointer[chan struct{}]
	eng := &enginetest.Engine{Func: func(l engine.Layout, in, out []byte) error {
		if g := gate.Load(); g != nil {
			<-*g
		}
		return enginetest.SumMax(l, in, out)
	}}
	repo := tb.TempDir()
	require.NoError(tb, enginetest.WriteSumMax(filepath.Join(repo, "summax")))
	return liveSet(tb, repo, eng), eng, &gate
}

// program is the engine program summax runs on now.
func (f *fixture) program() *enginetest.Program { return f.eng.Last() }

// steps counts the steps summax ran after its warm-up.
func (f *fixture) steps() int { return f.program().Steps() - 2*2 }

func newTestServer(t *testing.T, f *fixture) (*Server, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	s, err := New(Options{Models: f.set, MaxBodyBytes: 4096, Version: "test", Registerer: reg, Gatherer: reg})
	require.NoError(t, err)
	return s, reg
}
