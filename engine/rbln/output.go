// Worker output capture: the process's stdout and stderr go to the server
// log line by line, at a bounded rate, and its last lines are kept, capped,
// for the error message that says why it died or failed to start.
//
// Output is read in time linear in its length whatever it holds (a line
// is scanned once), each line is cut at maxLineBytes, and lines beyond
// the rate limit are counted (stepserve_worker_output_lines_dropped_total)
// rather than logged. So a module that prints without end costs the
// server little, and the pipe never fills: the worker never blocks on its
// own output.

package rbln

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/stepserve/stepserve/internal/clip"
)

// tailLines is how many of the worker's last output lines are kept for
// error messages.
const tailLines = 20

// maxLineBytes is the most of one output line kept: the rest of a longer
// line is cut.
const maxLineBytes = 4 << 10

// Worker output is logged at up to lineRate lines a second, in bursts of
// up to lineBurst.
const (
	lineRate  = 50
	lineBurst = 200
)

// lineLogger writes a process's output to the log line by line and keeps
// the last lines in a tail. It is an io.Writer for one of exec.Cmd's
// outputs, which writes from one goroutine.
type lineLogger struct {
	name   string // the worker's, in the log's message; "rbln worker" when empty
	logger *slog.Logger
	tail   *tail
	level  slog.Level
	limit  *lineLimit // nil: every line is logged
	// buf is the line begun and not yet ended, at most maxLineBytes of
	// it; cut says it was longer.
	buf []byte
	cut bool
}

func (l *lineLogger) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		part := p
		if i >= 0 {
			part = p[:i]
		}
		if room := maxLineBytes - len(l.buf); len(part) > room {
			part, l.cut = part[:max(room, 0)], true
		}
		l.buf = append(l.buf, part...)
		if i < 0 {
			break
		}
		p = p[i+1:]
		l.line()
	}
	return n, nil
}

// line logs the line in buf and empties it.
func (l *lineLogger) line() {
	line := strings.TrimRight(string(l.buf), "\r")
	cut := l.cut
	l.buf, l.cut = l.buf[:0], false
	if line == "" {
		return
	}
	if cut {
		line += " [cut at 4 KiB]"
	}
	l.tail.add(line)
	if dropped, ok := l.limit.take(); ok {
		name := l.name
		if name == "" {
			name = "rbln worker"
		}
		if dropped > 0 {
			l.logger.Warn(name+" output over the log's rate limit; lines dropped", "dropped", dropped)
		}
		l.logger.Log(context.Background(), l.level, name, "line", line)
	}
}

// lineLimit is a token bucket over the log lines of a worker's outputs,
// shared by its stdout and stderr.
type lineLimit struct {
	mu      sync.Mutex
	tokens  float64
	last    time.Time
	dropped int       // since the last line logged
	count   func(int) // counts dropped lines (the metric)
}

func newLineLimit(count func(int)) *lineLimit {
	return &lineLimit{tokens: lineBurst, last: time.Now(), count: count}
}

// take reports whether a line may be logged now and, when it may, how
// many were dropped since the last one logged.
func (l *lineLimit) take() (dropped int, ok bool) {
	if l == nil {
		return 0, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	l.tokens = min(lineBurst, l.tokens+now.Sub(l.last).Seconds()*lineRate)
	l.last = now
	if l.tokens < 1 {
		l.dropped++
		if l.count != nil {
			l.count(1)
		}
		return 0, false
	}
	l.tokens--
	dropped, l.dropped = l.dropped, 0
	return dropped, true
}

// tail keeps the last max lines, each clipped to 1000 bytes. It is safe
// for concurrent use: stdout and stderr share one.
type tail struct {
	mu    sync.Mutex
	max   int
	lines []string
}

func (t *tail) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	line = clip.Clip(line, 1000)
	t.lines = append(t.lines, line)
	if len(t.lines) > t.max {
		t.lines = t.lines[len(t.lines)-t.max:]
	}
}

// suffix is "; last worker output: <lines>" for an error message, or ""
// when there are none.
func (t *tail) suffix() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == 0 {
		return ""
	}
	return "; last worker output: " + strings.Join(t.lines, " | ")
}
