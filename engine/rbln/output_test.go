package rbln

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countingHandler counts the records logged and keeps their bytes.
type countingHandler struct {
	mu   sync.Mutex
	n    int    // worker lines logged
	last string // the last one
}

func (h *countingHandler) Enabled(_ context.Context, _ slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.Message != "rbln worker" {
		return nil
	}
	h.n++
	r.Attrs(func(a slog.Attr) bool { h.last = a.Value.String(); return true })
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

// A module that prints without end: 2,000,000 short lines in one write
// are read in one linear pass (the old reader rescanned the whole pending
// buffer per line and would not finish within the test's timeout), at most
// a burst of them is logged, the rest are counted as dropped, a line
// without end is cut at maxLineBytes, and the tail holds the last lines.
func TestWorkerOutputFloodIsLinearAndRateLimited(t *testing.T) {
	h := &countingHandler{}
	dropped := 0
	l := &lineLogger{logger: slog.New(h), tail: &tail{max: tailLines}, limit: newLineLimit(func(n int) { dropped += n })}
	const lines = 2_000_000
	var b bytes.Buffer
	for i := range lines {
		b.WriteString("flood ")
		b.WriteByte(byte('0' + i%10))
		b.WriteByte('\n')
	}
	n, err := l.Write(b.Bytes())
	require.NoError(t, err)
	assert.Equal(t, b.Len(), n)
	t.Logf("logged %d records, dropped %d lines", h.n, dropped)
	assert.LessOrEqual(t, h.n, lineBurst+lineRate*10, "logging is rate limited")
	assert.Equal(t, lines, h.n+dropped, "every line is logged or counted")

	assert.True(t, strings.HasSuffix(l.tail.suffix(), "| flood 9"), "the tail holds the last lines")

	// A line without end, in pieces: cut at the bound, the rest dropped.
	h = &countingHandler{}
	l = &lineLogger{logger: slog.New(h), tail: &tail{max: tailLines}, limit: newLineLimit(nil)}
	long := strings.Repeat("y", 3*maxLineBytes)
	l.Write([]byte(long[:maxLineBytes/2]))
	l.Write([]byte(long[maxLineBytes/2:]))
	assert.LessOrEqual(t, cap(l.buf), 2*maxLineBytes, "the pending line stays bounded")
	l.Write([]byte("\n"))
	assert.Equal(t, strings.Repeat("y", maxLineBytes)+" [cut at 4 KiB]", h.last)
	l.Write([]byte("last\n"))
	assert.Equal(t, "last", h.last)
	assert.True(t, strings.HasSuffix(l.tail.suffix(), "| last"))
}
