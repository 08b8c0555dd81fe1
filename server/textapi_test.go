package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stepserve/stepserve/batching"
	"github.com/stepserve/stepserve/engine"
	"github.com/stepserve/stepserve/engine/cpufallback"
	"github.com/stepserve/stepserve/engine/enginetest"
	"github.com/stepserve/stepserve/models"
	"github.com/stepserve/stepserve/serving"
	"github.com/stepserve/stepserve/steps"
)

// The text APIs' test models: the shipped tiny-encoder on the CPU engine,
// and encoders that give logits on the fake engine (until the
// classification head lands, no engine computes one): "classifier" (3
// labels from a labels file), "scorer" (1 logit, single texts) and
// "reranker" (1 logit over text and text_pair, which loads only once
// models accept a text_pair input).

// fakeLogitsYAML is a fake encoder (on the fake engine, named torch here)
// giving logits of n labels; pair adds
// the text_pair input.
func fakeLogitsYAML(n int, labels, pair bool, extra string) string {
	in := "  - {name: text, datatype: BYTES, shape: [-1]}\n"
	head := ""
	if pair {
		// A model that takes pairs is a classifier: its head's tensors
		// are in the fake's weights (the fake engine ignores them).
		in += "  - {name: text_pair, datatype: BYTES, shape: [-1]}\n"
		head = fmt.Sprintf(", head: classification, num_labels: %d", n)
	}
	lab := ""
	if labels {
		lab = ", labels: labels.txt"
	}
	return fmt.Sprintf(`architecture: encoder
engine: torch
encoder: {vocab_size: 1024, hidden: %[1]d, layers: 1, heads: 1, intermediate: 4, max_position: 128, pooling: cls, lowercase: true, truncate: true%[5]s}
inputs:
%[2]soutputs:
  - {name: logits, datatype: FP32, shape: [-1, %[1]d]%[3]s}
buckets: {batch: [1, 4, 16], seq: [32, 64, 128]}
%[4]s`, n, in, lab, extra, head)
}

// writeFakeEncoder writes a fake-engine encoder with zero weights of the
// right shapes and tiny-encoder's vocabulary.
func writeFakeEncoder(t *testing.T, dir, yaml string, hidden int, labels []string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, models.ConfigFile), []byte(yaml), 0o644))
	vocab, err := os.ReadFile("../model_repository/tiny-encoder/vocab.txt")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, models.VocabFile), vocab, 0o644))
	if labels != nil {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "labels.txt"), []byte(strings.Join(labels, "\n")+"\n"), 0o644))
	}
	H, I := hidden, 4
	zeros := func(name string, shape ...int) *models.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		return &models.Tensor{Name: name, Shape: shape, Data: make([]float32, n)}
	}
	ts := []*models.Tensor{
		zeros("embeddings.word_embeddings.weight", 1024, H),
		zeros("embeddings.position_embeddings.weight", 128, H),
		zeros("embeddings.token_type_embeddings.weight", 2, H),
		zeros("embeddings.LayerNorm.weight", H), zeros("embeddings.LayerNorm.bias", H),
	}
	p := "encoder.layer.0."
	for _, l := range []struct {
		name     string
		out, in_ int
	}{{"attention.self.query", H, H}, {"attention.self.key", H, H}, {"attention.self.value", H, H},
		{"attention.output.dense", H, H}, {"intermediate.dense", I, H}, {"output.dense", H, I}} {
		ts = append(ts, zeros(p+l.name+".weight", l.out, l.in_), zeros(p+l.name+".bias", l.out))
	}
	for _, n := range []string{"attention.output.LayerNorm", "output.LayerNorm"} {
		ts = append(ts, zeros(p+n+".weight", H), zeros(p+n+".bias", H))
	}
	if strings.Contains(yaml, "head: classification") {
		ts = append(ts, zeros("pooler.dense.weight", H, H), zeros("pooler.dense.bias", H),
			zeros("classifier.weight", H, H), zeros("classifier.bias", H))
	}
	f, err := os.Create(filepath.Join(dir, models.WeightsFile))
	require.NoError(t, err)
	require.NoError(t, models.WriteSafetensors(f, ts, nil))
	require.NoError(t, f.Close())
}

// fakeLogit is the fake engine's logit k of a row: a function of its
// token ids and token types, which tests compute again from the
// tokenizer's ids.
func fakeLogit(ids, types []int64, k int) float32 {
	var s int64
	for i, id := range ids {
		s += id * int64(i+1) * (types[i] + 1)
	}
	return float32((s*int64(k+3))%97)/8 - 6
}

// fakeLogits is the fake engine's step: every row's logits, from the real
// tokens (attention mask 1) of its input_ids and token_type_ids.
func fakeLogits(l engine.Layout, in, out []byte) error {
	seq, width := l.Bucket.Seq, l.Outputs[0].Shape[1]
	ids, mask, types := in[l.Inputs[0].Offset:], in[l.Inputs[1].Offset:], in[l.Inputs[2].Offset:]
	for row := range l.Bucket.Batch {
		var rowIDs, rowTypes []int64
		for j := range seq {
			at := 8 * (row*seq + j)
			if binary.LittleEndian.Uint64(mask[at:]) == 1 {
				rowIDs = append(rowIDs, int64(binary.LittleEndian.Uint64(ids[at:])))
				rowTypes = append(rowTypes, int64(binary.LittleEndian.Uint64(types[at:])))
			}
		}
		for k := range width {
			binary.LittleEndian.PutUint32(out[4*(row*width+k):], math.Float32bits(fakeLogit(rowIDs, rowTypes, k)))
		}
	}
	return nil
}

// textFixture is a started server with the text models.
type textFixture struct {
	url string
	set *serving.Set
	reg *prometheus.Registry
	s   *Server
}

type textOptions struct {
	tokens      []string
	onlyTiny    bool   // tiny-encoder alone
	tinyBatch   string // model.yaml batching section for tiny-encoder
	maxInflight int64
	maxBody     int64
	// tokenizer, when set, is a test tokenizer.json (models/testdata/
	// tokenizers: wordpiece, unigram or bpe) tiny-encoder reads instead
	// of its vocab.txt.
	tokenizer string
}

func newTextFixture(t *testing.T, o textOptions) *textFixture {
	t.Helper()
	repo := t.TempDir()
	tiny := filepath.Join(repo, "tiny-encoder")
	require.NoError(t, os.MkdirAll(tiny, 0o755))
	for _, f := range []string{models.ConfigFile, models.VocabFile, models.WeightsFile} {
		b, err := os.ReadFile(filepath.Join("../model_repository/tiny-encoder", f))
		require.NoError(t, err)
		if f == models.ConfigFile && o.tinyBatch != "" {
			b = append(b, o.tinyBatch...)
		}
		require.NoError(t, os.WriteFile(filepath.Join(tiny, f), b, 0o644))
	}
	if o.tokenizer != "" {
		b, err := os.ReadFile(filepath.Join("../models/testdata/tokenizers", o.tokenizer+".json"))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(tiny, models.TokenizerFile), b, 0o644))
	}
	fx := &textFixture{}
	if !o.onlyTiny {
		writeFakeEncoder(t, filepath.Join(repo, "classifier"), fakeLogitsYAML(3, true, false, ""), 3, []string{"negative", "neutral", "positive"})
		writeFakeEncoder(t, filepath.Join(repo, "scorer"), fakeLogitsYAML(1, false, false, ""), 1, nil)
		writeFakeEncoder(t, filepath.Join(repo, "reranker"), fakeLogitsYAML(1, false, true, ""), 1, nil)
	}
	fx.reg = prometheus.NewRegistry()
	stepMetrics, err := steps.NewMetrics(fx.reg)
	require.NoError(t, err)
	batchMetrics, err := batching.NewMetrics(fx.reg)
	require.NoError(t, err)
	fx.set, err = serving.New(serving.Options{Repository: repo, DefaultEngine: "cpu", StepMetrics: stepMetrics, BatchMetrics: batchMetrics,
		Engines: map[string]serving.Engine{
			"cpu":   {Engine: cpufallback.Engine{}},
			"torch": {Engine: &enginetest.Engine{Label: "torch", Func: fakeLogits}},
		}})
	require.NoError(t, err)
	t.Cleanup(func() { fx.set.Close() })
	require.NoError(t, fx.set.LoadAll(context.Background()))
	require.NoError(t, fx.set.Warmup(context.Background()))
	opts := Options{Models: fx.set, Version: "test", Registerer: fx.reg, Gatherer: fx.reg,
		InferenceTokens: o.tokens, MaxInflightBytes: 1 << 30, MaxBodyBytes: o.maxBody}
	if o.maxInflight > 0 {
		opts.MaxInflightBytes = o.maxInflight
	}
	fx.s, err = New(opts)
	require.NoError(t, err)
	hs := httptest.NewServer(fx.s)
	t.Cleanup(hs.Close)
	fx.url = hs.URL
	return fx
}

// post sends body (a string, or a value to marshal) and returns the
// status and the answer.
func (fx *textFixture) post(t *testing.T, path string, body any, header ...string) (int, []byte) {
	t.Helper()
	var b []byte
	switch v := body.(type) {
	case string:
		b = []byte(v)
	case []byte:
		b = v
	default:
		var err error
		b, err = json.Marshal(v)
		require.NoError(t, err)
	}
	req, err := http.NewRequest(http.MethodPost, fx.url+path, bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return fx.do(t, req)
}

func (fx *textFixture) get(t *testing.T, path string, headers ...string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, fx.url+path, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return fx.do(t, req)
}

func (fx *textFixture) do(t *testing.T, req *http.Request) (int, []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

// metrics is the /metrics text.
func (fx *textFixture) metrics(t *testing.T) string {
	t.Helper()
	st, b := fx.get(t, "/metrics")
	require.Equal(t, 200, st)
	return string(b)
}

// model is a served model.
func (fx *textFixture) model(t *testing.T, name string) *models.Model {
	m, ok := fx.set.Model(name)
	require.True(t, ok, name)
	return m.Model()
}

// oipEmbedding is what OIP answers for texts on model.
func (fx *textFixture) oipEmbeddings(t *testing.T, model string, texts []string) [][]float32 {
	t.Helper()
	body := map[string]any{"inputs": []map[string]any{{"name": "text", "datatype": "BYTES", "shape": []int{len(texts)}, "data": texts}}}
	st, b := fx.post(t, "/v2/models/"+model+"/infer", body)
	require.Equal(t, 200, st, string(b))
	var resp struct {
		Outputs []struct {
			Shape []int     `json:"shape"`
			Data  []float32 `json:"data"`
		} `json:"outputs"`
	}
	require.NoError(t, json.Unmarshal(b, &resp))
	h := resp.Outputs[0].Shape[1]
	out := make([][]float32, len(texts))
	for i := range out {
		out[i] = resp.Outputs[0].Data[i*h : (i+1)*h]
	}
	return out
}

// tokenCount is the tokens of text with its special tokens, as the model
// tokenizes it (truncated to its largest bucket when it truncates).
func tokenCount(t *testing.T, m *models.Model, text string) int {
	ids, err := m.Tokenizer.AppendEncode(nil, text, m.Config.MaxSeq(), m.Config.Encoder.Truncate)
	require.NoError(t, err)
	return len(ids)
}

// vectorTolerance is how far an embedding may move with the batch it ran
// in: the products' blocking follows the step's rows, so the last bits
// of a float32 sum differ between a text alone and in a batch.
const vectorTolerance = 1e-5

// assertVector checks that got is want, element by element, within
// vectorTolerance.
func assertVector(t *testing.T, want, got []float32, msg ...any) {
	t.Helper()
	require.Len(t, got, len(want), msg...)
	for i := range want {
		if math.Abs(float64(want[i]-got[i])) > vectorTolerance {
			assert.InDelta(t, want[i], got[i], vectorTolerance, append([]any{"element %d: "}, msg...)...)
			return
		}
	}
}

func assertVectors(t *testing.T, want, got [][]float32) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		assertVector(t, want[i], got[i], "row %d", i)
	}
}
