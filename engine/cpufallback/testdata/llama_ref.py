"""A Llama forward written by hand in torch (1.13: no transformers here), the
reference the CPU engine's decoder is held to: it reads a Hugging Face folder
(config.json, model.safetensors), recomputes every prefix from scratch (no KV
cache), and prints the greedy continuation of each prompt as JSON.

    /usr/bin/python3 llama_ref.py FOLDER NEW_TOKENS DTYPE < prompts.json
"""
import json
import math
import struct
import sys

import numpy as np
import torch

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None}


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        if t["dtype"] == "BF16":
            raw = np.frombuffer(data[b:e], dtype=np.uint16).astype(np.uint32) << 16
            arr = raw.view(np.float32)
        else:
            arr = np.frombuffer(data[b:e], dtype=DTYPES[t["dtype"]]).astype(np.float32)
        out[name] = torch.from_numpy(arr.copy()).reshape(t["shape"])
    return out


def inv_freq(c, hd):
    theta = c.get("rope_theta", 10000.0)
    f = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    rs = c.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        factor, low, high, orig = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
        out = []
        for x in f.tolist():
            wl = 2 * math.pi / x
            if wl < orig / high:
                out.append(x)
            elif wl > orig / low:
                out.append(x / factor)
            else:
                s = (orig / wl - low) / (high - low)
                out.append((1 - s) * x / factor + s * x)
        f = torch.tensor(out, dtype=torch.float64)
    return f


def rms(x, w, eps):
    # As transformers' LlamaRMSNorm: in float32, then the weight in the
    # model's dtype.
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward(W, c, ids, dtype):
    H, nh = c["hidden_size"], c["num_attention_heads"]
    kvh = c.get("num_key_value_heads", nh)
    hd = c.get("head_dim", H // nh)
    eps = c.get("rms_norm_eps", 1e-6)
    T = len(ids)
    pos = torch.arange(T, dtype=torch.float64)
    ang = torch.outer(pos, inv_freq(c, hd))
    cos = torch.cat((ang.cos(), ang.cos()), -1).to(dtype)
    sin = torch.cat((ang.sin(), ang.sin()), -1).to(dtype)
    x = W["model.embed_tokens.weight"][torch.tensor(ids)]
    mask = torch.full((T, T), float("-inf")).triu(1).to(dtype)
    sw = c.get("sliding_window") if c.get("model_type") == "mistral" else None
    if sw:
        mask = mask + torch.full((T, T), float("-inf")).tril(-sw).to(dtype)
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        g = lambda n: W.get(p + n)
        h = rms(x, g("input_layernorm.weight"), eps)
        q = torch.nn.functional.linear(h, g("self_attn.q_proj.weight"), g("self_attn.q_proj.bias"))
        k = torch.nn.functional.linear(h, g("self_attn.k_proj.weight"), g("self_attn.k_proj.bias"))
        v = torch.nn.functional.linear(h, g("self_attn.v_proj.weight"), g("self_attn.v_proj.bias"))
        q = q.view(T, nh, hd).transpose(0, 1)
        k = k.view(T, kvh, hd).transpose(0, 1)
        v = v.view(T, kvh, hd).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(nh // kvh, dim=0)
        v = v.repeat_interleave(nh // kvh, dim=0)
        a = (q @ k.transpose(1, 2)) * (1 / math.sqrt(hd))
        a = torch.softmax(a.float() + mask.float(), -1).to(dtype) @ v
        a = a.transpose(0, 1).reshape(T, nh * hd)
        x = x + torch.nn.functional.linear(a, g("self_attn.o_proj.weight"), g("self_attn.o_proj.bias"))
        h = rms(x, g("post_attention_layernorm.weight"), eps)
        m = torch.nn.functional.silu(torch.nn.functional.linear(h, g("mlp.gate_proj.weight"))) * torch.nn.functional.linear(h, g("mlp.up_proj.weight"))
        x = x + torch.nn.functional.linear(m, g("mlp.down_proj.weight"))
    h = rms(x[-1], W["model.norm.weight"], eps)
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    return torch.nn.functional.linear(h, head).float()


def main():
    folder, new, dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    c = json.load(open(folder + "/config.json"))
    W = {k: v.to(dtype) for k, v in load(folder + "/model.safetensors").items()}
    if c.get("tie_word_embeddings") is False and "lm_head.weight" not in W:
        raise SystemExit("untied model without lm_head.weight")
    out = []
    with torch.no_grad():
        for prompt in json.load(sys.stdin):
            ids = list(prompt)
            for _ in range(new):
                ids.append(int(torch.argmax(forward(W, c, ids, dtype))))
            out.append(ids[len(prompt):])
    json.dump(out, sys.stdout)


main()
