package server

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

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
	var err error
	f.set, err = serving.New(serving.Options{Repository: f.repo, DefaultEngine: "fake",
		Engines: map[string]serving.Engine{"fake": {Engine: f.eng}}})
	require.NoError(tb, err)
	require.NoError(tb, f.set.LoadAll(context.Background()))
	require.NoError(tb, f.set.Warmup(context.Background()))
	tb.Cleanup(func() { f.set.Close() })
	return f
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
