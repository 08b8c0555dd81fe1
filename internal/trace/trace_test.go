package trace

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// traceSteps traces n steps of one request each on model m, the worker's
// events (if any) in each step's profile.
func traceSteps(t *testing.T, tr *Tracer, n int, worker string) {
	for range n {
		r := tr.Sample("m")
		require.NotNil(t, r)
		r.Stamp(Decoded)
		r.Stamp(Prepared)
		r.Stamp(Enqueued)
		r.Stamp(Batched)
		st := r.BeginStep()
		require.NotNil(t, st)
		st.Start = time.Now()
		st.InferStart = st.Start.Add(time.Microsecond)
		st.InferEnd = st.InferStart.Add(time.Millisecond)
		st.End = st.InferEnd.Add(time.Microsecond)
		if worker != "" {
			require.NoError(t, st.Profile.SetWorker("torch worker", json.RawMessage(worker), 0, []string{"CPU"}, AnchorPrefix))
		}
		r.Attach(st)
		st.Finish()
		r.Done(200)
	}
}

func read(t *testing.T, tr *Tracer, name string) map[string]any {
	f, _, err := tr.Files().Open(name)
	require.NoError(t, err)
	defer f.Close()
	var c map[string]any
	require.NoError(t, json.NewDecoder(f).Decode(&c))
	return c
}

func TestEventsPastMaxBytesAreDroppedAndCounted(t *testing.T) {
	tr := New(Options{Dir: t.TempDir(), MaxBytes: 8 << 10})
	_, err := tr.Update("", []byte(`{"trace_level":["TIMESTAMPS"],"trace_count":"100"}`))
	require.NoError(t, err)
	traceSteps(t, tr, 100, "")
	tr.Close()
	files, err := tr.Files().List()
	require.NoError(t, err)
	require.Len(t, files, 1)
	assert.LessOrEqual(t, files[0].Size, int64(8<<10), "the file keeps to trace.max_bytes")
	assert.Positive(t, files[0].DroppedEvents)
	c := read(t, tr, files[0].Name)
	dropped := c["otherData"].(map[string]any)["stepserve"].(map[string]any)["dropped_events"]
	assert.Equal(t, float64(files[0].DroppedEvents), dropped, "the file counts what it dropped")
	assert.Equal(t, "M", c["traceEvents"].([]any)[0].(map[string]any)["ph"], "metadata is kept first")
}

func TestWorkerEventsAreAlignedOnTheStep(t *testing.T) {
	tr := New(Options{Dir: t.TempDir()})
	_, err := tr.Update("m", []byte(`{"trace_level":["PROFILE"],"trace_count":"1"}`))
	require.NoError(t, err)
	// The worker's clock is its own: its range starts at 5000000µs.
	traceSteps(t, tr, 1, `[{"name":"stepserve.step m bucket 0","ph":"X","ts":5000000,"dur":500,"pid":"CPU functions","tid":1},
		{"name":"aten::mm","ph":"X","ts":5000100,"dur":50,"pid":"CPU functions","tid":1}, {"name":"junk","ph":"Q"}]`)
	tr.Close()
	c := read(t, tr, "m.0.json")
	var infer, anchor, mm map[string]any
	for _, e := range c["traceEvents"].([]any) {
		ev := e.(map[string]any)
		switch ev["name"] {
		case "infer":
			infer = ev
		case "stepserve.step m bucket 0":
			anchor = ev
		case "aten::mm":
			mm = ev
		}
	}
	require.NotNil(t, infer)
	require.NotNil(t, anchor)
	require.NotNil(t, mm)
	assert.InDelta(t, infer["ts"], anchor["ts"], 0.001, "the range starts where the infer span starts")
	assert.InDelta(t, anchor["ts"].(float64)+100, mm["ts"], 0.001, "the worker's events keep their offsets")
	assert.Equal(t, float64(pidWorker), mm["pid"])
}

func TestStoreKeepsMaxFilesAndRefusesPaths(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "secret.txt"), []byte("x"), 0o600))
	var logs bytes.Buffer
	tr := New(Options{Dir: dir, MaxFiles: 2, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	for range 3 {
		_, err := tr.Update("", []byte(`{"trace_level":["TIMESTAMPS"],"trace_count":"1"}`))
		require.NoError(t, err)
		traceSteps(t, tr, 1, "")
		tr.writes.Wait()
	}
	files, err := tr.Files().List()
	require.NoError(t, err)
	require.Len(t, files, 2)
	assert.Equal(t, []string{"m.2.json", "m.1.json"}, []string{files[0].Name, files[1].Name})
	assert.Contains(t, logs.String(), `msg="trace written" model=m file=m.2.json`, "the log names the file written")
	for _, name := range []string{"../secret.txt", "secret.txt", "/etc/passwd", "m.0.json", ".writing-1.json", ""} {
		_, _, err := tr.Files().Open(name)
		assert.Error(t, err, name)
	}
	// A new tracer on the same directory finds them, and numbers on.
	tr2 := New(Options{Dir: dir, MaxFiles: 2})
	files, err = tr2.Files().List()
	require.NoError(t, err)
	require.Len(t, files, 2)
	assert.Equal(t, "m", files[0].Model)
	assert.Equal(t, 1, files[0].Steps)
}

func TestSettingsCountDownAndDisarm(t *testing.T) {
	tr := New(Options{Dir: t.TempDir()})
	assert.Nil(t, tr.Sample("m"), "off by default")
	_, err := tr.Update("", []byte(`{"trace_level":"TIMESTAMPS","trace_count":2,"trace_rate":"2"}`))
	require.NoError(t, err)
	assert.NotNil(t, tr.Sample("m"))
	assert.Nil(t, tr.Sample("m"), "trace_rate 2: one request in two")
	traceSteps(t, tr, 0, "")
	r := tr.Sample("m")
	require.NotNil(t, r)
	r.BeginStep().Finish()
	assert.Equal(t, "1", tr.Settings("m")["trace_count"])
	r.BeginStep().Finish()
	assert.Equal(t, "0", tr.Settings("m")["trace_count"])
	assert.False(t, tr.armed.Load(), "no steps left to trace: the request path is back to one atomic load")
	assert.Nil(t, r.BeginStep())
	tr.Close()
}
