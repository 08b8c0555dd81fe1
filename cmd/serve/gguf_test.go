package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	benchgguf "github.com/stepserve/stepserve/bench/gguf"
	"github.com/stepserve/stepserve/models"
)

// TestGGUFServesChat: the shipped tiny-llama written as one .gguf (the
// project's own writer: weights as llama.cpp lays them out, its byte-level
// BPE vocabulary, special tokens and chat template in the metadata) in a
// folder of its own is served with no other file, and answers chat and
// completions with the Hugging Face folder's greedy text.
func TestGGUFServesChat(t *testing.T) {
	repo := t.TempDir()
	src := "../../model_repository/tiny-llama"
	require.NoError(t, os.CopyFS(filepath.Join(repo, "tiny-llama"), os.DirFS(src)))
	m, err := models.Load(src)
	require.NoError(t, err)
	tok, err := os.ReadFile(filepath.Join(src, "tokenizer.json"))
	require.NoError(t, err)
	var tc struct {
		ChatTemplate string `json:"chat_template"`
	}
	b, err := os.ReadFile(filepath.Join(src, "tokenizer_config.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &tc))
	dir := filepath.Join(repo, "tiny-gguf")
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.NoError(t, benchgguf.WriteLlama(filepath.Join(dir, "tiny.gguf"), m.Decoder.Config, m.Weights,
		benchgguf.Options{Name: "tiny", Type: benchgguf.F32, BOS: 0, EOS: 2, Tokenizer: tok, ChatTemplate: tc.ChatTemplate}))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "the .gguf alone")

	p := startCmd(t, exec.Command(binPath, "--server.addr", "127.0.0.1:0", "--model_repository", repo))
	ask := func(path, model string, body map[string]any) string {
		body["model"], body["max_tokens"], body["temperature"] = model, 12, 0
		in, _ := json.Marshal(body)
		resp, out := post(t, p.base+path, in, "Content-Type", "application/json")
		require.Equal(t, 200, resp.StatusCode, "%s %s: %s", path, model, out)
		var r struct {
			Choices []struct {
				Text    string
				Message struct{ Content string }
			}
		}
		require.NoError(t, json.Unmarshal(out, &r))
		require.Len(t, r.Choices, 1)
		return r.Choices[0].Text + r.Choices[0].Message.Content
	}
	chat := map[string]any{"messages": []map[string]string{{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there, what is new?"}}}
	want := ask("/v1/chat/completions", "tiny-llama", chat)
	assert.NotEmpty(t, want)
	assert.Equal(t, want, ask("/v1/chat/completions", "tiny-gguf", chat), "chat")
	prompt := map[string]any{"prompt": "Once upon a time, in 2024, ünïcödé"}
	assert.Equal(t, ask("/v1/completions", "tiny-llama", prompt), ask("/v1/completions", "tiny-gguf", prompt), "completions")
}
