package models

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// llama32 is a config.json shaped as Llama 3.2 1B's: grouped-query
// attention, llama3 rope scaling, tied embeddings.
const llama32 = `{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
 "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192,
 "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "hidden_act": "silu",
 "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
 "tie_word_embeddings": true, "attention_bias": false, "mlp_bias": false, "torch_dtype": "bfloat16"}`

// smol is SmolLM-135M's shape (issue 31's benchmark model), as Llama.
const smol = `{"architectures": ["LlamaForCausalLM"], "vocab_size": 49152, "hidden_size": 576, "num_hidden_layers": 30,
 "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536, "max_position_embeddings": 2048,
 "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": true}`

// qwen2 is a Qwen2-shaped config: biases on q, k and v.
const qwen2 = `{"architectures": ["Qwen2ForCausalLM"], "vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24,
 "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864, "max_position_embeddings": 32768,
 "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": true, "sliding_window": 32768, "use_sliding_window": false}`

func TestParseDecoderConfig(t *testing.T) {
	c, err := ParseDecoderConfig([]byte(llama32))
	require.NoError(t, err)
	assert.Equal(t, &DecoderConfig{Family: FamilyLlama, Vocab: 128256, Hidden: 2048, Layers: 16, Heads: 32, KVHeads: 8, HeadDim: 64,
		Intermediate: 8192, MaxPosition: 131072, RMSNormEps: 1e-5, RopeTheta: 500000,
		RopeScaling: &RopeScaling{Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPosn: 8192}, TiedEmbeddings: true}, c)
	assert.Equal(t, int64(2*16*8*64*2), c.KVBytesPerToken(2), "bf16 keys and values")
	tensors := c.Tensors()
	assert.NotContains(t, tensors, "lm_head.weight", "tied: the embeddings project the output")
	assert.Equal(t, []int{512, 2048}, tensors["model.layers.15.self_attn.k_proj.weight"])
	assert.Equal(t, []int{2048, 8192}, tensors["model.layers.0.mlp.down_proj.weight"])
	assert.Len(t, tensors, 2+16*9)

	c, err = ParseDecoderConfig([]byte(smol))
	require.NoError(t, err)
	assert.Equal(t, 64, c.HeadDim, "hidden / heads")
	assert.Equal(t, int64(2*30*3*64*4), c.KVBytesPerToken(4), "45 KiB of fp32 KV cache a token")

	c, err = ParseDecoderConfig([]byte(qwen2))
	require.NoError(t, err)
	assert.True(t, c.QKVBias)
	assert.False(t, c.OBias)
	assert.Zero(t, c.SlidingWindow, "use_sliding_window false")
	assert.Equal(t, []int{128}, c.Tensors()["model.layers.3.self_attn.v_proj.bias"])

	// transformers v5: rope_theta and the scaling in rope_parameters.
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(llama32), &m))
	m["rope_parameters"] = map[string]any{"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
		"high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
	delete(m, "rope_theta")
	delete(m, "rope_scaling")
	m["attention_bias"] = true
	b, _ := json.Marshal(m)
	c, err = ParseDecoderConfig(b)
	require.NoError(t, err)
	assert.Equal(t, 500000.0, c.RopeTheta)
	assert.Equal(t, &RopeScaling{Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPosn: 8192}, c.RopeScaling)
	assert.True(t, c.QKVBias && c.OBias, "Llama's attention_bias: q, k, v and o")
	assert.Equal(t, []int{2048}, c.Tensors()["model.layers.0.self_attn.o_proj.bias"])
}

func TestParseDecoderConfigRefusals(t *testing.T) {
	with := func(base, key string, v any) string {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(base), &m))
		if v == nil {
			delete(m, key)
		} else {
			m[key] = v
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	for _, tc := range []struct{ config, want string }{
		{with(smol, "architectures", []string{"BertModel"}), `architectures ["BertModel"]: not a decoder stepserve runs`},
		{with(smol, "num_key_value_heads", 4), "num_key_value_heads: 4; want a divisor of num_attention_heads (9)"},
		{with(smol, "hidden_size", 577), "hidden_size: 577 is not a multiple of num_attention_heads (9)"},
		{with(smol, "num_hidden_layers", 0), "num_hidden_layers: 0; want 1..1024"},
		{with(smol, "hidden_act", "gelu"), `hidden_act: "gelu"`},
		{with(smol, "mlp_bias", true), "mlp_bias"},
		{with(smol, "rope_theta", 0.5), "rope_theta: 0.5"},
		{with(smol, "rope_scaling", map[string]any{"rope_type": "yarn", "factor": 4}), `rope_scaling: type "yarn" is not one stepserve runs`},
		{with(smol, "rope_scaling", map[string]any{"rope_type": "llama3", "factor": 8}), "llama3 needs factor, low_freq_factor"},
		{with(smol, "vocab_size", "many"), "vocab_size: want int, found string"},
		{with(qwen2, "use_sliding_window", true), "use_sliding_window: true"},
	} {
		_, err := ParseDecoderConfig([]byte(tc.config))
		assert.ErrorIs(t, err, ErrConfig, tc.want)
		assert.ErrorContains(t, err, tc.want)
	}
}

// RoPE's inverse frequencies, llama3 scaling included, equal those of a
// reference written here from the scaling's definition in torch.
func TestInvFreqMatchesTorch(t *testing.T) {
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3 (python3-torch) to compute the reference")
	}
	const ref = `
import json, math, sys, torch
c = json.load(sys.stdin)
dim = c["head_dim"]
inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
s = c.get("rope_scaling")
if s:
    old = s["original_max_position_embeddings"]
    low_wl, high_wl = old / s["low_freq_factor"], old / s["high_freq_factor"]
    wl = 2 * math.pi / inv
    scaled = torch.where(wl > low_wl, inv / s["factor"], inv)
    smooth = (old / wl - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    blended = (1 - smooth) * scaled / s["factor"] + smooth * scaled
    mid = ~(wl < high_wl) & ~(wl > low_wl)
    inv = torch.where(mid, blended, scaled)
print(json.dumps(inv.tolist()))
`
	for _, config := range []string{llama32, smol} {
		c, err := ParseDecoderConfig([]byte(config))
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(config), &m))
		m["head_dim"] = c.HeadDim
		in, _ := json.Marshal(m)
		cmd := exec.Command("/usr/bin/python3", "-c", ref)
		cmd.Stdin = strings.NewReader(string(in))
		out, err := cmd.Output()
		if err != nil && strings.Contains(string(out)+err.Error(), "No module named 'torch'") {
			t.Skip("no torch")
		}
		require.NoError(t, err)
		var want []float64
		require.NoError(t, json.Unmarshal(out, &want))
		got := c.InvFreq()
		require.Len(t, got, len(want))
		for i := range want {
			assert.InEpsilon(t, want[i], got[i], 1e-12, "pair %d", i)
		}
	}
}

func TestParseGenerationConfig(t *testing.T) {
	g, err := ParseGenerationConfig([]byte(`{"bos_token_id": 1, "eos_token_id": [2, 7], "temperature": 0.6, "top_p": 0.9}`), 100)
	require.NoError(t, err)
	assert.Equal(t, []int{2, 7}, g.EOS)
	assert.Equal(t, 0.9, *g.TopP)
	g, err = ParseGenerationConfig([]byte(`{"eos_token_id": 2}`), 100)
	require.NoError(t, err)
	assert.Equal(t, []int{2}, g.EOS)
	for _, tc := range []struct{ json, want string }{
		{`{"eos_token_id": 100}`, "token id 100 is outside the vocabulary (0..99)"},
		{`{"eos_token_id": "x"}`, "eos_token_id: want an id or a list of ids"},
		{`{"top_p": 0}`, "top_p 0"},
		{`{"temperature": -1}`, "temperature -1"},
	} {
		_, err := ParseGenerationConfig([]byte(tc.json), 100)
		assert.ErrorIs(t, err, ErrConfig)
		assert.ErrorContains(t, err, tc.want)
	}
	assert.True(t, IsDecoderConfig([]byte(qwen2)))
	assert.False(t, IsDecoderConfig([]byte(`{"architectures": ["BertModel"]}`)))
}

// tinyLlama is the shipped demo's folder with model.yaml replaced by yaml.
func tinyLlama(t *testing.T, yaml string) string {
	t.Helper()
	dir := t.TempDir()
	src := "../model_repository/tiny-llama"
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range entries {
		if e.Name() == "model.yaml" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.yaml"), []byte(yaml), 0o644))
	return dir
}

func TestContextPartitions(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want []int
	}{
		{"generation:\n  max_model_len: 1024\n", []int{128, 512, 1024}},
		{"generation:\n  max_model_len: 2048\n", []int{128, 512, 2048}},
		{"generation:\n  max_model_len: 128\n  max_tokens: 64\n", []int{128}},
		{"generation:\n  max_model_len: 100\n  max_tokens: 64\n", []int{112}}, // a block's multiple
		{"generation:\n  max_model_len: 1000\n  block_size: 48\n", []int{144, 576, 1008}},
		{"buckets:\n  context: [64, 256]\ngeneration:\n  max_model_len: 1024\n", []int{64, 256, 1024}},
		{"buckets:\n  context: [64, 1024]\ngeneration:\n  max_model_len: 1024\n", []int{64, 1024}},
	} {
		m, err := Load(tinyLlama(t, tc.yaml))
		require.NoError(t, err, tc.yaml)
		assert.Equal(t, tc.want, m.Config.Buckets.Context, tc.yaml)
	}
	for yaml, want := range map[string]string{
		"buckets:\n  context: [100]\n":                     "buckets.context: 100; want multiples of generation.block_size 16",
		"buckets:\n  context: [256, 128]\n":                "want ascending lengths",
		"buckets:\n  context: [4096]\n":                    "4096 is above max_model_len 1024",
		"buckets:\n  context: [0]\n":                       "buckets.context: 0; want multiples",
		"buckets:\n  batch: [16, 8192]\n":                  "buckets.batch: a step of 8192 rows; want at most 4096",
		"  kv_cache_blocks: 3000000\n  block_size: 1024\n": "cache slots; want fewer than 2^31",
		"buckets:\n  context: [16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256, 272]\n": "18 context partitions; want at most 16",
	} {
		_, err := Load(tinyLlama(t, "generation:\n  max_model_len: 1024\n"+yaml))
		require.Error(t, err, yaml)
		assert.Contains(t, err.Error(), want)
	}
}
