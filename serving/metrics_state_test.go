package serving

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/generation"
)

// TestStateGaugesScrapeTogether: a step sets the scheduler's state gauges
// (stepserve's and vLLM's names) together, and a scrape reads them
// together: however the two interleave, every scrape shows one step.
func TestStateGaugesScrapeTogether(t *testing.T) {
	m, err := newMetrics(nil, nil, true)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.gen.collectors()...)
	s := m.generation("lm", 16, 100)
	// The first step is observed before the first scrape: before any
	// step, every gauge reads zero, which is not a state the loop sets.
	s.observe(&generation.Step{}, 0, generation.State{Waiting: 50, BlocksFree: 100, BlocksTotal: 100})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := i % 50
			s.observe(&generation.Step{}, 0, generation.State{Running: k, Waiting: 50 - k, BlocksFree: 100 - 2*k, BlocksTotal: 100})
		}
	})
	defer func() { close(stop); wg.Wait() }()
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		families, err := reg.Gather()
		require.NoError(t, err)
		v := map[string]float64{}
		for _, f := range families {
			for _, mt := range f.GetMetric() {
				key := f.GetName()
				for _, l := range mt.GetLabel() {
					if l.GetName() == "state" {
						key += "/" + l.GetValue()
					}
				}
				v[key] = mt.GetGauge().GetValue()
			}
		}
		k := v["stepserve_generation_sequences/running"]
		require.Equal(t, 50-k, v["stepserve_generation_sequences/waiting"])
		require.Equal(t, k, v["vllm:num_requests_running"])
		require.Equal(t, 50-k, v["vllm:num_requests_waiting"])
		require.Equal(t, 2*k, v["stepserve_generation_kv_cache_blocks/used"])
		require.Equal(t, 2*k/100, v["vllm:kv_cache_usage_perc"])
	}
}
