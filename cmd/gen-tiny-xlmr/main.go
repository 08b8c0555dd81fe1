// Command gen-tiny-xlmr writes two shipped DEMO models as Hugging Face
// folders are laid out, with RANDOM weights: model_repository/tiny-xlmr, an
// XLM-RoBERTa-layout sentence embedder (sentence-transformers files: mean
// pooling, normalized), and model_repository/tiny-reranker, an
// XLM-RoBERTa-layout cross-encoder (XLMRobertaForSequenceClassification,
// one label). Both take text through a SentencePiece Unigram tokenizer.json
// (the one models/tokenizers generates from its corpus). They show what a
// Hub folder served as it is looks like, how the APIs answer, and what a
// step costs; their outputs mean nothing. The output is the same on every
// run (fixed seed).
//
//	go run ./cmd/gen-tiny-xlmr -repo model_repository
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/stepserve/stepserve/internal/randweights"
	"github.com/stepserve/stepserve/models"
)

const (
	hidden       = 128
	layers       = 2
	heads        = 4
	intermediate = 512
	padID        = 1
	// maxPosition is XLM-R's 2 + the longest sequence: positions start at
	// pad_token_id + 1.
	maxPosition = 130
	seed        = 20261201
)

// tokenizerFile is the Unigram tokenizer both demos ship.
const tokenizerFile = "models/testdata/tokenizers/unigram.json"

func main() {
	repo := flag.String("repo", "model_repository", "the model repository to write the two demo folders into")
	tok := flag.String("tokenizer", tokenizerFile, "the tokenizer.json to ship")
	flag.Parse()
	if err := write(*repo, *tok); err != nil {
		fmt.Fprintln(os.Stderr, "gen-tiny-xlmr:", err)
		os.Exit(1)
	}
}

func write(repo, tokenizer string) error {
	tj, err := os.ReadFile(tokenizer)
	if err != nil {
		return err
	}
	var t struct {
		Model struct {
			Vocab []json.RawMessage `json:"vocab"`
		} `json:"model"`
	}
	if err := json.Unmarshal(tj, &t); err != nil {
		return fmt.Errorf("%s: %w", tokenizer, err)
	}
	vocab := len(t.Model.Vocab)
	if vocab == 0 {
		return fmt.Errorf("%s: not a Unigram tokenizer.json (no model.vocab)", tokenizer)
	}
	for _, m := range []struct {
		dir    string
		labels int // 0: the embedder
	}{{"tiny-xlmr", 0}, {"tiny-reranker", 1}} {
		dir := filepath.Join(repo, m.dir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		files := map[string]any{"config.json": config(vocab, m.labels)}
		yaml := "# A DEMO with RANDOM weights (cmd/gen-tiny-xlmr, make tiny-xlmr): a Hugging Face\n" +
			"# folder served as it is. config.json, tokenizer.json and model.safetensors\n" +
			"# are what the Hub ships; this file only overrides (without it the buckets\n" +
			"# would be batch [1, 4, 16, 64]; the demo keeps its CPU buffers small).\n"
		if m.labels == 0 {
			files["modules.json"] = []map[string]any{
				{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
				{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
				{"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
			}
			files["1_Pooling/config.json"] = map[string]any{"word_embedding_dimension": hidden, "pooling_mode_cls_token": false,
				"pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": false, "pooling_mode_mean_sqrt_len_tokens": false,
				"pooling_mode_weightedmean_tokens": false, "pooling_mode_lasttoken": false, "include_prompt": true}
			yaml += "description: Demo XLM-R-layout sentence embedder with random weights (a Hub folder as it is; Unigram tokenizer.json, mean pooling, normalized); embeddings are meaningless.\n"
		} else {
			yaml += "description: Demo XLM-R-layout cross-encoder (reranker) with random weights (a Hub folder as it is); scores are meaningless.\n"
		}
		yaml += "buckets:\n  batch: [1, 4, 16]\n  seq: [32, 64, 128]\nengine: cpu\n"
		for name, v := range files {
			b, err := json.MarshalIndent(v, "", "  ")
			if err != nil {
				return err
			}
			if err := writeFile(filepath.Join(dir, name), append(b, '\n')); err != nil {
				return err
			}
		}
		if err := writeFile(filepath.Join(dir, models.TokenizerFile), tj); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(dir, models.ConfigFile), []byte(yaml)); err != nil {
			return err
		}
		if err := weights(filepath.Join(dir, "model.safetensors"), vocab, m.labels); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// config is the model's config.json, as transformers writes it for an
// XLM-RoBERTa model.
func config(vocab, labels int) map[string]any {
	c := map[string]any{
		"architectures": []string{"XLMRobertaModel"}, "model_type": "xlm-roberta",
		"vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
		"intermediate_size": intermediate, "hidden_act": "gelu", "max_position_embeddings": maxPosition,
		"type_vocab_size": 1, "layer_norm_eps": 1e-5, "pad_token_id": padID, "bos_token_id": 0, "eos_token_id": 2,
		"position_embedding_type": "absolute", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
		"initializer_range": 0.02, "torch_dtype": "float32", "transformers_version": "4.44.0",
	}
	if labels > 0 {
		c["architectures"] = []string{"XLMRobertaForSequenceClassification"}
		id2label, label2id := map[string]string{}, map[string]int{}
		for i := range labels {
			id2label[fmt.Sprint(i)] = fmt.Sprintf("LABEL_%d", i)
			label2id[fmt.Sprintf("LABEL_%d", i)] = i
		}
		c["id2label"], c["label2id"] = id2label, label2id
	}
	return c
}

// weights writes random N(0, 0.02) weights (XLM-R's initialisation) under
// the names transformers saves: the base model's without a prefix for the
// embedder (its pooler included: the server leaves it unread), under
// roberta. with the classification head beside it for the reranker.
func weights(path string, vocab, labels int) error {
	prefix := ""
	if labels > 0 {
		prefix = "roberta."
	}
	w := randweights.New(seed, uint64(labels))
	w.Encoder(prefix, randweights.Encoder{Vocab: vocab, Positions: maxPosition, Types: 1, Hidden: hidden, Intermediate: intermediate, Layers: layers})
	if labels == 0 {
		w.Linear("pooler.dense", hidden, hidden)
	} else {
		w.Linear("classifier.dense", hidden, hidden)
		w.Linear("classifier.out_proj", labels, hidden)
	}
	return w.Write(path, map[string]string{"format": "pt", "generator": "cmd/gen-tiny-xlmr", "seed": fmt.Sprint(seed), "weights": "random"})
}
