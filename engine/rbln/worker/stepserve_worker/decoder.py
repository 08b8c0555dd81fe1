"""Decoder language models (Llama, Mistral, Qwen2) as the worker runs them:
the weights and a paged KV cache resident on the device, and one step
graph per bucket that takes a batch of rows (one sequence each: its
tokens' ids, positions and cache slots, its block table and sampling
parameters, as int32; engine/rbln/decoder.go packs them), writes the new
keys and values into the cache by slot, attends over the cache through the
block table, and samples each row's next token in the graph. Its one
output is, per row, the token, its log-probability and the most likely
tokens' (float32 bits in int32)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

# The row fields after the 3*T token words (decoder.go's meta* constants).
VALID, SAMPLES, TEMPERATURE, TOP_P, TOP_K, SEED_LO, SEED_HI, LOGPROBS, POSITION = range(9)
FIELDS = 9

# Below it, greedy (generation/sample.go's minTemperature).
MIN_TEMPERATURE = 1e-5

# SplitMix64's constants, as signed int64 (torch has no uint64 arithmetic):
# generation/sample.go's uniform, the same draw on every engine.
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def _shr(z: torch.Tensor, s: int) -> torch.Tensor:
    """z >> s as unsigned 64-bit: torch's shift is arithmetic."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def uniform(seed: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """A number in [0, 1) from (seed, pos) alone, float64: SplitMix64 of
    seed + (pos + 1) * golden, as generation/sample.go draws it. int64
    products wrap in two's complement, as uint64 ones do."""
    z = seed + (pos + 1) * _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    z = z ^ _shr(z, 31)
    return _shr(z, 11).to(torch.float64) / float(1 << 53)


class Decoder(nn.Module):
    """A Llama-family decoder with its KV cache."""

    def __init__(self, spec: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        from .nets import LoadError, _take  # noqa: PLC0415 (nets imports this module)

        self.vocab, self.hidden = spec["vocab"], spec["hidden"]
        self.layers_n, self.heads, self.kv_heads = spec["layers"], spec["heads"], spec["kv_heads"]
        self.head_dim, self.inter = spec["head_dim"], spec["intermediate"]
        self.eps = float(spec["rms_norm_eps"])
        self.window = int(spec.get("sliding_window") or 0)
        self.block_size, self.table_width = spec["block_size"], spec["table_width"]
        self.blocks = spec["blocks"]
        self.top = spec["top_logprobs"]
        if self.heads % self.kv_heads:
            raise LoadError(f"decoder: {self.heads} query heads do not group over {self.kv_heads} key/value heads")
        H, Q, KV, I = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.inter

        def param(name: str, *shape: int) -> nn.Parameter:
            return nn.Parameter(_take(tensors, name, tuple(shape)).clone(), requires_grad=False)

        def linear(name: str, out: int, inp: int, bias: bool) -> nn.Linear:
            lin = nn.Linear(inp, out, bias=bias)
            lin.weight = param(name + ".weight", out, inp)
            if bias:
                lin.bias = param(name + ".bias", out)
            return lin

        self.embed = param("model.embed_tokens.weight", self.vocab, H)
        self.norm = param("model.norm.weight", H)
        self.head = None if spec["tied"] else linear("lm_head", self.vocab, H, False)
        self.layers = nn.ModuleList()
        for i in range(self.layers_n):
            p = f"model.layers.{i}."
            layer = nn.Module()
            layer.input_norm = param(p + "input_layernorm.weight", H)
            layer.post_norm = param(p + "post_attention_layernorm.weight", H)
            layer.q = linear(p + "self_attn.q_proj", Q, H, spec["qkv_bias"])
            layer.k = linear(p + "self_attn.k_proj", KV, H, spec["qkv_bias"])
            layer.v = linear(p + "self_attn.v_proj", KV, H, spec["qkv_bias"])
            layer.o = linear(p + "self_attn.o_proj", H, Q, spec["o_bias"])
            layer.gate = linear(p + "mlp.gate_proj", I, H, False)
            layer.up = linear(p + "mlp.up_proj", I, H, False)
            layer.down = linear(p + "mlp.down_proj", H, I, False)
            self.layers.append(layer)
        # RoPE's cosines and sines for every position a sequence may reach,
        # as transformers makes them (float32 angles, then the model's
        # dtype when the module is cast).
        positions = self.table_width * self.block_size
        inv = torch.tensor(spec["inv_freq"], dtype=torch.float64)
        ang = torch.outer(torch.arange(positions, dtype=torch.float64), inv).to(torch.float32)
        self.register_buffer("cos", torch.cat((ang.cos(), ang.cos()), -1), persistent=False)
        self.register_buffer("sin", torch.cat((ang.sin(), ang.sin()), -1), persistent=False)
        # The KV cache, one block more than the scheduler's: padding rows
        # and tokens write to the last one, which no sequence reads.
        slots = (self.blocks + 1) * self.block_size
        self.register_buffer("cache", torch.zeros(self.layers_n, 2, slots, self.kv_heads, self.head_dim), persistent=False)

    def rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * xf.to(x.dtype)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin

    def step(self, x: torch.Tensor, T: int) -> torch.Tensor:
        """One step on rows x [B, 3T + FIELDS + table_width] (int32):
        returns [B, 2 + 2 top] int32."""
        B = x.shape[0]
        ids = x[:, :T].long()
        pos = x[:, T:2 * T].long()
        slots = x[:, 2 * T:3 * T].long()
        meta = x[:, 3 * T:3 * T + FIELDS]
        table = x[:, 3 * T + FIELDS:3 * T + FIELDS + self.table_width].long()
        valid = meta[:, VALID].long()
        nh, kvh, hd = self.heads, self.kv_heads, self.head_dim
        S = self.table_width * self.block_size

        h = self.embed[ids]  # [B, T, H]
        cos = self.cos[pos].unsqueeze(2)  # [B, T, 1, hd]
        sin = self.sin[pos].unsqueeze(2)
        # Each row's keys are its block table's slots, in position order.
        kv_slots = (table.unsqueeze(-1) * self.block_size + torch.arange(self.block_size, device=x.device)).reshape(B, S)
        key_pos = torch.arange(S, device=x.device)
        allowed = key_pos.view(1, 1, S) <= pos.unsqueeze(-1)  # [B, T, S]: causal
        if self.window:
            allowed = allowed & (key_pos.view(1, 1, S) > pos.unsqueeze(-1) - self.window)
        flat_slots = slots.reshape(B * T)
        for i, L in enumerate(self.layers):
            a = self.rms(h, L.input_norm)
            q = self.rotate(L.q(a).view(B, T, nh, hd), cos, sin)
            k = self.rotate(L.k(a).view(B, T, kvh, hd), cos, sin)
            v = L.v(a).view(B, T, kvh, hd)
            self.cache[i, 0].index_copy_(0, flat_slots, k.reshape(B * T, kvh, hd).to(self.cache.dtype))
            self.cache[i, 1].index_copy_(0, flat_slots, v.reshape(B * T, kvh, hd).to(self.cache.dtype))
            keys = self.cache[i, 0][kv_slots]  # [B, S, kvh, hd]
            values = self.cache[i, 1][kv_slots]
            if nh != kvh:
                keys = keys.repeat_interleave(nh // kvh, dim=2)
                values = values.repeat_interleave(nh // kvh, dim=2)
            # Scaled in the model's dtype, then softmax in float32, as
            # transformers' eager attention does.
            scores = (torch.einsum("bthd,bshd->bhts", q, keys) * (1 / math.sqrt(hd))).float()
            scores = scores.masked_fill(~allowed.unsqueeze(1), float("-inf"))
            weights = torch.softmax(scores, dim=-1).to(values.dtype)
            attn = torch.einsum("bhts,bshd->bthd", weights, values).reshape(B, T, nh * hd)
            h = h + L.o(attn)
            a = self.rms(h, L.post_norm)
            h = h + L.down(F.silu(L.gate(a)) * L.up(a))
        last = (valid - 1).clamp(min=0)
        final = self.rms(h[torch.arange(B, device=x.device), last], self.norm)  # [B, H]
        logits = (self.head(final) if self.head is not None else final @ self.embed.t()).float()
        return self.sample(logits, meta)

    def sample(self, logits: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
        """Each row's next token, as generation/sample.go draws it: greedy
        at temperature 0, else temperature, top-k, top-p and one draw keyed
        by the row's seed and position; with its log-probability and the
        top most likely tokens'."""
        V = logits.shape[-1]
        temp = meta[:, TEMPERATURE].contiguous().view(torch.float32)
        top_p = meta[:, TOP_P].contiguous().view(torch.float32)
        top_k = meta[:, TOP_K].long()
        seed = (meta[:, SEED_HI].long() << 32) | (meta[:, SEED_LO].long() & 0xFFFFFFFF)
        pos = meta[:, POSITION].long()

        greedy = torch.argmax(logits, dim=-1)
        z = logits / temp.clamp(min=1e-6).unsqueeze(-1)
        p = torch.exp(z - z.max(dim=-1, keepdim=True).values).double()
        sp, order = torch.sort(p, dim=-1, descending=True, stable=True)
        rank = torch.arange(V, device=logits.device).unsqueeze(0)
        keep = (top_k.unsqueeze(-1) <= 0) | (rank < top_k.unsqueeze(-1))
        sp = sp * keep
        mass = sp.sum(-1, keepdim=True)
        cut = ((top_p > 0) & (top_p < 1)).unsqueeze(-1)
        before = sp.cumsum(-1) - sp  # the mass of the tokens ranked above
        sp = torch.where(cut & (before >= top_p.double().unsqueeze(-1) * mass), torch.zeros_like(sp), sp)
        u = uniform(seed, pos).unsqueeze(-1) * sp.sum(-1, keepdim=True)
        at = (sp.cumsum(-1) <= u).sum(-1).clamp(max=V - 1)
        drawn = order.gather(-1, at.unsqueeze(-1)).squeeze(-1)
        token = torch.where(temp >= MIN_TEMPERATURE, drawn, greedy)

        lsm = torch.log_softmax(logits, dim=-1)
        chosen = lsm.gather(-1, token.unsqueeze(-1))
        tv, ti = torch.topk(lsm, self.top, dim=-1)
        return torch.cat((token.unsqueeze(-1).to(torch.int32), chosen.view(torch.int32),
                          ti.to(torch.int32), tv.contiguous().view(torch.int32)), dim=-1)
