package models

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"slices"
	"strings"

	"github.com/stepserve/stepserve/bucketing"
	"github.com/stepserve/stepserve/generation"
)

// The names a decoder model's signature takes over OIP v2 and Triton's
// generate extension.
const (
	GenerateInput = "text_input"
	TextOutput    = "text_output"
)

// GenerationOptions are model.yaml's generation: keys, the bounds of a
// decoder model's continuous batcher and KV cache. Zero fields take the
// defaults [Config.validateDecoder] sets.
type GenerationOptions struct {
	// BlockSize is how many tokens a KV cache block holds (default 16).
	BlockSize int `yaml:"block_size"`
	// KVCacheBlocks is how many blocks the KV cache has; by default
	// enough for max_num_seqs sequences of max_model_len tokens, capped
	// at KVCacheMaxBytes.
	KVCacheBlocks int `yaml:"kv_cache_blocks"`
	// MaxNumSeqs is how many sequences decode at once (default 16).
	MaxNumSeqs int `yaml:"max_num_seqs"`
	// MaxModelLen is a sequence's most tokens, prompt and output
	// (default the model's max_position_embeddings, at most 4096).
	MaxModelLen int `yaml:"max_model_len"`
	// MaxBatchTokens is the most tokens one step computes: decodes, and
	// prompt chunks up to what is left (default 256).
	MaxBatchTokens int `yaml:"max_batch_tokens"`
	// PrefixCaching keeps whole computed KV blocks by their tokens (and
	// all before them), shared by later sequences that start the same
	// way: a common system prompt is computed once (default true).
	PrefixCaching *bool `yaml:"prefix_caching"`
	// MaxQueueSize bounds the generations waiting beyond the running
	// max_num_seqs; more are refused with 503 (default 1024).
	MaxQueueSize int `yaml:"max_queue_size"`
	// MaxTokens is a request's max_tokens when it names none (default
	// 256, at most max_model_len-1; generation_config.json's
	// max_new_tokens is not used: its Hub defaults, often 20, are not
	// what an API client expects).
	MaxTokens int `yaml:"max_tokens"`
	// ToolFormat is the format the model writes tool calls in (tools.go:
	// hermes, mistral, llama3_json); empty reads it from the chat
	// template, and a template that names none is read as hermes.
	ToolFormat string `yaml:"tool_format"`
	// StructuredOutput serves constrained generation (JSON schemas,
	// regular expressions, choices, tools a call is required of): the
	// torch and rbln engines compile a masked twin of every decode bucket
	// for it, one more graph each (default true). False refuses such
	// requests with 400.
	StructuredOutput *bool `yaml:"structured_output"`
	// PromptLogprobs serves the prompt's tokens' log-probabilities (echo
	// with logprobs, TGI's decoder_input_details): the torch and rbln
	// engines compile a scoring twin of every prefill bucket for them,
	// one more graph each (default true). False refuses them with 400 on
	// those engines.
	PromptLogprobs *bool `yaml:"prompt_logprobs"`
	// Speculative is speculative decoding (the cpu engine): drafts by
	// prompt lookup, verified in the decode step (default off).
	Speculative *SpeculativeOptions `yaml:"speculative"`
}

// SpeculativeOptions are generation.speculative's keys, as vLLM's
// speculative_config names them for its ngram method.
type SpeculativeOptions struct {
	// Method is how drafts are made: ngram (prompt lookup, the default
	// and the one there is).
	Method string `yaml:"method"`
	// NumSpeculativeTokens is the most tokens drafted for a sequence a
	// step (default 4).
	NumSpeculativeTokens int `yaml:"num_speculative_tokens"`
	// PromptLookupMax and PromptLookupMin bound the n-grams looked up in
	// the sequence (defaults 4 and 2).
	PromptLookupMax int `yaml:"prompt_lookup_max"`
	PromptLookupMin int `yaml:"prompt_lookup_min"`
}

// Defaults of generation.speculative.
const (
	defaultSpeculativeTokens = 4
	defaultPromptLookupMax   = 4
	defaultPromptLookupMin   = 2
)

// Loop is the generation loop's options under these keys.
func (g *GenerationOptions) Loop() generation.Options {
	o := generation.Options{Blocks: g.KVCacheBlocks, BlockSize: g.BlockSize, MaxNumSeqs: g.MaxNumSeqs,
		MaxModelLen: g.MaxModelLen, MaxBatchTokens: g.MaxBatchTokens, PrefixCaching: g.PrefixCaching == nil || *g.PrefixCaching}
	if sp := g.Speculative; sp != nil {
		o.PromptLookup = generation.PromptLookup{Tokens: sp.NumSpeculativeTokens, MaxN: sp.PromptLookupMax, MinN: sp.PromptLookupMin}
	}
	return o
}

// ScoresPrompts reports whether the model serves the prompt's
// log-probabilities (generation.prompt_logprobs).
func (g *GenerationOptions) ScoresPrompts() bool { return g.PromptLogprobs == nil || *g.PromptLogprobs }

// Structured reports whether the model serves structured output
// (generation.structured_output).
func (g *GenerationOptions) Structured() bool {
	return g.StructuredOutput == nil || *g.StructuredOutput
}

// Bounds and defaults of the generation keys.
const (
	defaultBlockSize      = 16
	defaultMaxNumSeqs     = 16
	defaultMaxModelLen    = 4096
	defaultMaxBatchTokens = 256
	defaultMaxTokens      = 256
	defaultMaxQueueSize   = 1024
	maxGenerationSeqs     = 1024
	maxBlockSize          = 1024
	// KVCacheMaxBytes caps the default KV cache: a model.yaml that wants
	// more names kv_cache_blocks.
	KVCacheMaxBytes = 1 << 30
	// maxKVCacheBlocks bounds kv_cache_blocks: block ids are int32, and
	// the cache's bytes must not overflow.
	maxKVCacheBlocks = 1 << 24
)

// KVCacheBytes is what the model's KV cache holds in float32.
func (c *Config) KVCacheBytes() int64 {
	if c.Decoder == nil || c.Generation == nil {
		return 0
	}
	// At most 2^24 blocks of 2^10 tokens of 2 x 1024 layers x 2^18 wide
	// keys and values: counted in float64, which cannot overflow, and
	// capped.
	n := float64(c.Generation.KVCacheBlocks) * float64(c.Generation.BlockSize) * float64(c.Decoder.KVBytesPerToken(4))
	if n >= math.MaxInt64/2 {
		return math.MaxInt64 / 2
	}
	return int64(n)
}

// validateDecoder checks a decoder's generation keys and fills their
// defaults.
func (c *Config) validateDecoder(bad func(string, string, ...any) error) error {
	d := c.Decoder
	if d == nil {
		return bad("architecture", "decoder is read from a Hugging Face folder's config.json (LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM); this directory has none")
	}
	if c.Generation == nil {
		c.Generation = &GenerationOptions{}
	}
	g := c.Generation
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&g.BlockSize, defaultBlockSize)
	def(&g.MaxNumSeqs, defaultMaxNumSeqs)
	def(&g.MaxModelLen, min(d.MaxPosition, defaultMaxModelLen))
	def(&g.MaxBatchTokens, max(defaultMaxBatchTokens, g.MaxNumSeqs))
	def(&g.MaxTokens, min(defaultMaxTokens, g.MaxModelLen-1))
	def(&g.MaxQueueSize, defaultMaxQueueSize)
	if g.PrefixCaching == nil {
		on := true
		g.PrefixCaching = &on
	}
	if sp := g.Speculative; sp != nil {
		if sp.Method == "" {
			sp.Method = "ngram"
		}
		if sp.Method != "ngram" {
			return bad("generation.speculative.method", "%q; want ngram (drafts by prompt lookup)", sp.Method)
		}
		if slices.Contains(TorchEngines, c.Engine) {
			return bad("generation.speculative", "engine %s; speculative decoding runs on the cpu engine, whose steps verify drafts (the worker's graphs do not yet)", c.Engine)
		}
		def(&sp.NumSpeculativeTokens, defaultSpeculativeTokens)
		def(&sp.PromptLookupMax, max(defaultPromptLookupMax, sp.PromptLookupMin))
		def(&sp.PromptLookupMin, min(defaultPromptLookupMin, sp.PromptLookupMax))
		if err := g.Loop().PromptLookup.Check(); err != nil {
			return bad("generation.speculative", "%s", strings.TrimPrefix(err.Error(), "generation: "))
		}
	}
	switch {
	case g.BlockSize < 1 || g.BlockSize > maxBlockSize:
		return bad("generation.block_size", "%d; want 1 to %d tokens (16 is usual)", g.BlockSize, maxBlockSize)
	case g.MaxNumSeqs < 1 || g.MaxNumSeqs > maxGenerationSeqs:
		return bad("generation.max_num_seqs", "%d; want 1 to %d", g.MaxNumSeqs, maxGenerationSeqs)
	case g.MaxModelLen < 2 || g.MaxModelLen > d.MaxPosition:
		return bad("generation.max_model_len", "%d; want 2 up to the model's max_position_embeddings, %d", g.MaxModelLen, d.MaxPosition)
	case g.MaxBatchTokens < g.MaxNumSeqs:
		return bad("generation.max_batch_tokens", "%d is less than max_num_seqs %d; every running sequence decodes a token in every step", g.MaxBatchTokens, g.MaxNumSeqs)
	case g.MaxBatchTokens > 1<<16:
		return bad("generation.max_batch_tokens", "%d; want at most %d", g.MaxBatchTokens, 1<<16)
	case g.MaxTokens < 1 || g.MaxTokens >= g.MaxModelLen:
		return bad("generation.max_tokens", "%d; want 1 up to max_model_len-1 (%d)", g.MaxTokens, g.MaxModelLen-1)
	case g.MaxQueueSize < 0 || g.MaxQueueSize > 1<<20:
		return bad("generation.max_queue_size", "%d; want 1 to %d", g.MaxQueueSize, 1<<20)
	case g.KVCacheBlocks < 0 || g.KVCacheBlocks > maxKVCacheBlocks:
		return bad("generation.kv_cache_blocks", "%d; want 0 (the default) to %d", g.KVCacheBlocks, maxKVCacheBlocks)
	case g.ToolFormat != "" && !slices.Contains([]string{ToolFormatHermes, ToolFormatMistral, ToolFormatLlama3}, g.ToolFormat):
		return bad("generation.tool_format", "%q; want %s, %s or %s (or leave it out: the chat template says)", g.ToolFormat, ToolFormatHermes, ToolFormatMistral, ToolFormatLlama3)
	}
	perSeq := (g.MaxModelLen + g.BlockSize - 1) / g.BlockSize
	if g.KVCacheBlocks == 0 {
		perBlock := int64(g.BlockSize) * d.KVBytesPerToken(4)
		g.KVCacheBlocks = int(min(int64(perSeq*g.MaxNumSeqs), max(int64(perSeq), KVCacheMaxBytes/perBlock)))
	}
	if g.KVCacheBlocks < perSeq {
		return bad("generation.kv_cache_blocks", "%d blocks of %d tokens cannot hold one sequence of max_model_len %d tokens; want at least %d",
			g.KVCacheBlocks, g.BlockSize, g.MaxModelLen, perSeq)
	}
	if len(c.Buckets.Batch) == 0 {
		for b := 1; b <= g.MaxNumSeqs; b *= 2 {
			c.Buckets.Batch = append(c.Buckets.Batch, b)
		}
		if last := c.Buckets.Batch[len(c.Buckets.Batch)-1]; last != g.MaxNumSeqs {
			c.Buckets.Batch = append(c.Buckets.Batch, g.MaxNumSeqs)
		}
	}
	if len(c.Buckets.Seq) == 0 {
		c.Buckets.Seq = hfSeqBuckets(max(32, g.MaxBatchTokens))
	}
	if most := slices.Max(c.Buckets.Batch); most < g.MaxNumSeqs {
		return bad("buckets.batch", "the largest decode batch %d is less than generation.max_num_seqs %d", most, g.MaxNumSeqs)
	}
	// A step's rows, and its offsets into them, are int32 on the device:
	// cache slots, and rows x vocabulary (or x tokens).
	if slots := int64(g.KVCacheBlocks+1) * int64(g.BlockSize); slots >= 1<<31 {
		return bad("generation.kv_cache_blocks", "%d blocks of %d tokens make %d cache slots; want fewer than 2^31 (slots are int32 on the device)",
			g.KVCacheBlocks, g.BlockSize, slots)
	}
	most, widest := slices.Max(c.Buckets.Batch), max(d.Vocab, slices.Max(c.Buckets.Seq))
	if most > maxDecoderRows || int64(most)*int64(widest) >= 1<<31 {
		return bad("buckets.batch", "a step of %d rows; want at most %d rows, and rows x %d (the vocabulary or the longest chunk) below 2^31 (the step's int32 offsets)",
			most, maxDecoderRows, widest)
	}
	full := perSeq * g.BlockSize
	if len(c.Buckets.Context) == 0 {
		c.Buckets.Context = defaultContexts(g.BlockSize, full)
	}
	for i, n := range c.Buckets.Context {
		switch {
		case n < g.BlockSize || n%g.BlockSize != 0:
			return bad("buckets.context", "%d; want multiples of generation.block_size %d", n, g.BlockSize)
		case n > full:
			return bad("buckets.context", "%d is above max_model_len %d (in blocks of %d: %d)", n, g.MaxModelLen, g.BlockSize, full)
		case i > 0 && n <= c.Buckets.Context[i-1]:
			return bad("buckets.context", "%v; want ascending lengths, each once", c.Buckets.Context)
		}
	}
	if c.Buckets.Context[len(c.Buckets.Context)-1] != full {
		c.Buckets.Context = append(c.Buckets.Context, full)
	}
	if len(c.Buckets.Context) > bucketing.MaxContexts {
		return bad("buckets.context", "%d context partitions; want at most %d (each is a compiled decode program per batch size)", len(c.Buckets.Context), bucketing.MaxContexts)
	}
	return nil
}

// maxDecoderRows bounds a decoder step's rows: the worker's step indexes
// them with a resident table of this many (decoder.py MAX_ROWS).
const maxDecoderRows = 4096

// defaultContexts is the context ladder of a decoder whose sequences reach
// full positions (a multiple of blockSize): 128 positions (a block's
// multiple), then 4 times more each rung, then full. A step reads at most
// 4 times the positions it needs, and a model of 4,096 positions compiles
// 4 decode programs per batch size, not one per doubling: on a device a
// compile is minutes.
func defaultContexts(blockSize, full int) []int {
	var out []int
	for n := (128 + blockSize - 1) / blockSize * blockSize; n < full; n *= 4 {
		out = append(out, n)
	}
	return append(out, full)
}

// Decoder is a decoder language model's weights, by layer.
type Decoder struct {
	Config *DecoderConfig
	Embed  []float32 // [Vocab, Hidden]
	Norm   []float32 // the final RMSNorm's weight
	// Head is the output projection [Vocab, Hidden]: Embed when the
	// embeddings are tied.
	Head   *Linear
	Layers []DecoderLayer
	// Generation is generation_config.json; nil when the folder has none.
	Generation *GenerationConfig
	// Chat is tokenizer_config.json's chat template; nil when it has none.
	Chat *ChatTemplate
}

// DecoderLayer is one transformer block's weights.
type DecoderLayer struct {
	InputNorm, PostNorm []float32
	Q, K, V, O          Linear
	Gate, Up, Down      Linear
}

// NewDecoder takes a decoder's weights from w, checking every shape.
func NewDecoder(c *DecoderConfig, w *Weights) (*Decoder, error) {
	shapes := c.Tensors()
	get := func(name string) ([]float32, error) {
		t, err := w.Tensor(name, shapes[name]...)
		if err != nil {
			return nil, err
		}
		return t.Data, nil
	}
	linear := func(name string, bias bool, l *Linear) error {
		s := shapes[name+".weight"]
		l.Out, l.In = s[0], s[1]
		var err error
		if l.Weight, err = get(name + ".weight"); err != nil {
			return err
		}
		if bias {
			l.Bias, err = get(name + ".bias")
		}
		return err
	}
	d := &Decoder{Config: c, Layers: make([]DecoderLayer, c.Layers)}
	var err error
	if d.Embed, err = get("model.embed_tokens.weight"); err != nil {
		return nil, err
	}
	if d.Norm, err = get("model.norm.weight"); err != nil {
		return nil, err
	}
	d.Head = &Linear{In: c.Hidden, Out: c.Vocab, Weight: d.Embed}
	if !c.TiedEmbeddings {
		if err := linear("lm_head", false, d.Head); err != nil {
			return nil, err
		}
	}
	for i := range d.Layers {
		l := &d.Layers[i]
		p := fmt.Sprintf("model.layers.%d.", i)
		if l.InputNorm, err = get(p + "input_layernorm.weight"); err != nil {
			return nil, err
		}
		if l.PostNorm, err = get(p + "post_attention_layernorm.weight"); err != nil {
			return nil, err
		}
		for _, x := range []struct {
			name string
			bias bool
			l    *Linear
		}{{"self_attn.q_proj", c.QKVBias, &l.Q}, {"self_attn.k_proj", c.QKVBias, &l.K}, {"self_attn.v_proj", c.QKVBias, &l.V},
			{"self_attn.o_proj", c.OBias, &l.O}, {"mlp.gate_proj", false, &l.Gate}, {"mlp.up_proj", false, &l.Up}, {"mlp.down_proj", false, &l.Down}} {
			if err := linear(p+x.name, x.bias, x.l); err != nil {
				return nil, err
			}
		}
	}
	return d, nil
}

// openDecoder reads a decoder HF folder's config: config.json (read
// already, b), generation_config.json and tokenizer_config.json's chat
// template when they are there.
func (m *Manifest) openDecoder(b []byte) (*Config, error) {
	file := path.Join(m.Name, HFConfigFile)
	dc, err := ParseDecoderConfig(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	c := &Config{
		Description:  fmt.Sprintf("Hugging Face %s folder (decoder language model)", dc.Family),
		Architecture: "decoder",
		Decoder:      dc,
		Inputs:       []TensorSpec{{Name: GenerateInput, Datatype: BYTES, Shape: []int{-1}}},
		Outputs:      []TensorSpec{{Name: TextOutput, Datatype: BYTES, Shape: []int{-1}}},
	}
	gfile := path.Join(m.Name, "generation_config.json")
	gb, err := readFile(m.root, gfile, maxHFConfigBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		if m.generation, err = ParseGenerationConfig(gb, dc.Vocab); err != nil {
			return nil, fmt.Errorf("%s: %w", gfile, err)
		}
	}
	if m.generation == nil || len(m.generation.EOS) == 0 {
		// Without generation_config.json's, config.json's eos_token_id,
		// as transformers falls back to it.
		if cg, err := ParseGenerationConfig(b, dc.Vocab); err == nil && len(cg.EOS) > 0 {
			if m.generation == nil {
				m.generation = &GenerationConfig{}
			}
			m.generation.EOS = cg.EOS
		}
	}
	if m.chat, err = ReadChatTemplate(m.root, m.Name); err != nil {
		return nil, err
	}
	return c, nil
}
