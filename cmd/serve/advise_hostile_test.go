package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestAdviseCLIAgainstAHostileServer points `stepserve advise` at servers
// that answer badly: a huge answer, a slow one, and one whose strings
// carry terminal control sequences. The CLI reads at most 1 MiB and gives
// up after 30 s (both hold), but it prints the answer's model name,
// YAML and error text as they come: an ESC in them reaches the
// operator's terminal (clearing it, retitling it, or worse with some
// terminals). Control characters must not be written out raw.
func TestAdviseCLIAgainstAHostileServer(t *testing.T) {
	const esc = "\x1b]0;owned\x07\x1b[2J"
	answers := map[string]func(w http.ResponseWriter){
		"control sequences": func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"name":"m` + jsonEsc(esc) + `","max_buckets":1,"advice":{"steps":1,"batch":[1],"current_batch":[1],"model_yaml":"buckets:` + jsonEsc(esc) + `"}}`))
		},
		"control sequences in an error": func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(400)
			w.Write([]byte(`{"error":"no` + jsonEsc(esc) + `"}`))
		},
		"huge": func(w http.ResponseWriter) {
			w.Write([]byte(`{"name":"`))
			chunk := bytes.Repeat([]byte("a"), 1<<20)
			for range 64 {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		},
	}
	for name, answer := range answers {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { answer(w) }))
		var stdout, stderr bytes.Buffer
		began := time.Now()
		code := advise([]string{"--model", "m", "--url", srv.URL}, &stdout, &stderr)
		srv.Close()
		t.Logf("%s: exit %d in %v, %d bytes out, %d bytes err", name, code, time.Since(began).Round(time.Millisecond), stdout.Len(), stderr.Len())
		assert.Less(t, stdout.Len()+stderr.Len(), 64<<10, "%s: the output is bounded", name)
		assert.False(t, strings.ContainsAny(stdout.String()+stderr.String(), "\x1b\x07"), "%s: control characters from the server reach the terminal: %q", name, stdout.String()+stderr.String())
	}
}

// jsonEsc writes s's control characters as JSON \u escapes.
func jsonEsc(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 0x20 {
			b.WriteString(`\u00`)
			b.WriteByte("0123456789abcdef"[r>>4])
			b.WriteByte("0123456789abcdef"[r&15])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
