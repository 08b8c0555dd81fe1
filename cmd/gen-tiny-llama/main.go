// Command gen-tiny-llama writes the shipped DEMO decoder language model,
// model_repository/tiny-llama, as a Hugging Face folder is laid out, with
// RANDOM weights: a Llama (RMSNorm, RoPE, grouped-query attention,
// SwiGLU, tied embeddings) with a byte-level BPE tokenizer.json (the one
// models/tokenizers generates from its corpus, with ChatML's special
// tokens) and a ChatML chat template. It shows how a language model is
// served (the OpenAI and Triton generate APIs, streaming, the metrics);
// its text means nothing. The output is the same on every run and every
// CPU (fixed seed, Go's own generator, no floating-point arithmetic that
// differs between machines).
//
//	go run ./cmd/gen-tiny-llama -repo model_repository
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/stepserve/stepserve/internal/randweights"
)

const seed = 20261229

// tokenizerFile is the byte-level BPE the demo's tokenizer is made from.
const tokenizerFile = "models/testdata/tokenizers/bpe.json"

// ChatML's special tokens take the BPE file's first ids.
var specials = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}

// chatTemplate is ChatML, as Qwen2 and SmolLM ship it.
const chatTemplate = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

// Shape is the demo's shape: small enough to answer in milliseconds on
// the CPU engine, with every feature a real Llama has.
var Shape = randweights.Decoder{
	Arch: "LlamaForCausalLM", Vocab: 512, Hidden: 128, Layers: 2, Heads: 4, KVHeads: 2, Inter: 344,
	MaxPosition: 2048, RopeTheta: 10000, Tied: false, BOS: 0, EOS: 2,
}

func main() {
	repo := flag.String("repo", "model_repository", "the model repository to write tiny-llama into")
	tok := flag.String("tokenizer", tokenizerFile, "the byte-level BPE tokenizer.json to take the vocabulary from")
	flag.Parse()
	if err := write(filepath.Join(*repo, "tiny-llama"), *tok); err != nil {
		fmt.Fprintln(os.Stderr, "gen-tiny-llama:", err)
		os.Exit(1)
	}
}

func write(dir, tokenizer string) error {
	tj, err := ChatMLTokenizer(tokenizer)
	if err != nil {
		return err
	}
	yaml := "# A DEMO with RANDOM weights (cmd/gen-tiny-llama, make tiny-llama): a Hugging\n" +
		"# Face Llama folder served as it is; its text means nothing. config.json,\n" +
		"# tokenizer.json, tokenizer_config.json (the chat template) and\n" +
		"# model.safetensors are what the Hub ships; this file only overrides.\n" +
		"description: Demo Llama-layout language model with random weights (a Hub folder as it is; byte-level BPE, ChatML template); its text is meaningless.\n" +
		"engine: cpu\n" +
		"generation:\n  max_num_seqs: 16\n  max_model_len: 1024\n  max_batch_tokens: 256\n  max_tokens: 64\n  kv_cache_blocks: 128  # 2048 tokens, 2 MiB: a demo's share of a small machine\n"
	return randweights.WriteDecoderFolder(dir, randweights.DecoderFolder{
		Shape: Shape, Seed: seed, Tokenizer: tj, ModelYAML: yaml, Generator: "cmd/gen-tiny-llama",
		TokenizerConfig: map[string]any{
			"chat_template": chatTemplate, "bos_token": specials[0], "eos_token": specials[2], "pad_token": specials[0],
			"unk_token": nil, "add_bos_token": false, "model_max_length": 2048, "tokenizer_class": "PreTrainedTokenizerFast",
			"clean_up_tokenization_spaces": false,
		},
	})
}

// ChatMLTokenizer is the byte-level BPE file at path with ChatML's
// special tokens in place of its first ids, and no post-processor (a
// chat model's text is framed by its template, not by the tokenizer).
func ChatMLTokenizer(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var t map[string]any
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	model, _ := t["model"].(map[string]any)
	vocab, _ := model["vocab"].(map[string]any)
	if vocab == nil || model["type"] != "BPE" {
		return nil, fmt.Errorf("%s: not a BPE tokenizer.json", path)
	}
	var added []any
	for id, s := range specials {
		for k, v := range vocab {
			if f, ok := v.(float64); ok && f == float64(id) {
				delete(vocab, k)
			}
		}
		vocab[s] = id
		added = append(added, map[string]any{"id": id, "content": s, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true})
	}
	t["added_tokens"] = added
	t["post_processor"] = nil
	t["truncation"], t["padding"] = nil, nil
	return json.MarshalIndent(t, "", "  ")
}
