package rbln

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/generation"
	"github.com/stepserve/stepserve/models"
)

// BenchmarkCompiledVsEager steps digits-cnn (batch 1 and 32) and
// tiny-encoder (batch 1 and 32, 64 tokens) on the torch engine in the
// torch 2.x root, compiled with inductor and eager, in one run: the
// step's body (the worker's copy in, graph, copy out) in body-µs/step,
// and the round trip through the server's step. Compare the inductor and
// off lines of one run, never across runs.
//
//	TORCH2_PYTHON=$PWD/engine/rbln/worker/torch2/python go test ./engine/rbln -run '^$' -bench CompiledVsEager
func BenchmarkCompiledVsEager(b *testing.B) {
	python := torch2(b)
	for _, tc := range []struct {
		model string
		seq   int
	}{{"digits-cnn", 0}, {"tiny-encoder", 64}} {
		m, err := models.Load("../../model_repository/" + tc.model)
		require.NoError(b, err)
		m.Config.Engine = "torch"
		for _, batch := range []int{1, 32} {
			for _, mode := range []string{"inductor", "off"} {
				e, err := New(Options{Device: DeviceCPU, Python: python, TorchCompile: mode, StrictWarmup: true})
				require.NoError(b, err)
				shape := bucketing.Shape{Batch: batch, Seq: tc.seq}
				prog, err := e.Load(context.Background(), m, []bucketing.Shape{shape})
				require.NoError(b, err)
				require.NoError(b, prog.Compile(context.Background(), 0))
				for range 3 {
					_, err := prog.Step(context.Background(), 0)
					require.NoError(b, err)
				}
				b.Run(fmt.Sprintf("%s/%s/%s", tc.model, shape.Label(), mode), func(b *testing.B) {
					body0 := prog.(*program).bodyNS.Load()
					n := 0
					for b.Loop() {
						if _, err := prog.Step(context.Background(), 0); err != nil {
							b.Fatal(err)
						}
						n++
					}
					b.ReportMetric(float64(prog.(*program).bodyNS.Load()-body0)/1e3/float64(n), "body-µs/step")
				})
				if r := prog.(engine.ProgramReporter).Programs(context.Background()); len(r) == 1 && r[0].CompileSeconds != nil {
					b.Logf("%s %s %s: compiled in %.2f s", tc.model, shape.Label(), mode, *r[0].CompileSeconds)
				}
				prog.Close()
				e.Close()
			}
		}
	}
}

// BenchmarkCompiledDecoder generates with tiny-llama on the torch engine
// in the torch 2.x root, compiled with inductor and eager, in one run:
// decode tokens/s of one sequence and of 16 together (compiled against
// eager), and decode time per token at a context of about 64 tokens with
// max_model_len 1024 against 128 (compiled): a decode step reads its
// context partition, not max_model_len. Compare lines of one run.
//
//	TORCH2_PYTHON=$PWD/engine/rbln/worker/torch2/python go test ./engine/rbln -run '^$' -bench CompiledDecoder -benchtime 3x
func BenchmarkCompiledDecoder(b *testing.B) {
	python := torch2(b)
	for _, tc := range []struct {
		name, mode string
		maxLen     int
	}{{"inductor/len1024", "inductor", 1024}, {"eager/len1024", "off", 1024}, {"inductor/len128", "inductor", 128}} {
		dir := enginetest.WriteDecoder(b, enginetest.DecoderShapes["llama"], 11, fmt.Sprintf(
			"engine: torch\nbuckets:\n  batch: [1, 16]\n  seq: [64]\ngeneration:\n  max_model_len: %d\n  max_num_seqs: 16\n  max_batch_tokens: 64\n  max_tokens: 32\n", tc.maxLen))
		m, err := models.Load(dir)
		require.NoError(b, err)
		e, err := New(Options{Device: DeviceCPU, Python: python, TorchCompile: tc.mode, StrictWarmup: true, StallTimeout: time.Minute})
		require.NoError(b, err)
		dec, err := e.LoadDecoder(context.Background(), m)
		require.NoError(b, err)
		if r, ok := dec.(engine.ProgramReporter); ok && tc.mode != "off" {
			total := 0.0
			for _, p := range r.Programs(context.Background()) {
				if p.CompileSeconds != nil {
					total += *p.CompileSeconds
				}
			}
			b.Logf("%s: %d programs compiled in %.1f s", tc.name, len(r.Programs(context.Background())), total)
		}
		loop := enginetest.StartLoop(b, dec, m)
		for _, streams := range []int{1, 16} {
			if tc.maxLen == 128 && streams > 1 {
				continue
			}
			// Prompts of 56 tokens and 16 new: decode runs at contexts of
			// 57 to 72 tokens.
			prompts := make([][]int32, streams)
			for i := range prompts {
				prompts[i] = enginetest.Prompts(56 + i)[0][i : 56+i]
			}
			b.Run(fmt.Sprintf("%s/streams%d", tc.name, streams), func(b *testing.B) {
				var decodeTime time.Duration
				tokens := 0
				for b.Loop() {
					d, n := timedDecode(b, loop, prompts, 16)
					decodeTime += d
					tokens += n
				}
				b.ReportMetric(float64(tokens)/decodeTime.Seconds(), "decode-tok/s")
				b.ReportMetric(decodeTime.Seconds()*1e3/float64(tokens)*float64(streams), "ms/token")
			})
		}
		dec.Close()
		e.Close()
	}
}

// timedDecode generates max tokens for every prompt at once and returns
// the time from the moment every stream has its first token (all prompts
// prefilled) to the last token, and the tokens generated in it.
func timedDecode(b *testing.B, loop *generation.Loop, prompts [][]int32, max int) (time.Duration, int) {
	times := make([][]time.Time, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		st, err := loop.Generate(context.Background(), generation.Request{Prompt: p, MaxTokens: max, Sampling: generation.Sampling{Logprobs: -1}})
		require.NoError(b, err)
		wg.Go(func() {
			for {
				ev, ok := st.Next(context.Background())
				if !ok || ev.Err != nil || ev.Last() {
					return
				}
				times[i] = append(times[i], time.Now())
			}
		})
	}
	wg.Wait()
	var start, end time.Time
	for _, ts := range times {
		require.NotEmpty(b, ts)
		if ts[0].After(start) {
			start = ts[0]
		}
		if ts[len(ts)-1].After(end) {
			end = ts[len(ts)-1]
		}
	}
	tokens := 0
	for _, ts := range times {
		for _, at := range ts {
			if at.After(start) {
				tokens++
			}
		}
	}
	return end.Sub(start), tokens
}
