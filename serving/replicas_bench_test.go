package serving

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/steps"
)

// BenchmarkReplicas serves one model from 16 concurrent callers as one
// replica and as two, in the same run, and reports requests per second:
// on the fake engine with a step of 2ms of device time (the host idle
// meanwhile, as on an NPU), and on the CPU engine with the shipped
// tiny-encoder (one 32-token sequence a request), whose steps compete for
// this machine's cores.
func BenchmarkReplicas(b *testing.B) {
	for _, tc := range []struct {
		name, model, engine string
		threads             int
	}{
		{"fake-2ms", "summax", "dev", 0},
		{"cpu-encoder-threads1", "tiny-encoder", "cpu", 1},
		{"cpu-encoder-threads2", "tiny-encoder", "cpu", 2},
	} {
		for _, replicas := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/replicas=%d", tc.name, replicas), func(b *testing.B) {
				if tc.threads > 0 {
					defer cpufallback.SetThreads(cpufallback.SetThreads(tc.threads) * 0)
				}
				m, request := benchModel(b, tc.model, tc.engine, replicas)
				b.SetParallelism(8) // 16 callers on 2 CPUs
				b.ResetTimer()
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := m.submit(context.Background(), request(), batching.Params{}); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
			})
		}
	}
}

// benchModel serves model on engine as replicas replicas (per_device on
// the engine's one device), warmed up, and returns it with a maker of
// one-row requests.
func benchModel(b *testing.B, model, eng string, replicas int) (*Model, func() *steps.Request) {
	repo := b.TempDir()
	dir := filepath.Join(repo, model)
	instances := fmt.Sprintf("instances: {per_device: %d}\n", replicas)
	var request func() *steps.Request
	if model == "summax" {
		require.NoError(b, enginetest.WriteSumMax(dir))
		require.NoError(b, os.WriteFile(filepath.Join(dir, "model.yaml"), []byte(enginetest.SumMaxYAML+instances), 0o644))
		request = func() *steps.Request {
			return &steps.Request{Rows: 1, Inputs: [][]byte{make([]byte, 12)}, Outputs: [][]byte{make([]byte, 8)}}
		}
	} else {
		require.NoError(b, os.MkdirAll(dir, 0o755))
		for _, f := range []string{"model.yaml", "weights.safetensors", "vocab.txt"} {
			data, err := os.ReadFile(filepath.Join("../model_repository", model, f))
			require.NoError(b, err)
			if f == "model.yaml" {
				data = []byte(strings.Replace(string(data), "engine: cpu", "engine: "+eng, 1) + instances)
			}
			require.NoError(b, os.WriteFile(filepath.Join(dir, f), data, 0o644))
		}
		const seq = 32
		request = func() *steps.Request {
			ids, mask := make([]byte, 8*seq), make([]byte, 8*seq)
			for i := range seq {
				binary.LittleEndian.PutUint64(ids[8*i:], uint64(1+(i*37)%1000))
				binary.LittleEndian.PutUint64(mask[8*i:], 1)
			}
			return &steps.Request{Rows: 1, Seq: seq, Inputs: [][]byte{ids, mask, make([]byte, 8*seq)}, Outputs: [][]byte{make([]byte, 128*4)}}
		}
	}
	dev := &enginetest.Engine{Label: "dev", Func: func(l engine.Layout, in, out []byte) error {
		time.Sleep(2 * time.Millisecond) // the device's time: the host is free meanwhile
		return enginetest.SumMax(l, in, out)
	}}
	set, err := New(Options{Repository: repo, DefaultEngine: eng,
		Engines: map[string]Engine{"dev": {Engine: dev}, "cpu": {Engine: cpufallback.Engine{}}}})
	require.NoError(b, err)
	b.Cleanup(func() { set.Close() })
	require.NoError(b, set.LoadAll(context.Background()))
	require.NoError(b, set.Warmup(context.Background()))
	m, ok := set.Model(model)
	require.True(b, ok)
	total, _ := m.Backend().Replicas()
	require.Equal(b, replicas, total)
	return m, request
}
