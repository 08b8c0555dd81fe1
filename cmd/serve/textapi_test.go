package main

import (
	"encoding/json"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// multilingual are texts the demos' Unigram tokenizer was not built for
// only: English, Korean, Japanese, Chinese, accents, emoji, a pair of
// lengths.
var multilingual = []string{
	"what is a bucket?", "버킷은 컴파일된 모양입니다", "東京で推論サーバーを動かす", "服务器批处理请求",
	"Crème brûlée für alle", "emoji 🙂 and 👩‍💻 too", "An inference server answers requests; it batches them, pads them, and runs the model.",
}

// oip runs one OIP inference with BYTES inputs (name -> texts) and returns
// the first output's rows.
func oip(t *testing.T, base, model string, inputs map[string][]string, width int) [][]float32 {
	t.Helper()
	var in []map[string]any
	for _, name := range []string{"text", "text_pair"} {
		if texts, ok := inputs[name]; ok {
			in = append(in, map[string]any{"name": name, "datatype": "BYTES", "shape": []int{len(texts)}, "data": texts})
		}
	}
	body, _ := json.Marshal(map[string]any{"inputs": in})
	resp, out := post(t, base+"/v2/models/"+model+"/infer", body)
	require.Equal(t, 200, resp.StatusCode, string(out))
	var r inferResponse
	require.NoError(t, json.Unmarshal(out, &r))
	var rows [][]float32
	for i := range len(r.Outputs[0].Data) / width {
		rows = append(rows, r.Outputs[0].Data[i*width:(i+1)*width])
	}
	return rows
}

func postJSON(t *testing.T, url string, v any) []byte {
	t.Helper()
	body, _ := json.Marshal(v)
	resp, out := post(t, url, body)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(out))
	return out
}

// TestHubFolderDemosThroughTheirAPIs serves the shipped Hub-folder demos
// (XLM-R layout, Unigram tokenizer.json) and checks that every API answers
// what OIP computes for the same text: OpenAI /v1/embeddings and TEI
// /embed on the embedder, TEI /rerank and /predict on the cross-encoder
// (query and passage as a pair).
func TestHubFolderDemosThroughTheirAPIs(t *testing.T) {
	p := start(t)
	want := oip(t, p.base, "tiny-xlmr", map[string][]string{"text": multilingual}, 128)

	var oa struct {
		Data []struct {
			Index     int       `json:"index"`
			Embedding []float32 `json:"embedding"`
		} `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	require.NoError(t, json.Unmarshal(postJSON(t, p.base+"/v1/embeddings", map[string]any{"model": "tiny-xlmr", "input": multilingual}), &oa))
	require.Len(t, oa.Data, len(multilingual))
	for i, d := range oa.Data {
		assert.Equal(t, i, d.Index)
		assert.InDeltaSlice(t, want[i], d.Embedding, 1e-5, "/v1/embeddings answers OIP's vector for %q", multilingual[i])
		var norm float64
		for _, v := range d.Embedding {
			norm += float64(v) * float64(v)
		}
		assert.InDelta(t, 1, math.Sqrt(norm), 1e-5, "normalized (modules.json lists Normalize)")
	}
	assert.Greater(t, oa.Usage.PromptTokens, 2*len(multilingual))

	var tei [][]float32
	require.NoError(t, json.Unmarshal(postJSON(t, p.base+"/embed", map[string]any{"model": "tiny-xlmr", "inputs": multilingual}), &tei))
	for i := range want {
		assert.InDeltaSlice(t, want[i], tei[i], 1e-5, "/embed answers OIP's vector for %q", multilingual[i])
	}

	// The cross-encoder: /rerank's scores are the sigmoid of the logits
	// OIP gives for (query, passage) pairs, best first.
	query := "what does a server do?"
	var queries []string
	for range multilingual {
		queries = append(queries, query)
	}
	logits := oip(t, p.base, "tiny-reranker", map[string][]string{"text": queries, "text_pair": multilingual}, 1)
	var ranks []struct {
		Index int     `json:"index"`
		Score float64 `json:"score"`
		Text  string  `json:"text"`
	}
	require.NoError(t, json.Unmarshal(postJSON(t, p.base+"/rerank", map[string]any{"query": query, "texts": multilingual, "return_text": true}), &ranks))
	require.Len(t, ranks, len(multilingual))
	assert.True(t, sort.SliceIsSorted(ranks, func(a, b int) bool { return ranks[a].Score > ranks[b].Score }), "best first")
	for _, r := range ranks {
		assert.Equal(t, multilingual[r.Index], r.Text)
		assert.InDelta(t, 1/(1+math.Exp(-float64(logits[r.Index][0]))), r.Score, 1e-6)
	}
	// A pair alone scores as it does in a batch.
	var pred [][]struct {
		Score float64 `json:"score"`
		Label string  `json:"label"`
	}
	require.NoError(t, json.Unmarshal(postJSON(t, p.base+"/predict", map[string]any{"model": "tiny-reranker", "inputs": [][]string{{query, multilingual[1]}}, "raw_scores": true}), &pred))
	require.Len(t, pred, 1)
	assert.Equal(t, "LABEL_0", pred[0][0].Label)
	assert.InDelta(t, logits[1][0], pred[0][0].Score, 1e-5)
}

// TestHubFolderOnTheTorchEngine serves the demo embedder from the same
// folder on the torch engine (the Python worker, the worker's XLM-R
// family) and holds its embeddings to the Go CPU engine's.
func TestHubFolderOnTheTorchEngine(t *testing.T) {
	if err := exec.Command("/usr/bin/python3", "-c", "import torch").Run(); err != nil {
		t.Skip("the torch engine needs /usr/bin/python3 with torch (make deps installs python3-torch)")
	}
	repo := t.TempDir()
	dir := filepath.Join(repo, "tiny-xlmr")
	require.NoError(t, os.CopyFS(dir, os.DirFS("../../model_repository/tiny-xlmr")))
	yaml, err := os.ReadFile(filepath.Join(dir, "model.yaml"))
	require.NoError(t, err)
	onTorch := strings.Replace(string(yaml), "engine: cpu", "engine: torch", 1)
	require.NotEqual(t, string(yaml), onTorch)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.yaml"), []byte(onTorch), 0o644))
	cpu := start(t)
	torch := startCmd(t, exec.Command(binPath, "--server.addr", "127.0.0.1:0", "--model_repository", repo, "--server.grpc_addr="))
	a := oip(t, cpu.base, "tiny-xlmr", map[string][]string{"text": multilingual}, 128)
	b := oip(t, torch.base, "tiny-xlmr", map[string][]string{"text": multilingual}, 128)
	require.Len(t, b, len(a))
	for i := range a {
		var dot, na, nb float64
		for j := range a[i] {
			dot += float64(a[i][j]) * float64(b[i][j])
			na += float64(a[i][j]) * float64(a[i][j])
			nb += float64(b[i][j]) * float64(b[i][j])
		}
		assert.Greater(t, dot/math.Sqrt(na*nb), 0.99999, "%q: the torch engine and the Go CPU engine agree", multilingual[i])
	}
}
