package tei

import (
	"net/http"
	"strconv"

	"github.com/stepserve/stepserve/server/core"
	"github.com/stepserve/stepserve/server/text"
)

// teiInfo answers GET /info: TEI's description of the model, as far as it
// applies.
func (s *API) teiInfo(w http.ResponseWriter, r *http.Request) {
	kinds := s.withGenerative("", r, []text.Kind{text.KindEmbedding, text.KindClassifier, text.KindReranker})
	sm, tm, err := text.Choose(s.c, r, nil, "", "/info", kinds...)
	if err != nil && (sm == nil || tm.Kind == text.KindNone) {
		writeTEIError(w, core.StatusOf(err), err)
		return
	}
	if tm.Kind == text.KindGenerative {
		s.gen.Info(w, sm) // TGI's answer
		return
	}
	m := sm.Model()
	cfg := m.Config
	var modelType map[string]any
	switch tm.Kind {
	case text.KindEmbedding:
		pooling := ""
		if cfg.Encoder != nil {
			pooling = cfg.Encoder.Pooling
		}
		modelType = map[string]any{"embedding": map[string]any{"pooling": pooling}}
	default:
		labels := tm.Labels(m)
		id2label, label2id := map[string]string{}, map[string]int{}
		for i, l := range labels {
			id2label[strconv.Itoa(i)] = l
			label2id[l] = i
		}
		kind := "classifier"
		if tm.Kind == text.KindReranker {
			kind = "reranker"
		}
		modelType = map[string]any{kind: map[string]any{"id2label": id2label, "label2id": label2id}}
	}
	policy := sm.Backend().Policy()
	info := map[string]any{
		"model_id":                m.Name,
		"model_sha":               nil,
		"model_dtype":             "float32",
		"model_type":              modelType,
		"max_concurrent_requests": policy.MaxQueueSize,
		"max_input_length":        cfg.MaxSeq(),
		"max_batch_tokens":        policy.MaxBatchTokens,
		"max_batch_requests":      nil,
		"max_client_batch_size":   text.ClientBatch(s.c),
		"auto_truncate":           cfg.Encoder != nil && cfg.Encoder.Truncate,
		"tokenization_workers":    nil,
		"version":                 s.c.Opts.Version,
		"sha":                     nil,
		"docker_label":            nil,
	}
	core.WriteJSON(w, http.StatusOK, info)
}
