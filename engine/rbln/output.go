// Worker output capture: the process's stdout and stderr go to the server
// log line by line, and its last lines are kept, capped, for the error
// message that says why it died or failed to start.

package rbln

import (
	"context"
	"log/slog"
	"strings"
	"sync"

	"github.com/stepserve/stepserve/internal/clip"
)

// tailLines is how many of the worker's last output lines are kept for
// error messages.
const tailLines = 20

// lineLogger writes a process's output to the log line by line and keeps
// the last lines in a tail. It is an io.Writer for one of exec.Cmd's
// outputs, which writes from one goroutine.
type lineLogger struct {
	logger *slog.Logger
	tail   *tail
	level  slog.Level
	buf    []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := strings.IndexByte(string(l.buf), '\n')
		if i < 0 {
			break
		}
		line := strings.TrimRight(string(l.buf[:i]), "\r")
		l.buf = l.buf[i+1:]
		if line == "" {
			continue
		}
		l.tail.add(line)
		l.logger.Log(context.Background(), l.level, "rbln worker", "line", line)
	}
	if len(l.buf) > 64<<10 { // a line without end: keep the log bounded
		l.tail.add(string(l.buf))
		l.buf = l.buf[:0]
	}
	return len(p), nil
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
