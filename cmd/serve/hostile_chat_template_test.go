package main

// Hostile chat templates (issue 46, item 5) against the real binary under
// a 4 GiB address-space cap: a model folder's tokenizer_config.json
// chat_template is a program the server runs for every chat request, and
// the red team's loop for ever, allocate 3 GB, recurse without end. Each
// is refused by its evaluation budget at load (the model serves its
// completions, without chat) or on the request that exceeds it (a 500
// naming the template), in bounded time and memory, and the server's
// other models serve chat throughout.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hostileChatTemplates are the templates, by the model that ships each,
// and what a chat request of that model answers.
var hostileChatTemplates = []struct {
	model, template string
	// refused: the template fails its probe at load, and chat requests
	// are answered 400 with why; otherwise it passes the probe and only
	// a big conversation exceeds its budget (a 500).
	refused bool
	says    string
}{
	{"hostile-loop", `{% for i in range(100000000) %}{{ i }}{% endfor %}`, true, "a list of 100000000 items"},
	{"hostile-range", `{% for i in range(10000000000) %}{% endfor %}{{ messages[0].content }}`, true, "a list of 10000000000 items"},
	{"hostile-string", `{{ 'x' * 3000000000 }}`, true, "a string of 3000000000 bytes"},
	{"hostile-recursion", `{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}`, true, "calls nested more than 64 deep"},
	{"hostile-nested", `{% for i in range(3000) %}{% for j in range(3000) %}{% for k in range(3000) %}{% endfor %}{% endfor %}{% endfor %}`, true, "more than 1000000 steps"},
	// Within budget for the probe's four messages; not for forty.
	{"hostile-big-steps", `{% for m in messages %}{% for i in range(30000) %}{% endfor %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}<|im_start|>assistant
`, false, "steps"},
	{"hostile-big-range", `{% for i in range(messages | length * 20000) %}{% endfor %}{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}<|im_start|>assistant
`, false, "a list of"},
}

// chatTemplateRepo serves tiny-llama, and a copy of it for each hostile
// template, in its tokenizer_config.json's chat_template.
func chatTemplateRepo(t *testing.T) string {
	repo := t.TempDir()
	src := os.DirFS(filepath.Join("../../model_repository", "tiny-llama"))
	require.NoError(t, os.CopyFS(filepath.Join(repo, "tiny-llama"), src))
	for _, h := range hostileChatTemplates {
		dir := filepath.Join(repo, h.model)
		require.NoError(t, os.CopyFS(dir, src))
		file := filepath.Join(dir, "tokenizer_config.json")
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		var cfg map[string]any
		require.NoError(t, json.Unmarshal(b, &cfg))
		require.Contains(t, cfg, "chat_template")
		cfg["chat_template"] = h.template
		b, err = json.Marshal(cfg)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(file, b, 0o644))
	}
	return repo
}

// chatBody is a chat request of model with n messages.
func chatBody(model string, n int) []byte {
	msgs := make([]map[string]string, n)
	for i := range msgs {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs[i] = map[string]string{"role": role, "content": fmt.Sprint("hi ", i)}
	}
	b, _ := json.Marshal(map[string]any{"model": model, "messages": msgs, "max_tokens": 2, "temperature": 0})
	return b
}

func TestHostileChatTemplates(t *testing.T) {
	p := startCapped(t, 4<<30, "--model_repository", chatTemplateRepo(t))
	logs := p.logs.String()
	for _, h := range hostileChatTemplates {
		warned := false
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(line, "chat template refused") && strings.Contains(line, "model="+h.model+" ") && strings.Contains(line, h.says) {
				warned = true
			}
		}
		assert.Equal(t, h.refused, warned, "%s: a load warning that its template was refused, and why; log:\n%s", h.model, logs)
		// /v1/models says whether the model serves chat, and why not.
		resp, err := http.Get(p.base + "/v1/models/" + h.model)
		require.NoError(t, err)
		var om struct {
			Capabilities        []string `json:"capabilities"`
			ChatTemplateRefused string   `json:"chat_template_refused"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&om))
		resp.Body.Close()
		if h.refused {
			assert.Equal(t, []string{"completion"}, om.Capabilities, h.model)
			assert.Contains(t, om.ChatTemplateRefused, h.says, h.model)
		} else {
			assert.Equal(t, []string{"completion", "chat"}, om.Capabilities, h.model)
			assert.Empty(t, om.ChatTemplateRefused, h.model)
		}
	}

	// tiny-llama's chat answers throughout.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var during []string
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			st, body, err := exchangeWithin(p.base+"/v1/chat/completions", chatBody("tiny-llama", 1), time.Minute)
			mu.Lock()
			if err != nil || st != 200 {
				during = append(during, fmt.Sprintf("%d %v %s", st, err, body))
			} else {
				during = append(during, "")
			}
			mu.Unlock()
		}
	}()

	for _, h := range hostileChatTemplates {
		t.Run(h.model, func(t *testing.T) {
			// Chat: refused with why, naming the template, in bounded
			// time (measured, not asserted: the bound is the timeout).
			n, want := 1, 400
			if !h.refused {
				// Within the budget for a short conversation; past it
				// for a longer one, which is the template's fault.
				st, body, err := exchangeWithin(p.base+"/v1/chat/completions", chatBody(h.model, 1), time.Minute)
				require.NoError(t, err, "no answer: the server crashed or hung")
				assert.Equal(t, 200, st, body)
				n, want = 40, 500
			}
			start := time.Now()
			st, body, err := exchangeWithin(p.base+"/v1/chat/completions", chatBody(h.model, n), time.Minute)
			t.Logf("%s: chat of %d messages answered %d in %s: %s", h.model, n, st, time.Since(start), body)
			require.NoError(t, err, "no answer: the server crashed or hung")
			assert.Equal(t, want, st, body)
			assert.Contains(t, body, "chat template")
			assert.Contains(t, body, h.says)
			if h.refused {
				assert.Contains(t, body, "refused at load")
			} else {
				assert.Contains(t, body, "exceeded its evaluation budget")
			}

			// Completions on the same model still work.
			st, body, err = exchangeWithin(p.base+"/v1/completions", []byte(`{"model":"`+h.model+`","prompt":"Once upon a time","max_tokens":2}`), time.Minute)
			require.NoError(t, err)
			assert.Equal(t, 200, st, body)
		})
		require.True(t, p.alive(), "the server died on %s", h.model)
	}

	close(stop)
	wg.Wait()
	require.NotEmpty(t, during, "tiny-llama's chat was not asked during the test")
	for _, d := range during {
		assert.Empty(t, d, "tiny-llama's chat failed during the hostile requests")
	}
	st, body, err := exchangeWithin(p.base+"/v1/chat/completions", chatBody("tiny-llama", 3), time.Minute)
	require.NoError(t, err)
	assert.Equal(t, 200, st, body)
	assert.True(t, p.alive())
	peak := p.peakRSS(t)
	t.Logf("peak RSS %d MiB; %d tiny-llama chats during", peak>>20, len(during))
	assert.Less(t, peak, int64(4<<30), "peak RSS")
}
