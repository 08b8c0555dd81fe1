"""Decoder language models (Llama, Mistral, Qwen2) as the worker runs them:
the weights and a paged KV cache resident on the device (per layer, a key
and a value buffer allocated at load), and one step graph per bucket that
takes a batch of rows (one sequence each: its tokens' ids, positions and
cache slots, its block table and sampling parameters, as int32;
engine/rbln/decoder.go packs them), writes the new keys and values into
the cache by slot, attends over the blocks of its context partition (the
bucket's context length, not max_model_len) and samples each row's next
token in the graph, in float32 with a 32-bit counter-based draw. Its one
output is, per row, the token, its log-probability and the most likely
tokens' (float32 bits in int32). A masked decode step's rows also carry
a token mask (a bit a token, int32 words, after the block table) that a
row flagged MASKED samples under: the tokens it leaves out weigh nothing
in the draw and in the log-probabilities, as if their logits were -inf
(structured output; generation/sample.go's Sample with a mask), after
the row's logit bias and penalties (generation/penalty.go): each running
sequence's token counts stay on the device, a row of two resident
tables by its lane, counted as the prefill and masked decode steps
compute its tokens (reset where it starts from its first token), so
that no vocabulary-sized table is uploaded. The graph holds no float64 and no
64-bit integer arithmetic and creates no tensor: what the documented step
structure asks (the step audit checks it)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from .loading import LoadError, take

# The row fields after the 3*T token words (decoder.go's meta* constants).
(VALID, SAMPLES, TEMPERATURE, TOP_P, TOP_K, SEED_LO, SEED_HI, LOGPROBS, POSITION, MASKED,
 LANE, RESET, PROMPT_LEN, REPETITION, FREQUENCY, PRESENCE, NEXT) = range(17)
FIELDS = 17

#: The most likely tokens a scoring prefill step returns at each position
#: (OpenAI's completions logprobs go to 5).
PROMPT_TOP = 5

#: The logit bias entries a masked step's row carries (generation.MaxLogitBias).
LOGIT_BIAS = 64


def mask_words(vocab: int) -> int:
    """The int32 words of a row's token mask (decoder.go's maskWords)."""
    return -(-vocab // 32)


def score_words(T: int) -> int:
    """What a scoring prefill step's output row carries after the sampled
    token's: per position, the next token's log-probability and the
    PROMPT_TOP most likely tokens' ids and log-probabilities."""
    return T * (1 + 2 * PROMPT_TOP)


def sampling_words(vocab: int) -> int:
    """What a masked decode step's row carries after its block table: the
    token mask, then the logit bias's token ids and values."""
    return mask_words(vocab) + 2 * LOGIT_BIAS

#: The most rows a step may have: the resident counting table covers them
#: (generation's max_num_seqs is at most 1,024).
MAX_ROWS = 4096

# Below it, greedy (generation/sample.go's minTemperature).
MIN_TEMPERATURE = 1e-5

# generation/sample.go's Uniform in int32 arithmetic: lowbias32's
# multipliers and the position's offset as signed 32-bit constants (torch
# has no uint32 arithmetic; int32 products wrap in two's complement, as
# uint32 ones do).
_MIX1 = 0x7FEB352D
_MIX2 = 0x846CA68B - (1 << 32)
_GOLDEN32 = 0x9E3779B9 - (1 << 32)


def _shr32(z: torch.Tensor, s: int) -> torch.Tensor:
    """z >> s as unsigned 32-bit: torch's shift is arithmetic."""
    return (z >> s) & ((1 << (32 - s)) - 1)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ _shr32(x, 16)
    x = x * _MIX1
    x = x ^ _shr32(x, 15)
    x = x * _MIX2
    return x ^ _shr32(x, 16)


def uniform(seed_lo: torch.Tensor, seed_hi: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """A float32 in [0, 1) from a row's seed halves and the sampled token's
    position alone (int32 tensors), the bits generation.Uniform draws:
    the position, then the seed's high and low words, through lowbias32
    in turn; the top 24 bits are the mantissa."""
    h = _mix32(pos + _GOLDEN32)
    h = _mix32(h ^ seed_hi)
    h = _mix32(h ^ seed_lo)
    return _shr32(h, 8).to(torch.float32) * (1.0 / (1 << 24))


# torch 1.13 indexes a tensor (index_put_) only with int64 indices; 2.x,
# whose graphs are compiled and audited, takes the int32 ones as they come.
_INT32_INDEX = int(torch.__version__.split(".")[0]) >= 2


def _index(t: torch.Tensor) -> torch.Tensor:
    """t (int32) as index_put_ takes it on this torch."""
    return t if _INT32_INDEX else t.long()


class Decoder(nn.Module):
    """A Llama-family decoder with its KV cache."""

    def __init__(self, spec: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.vocab, self.hidden = spec["vocab"], spec["hidden"]
        self.layers_n, self.heads, self.kv_heads = spec["layers"], spec["heads"], spec["kv_heads"]
        self.head_dim, self.inter = spec["head_dim"], spec["intermediate"]
        self.eps = float(spec["rms_norm_eps"])
        self.window = int(spec.get("sliding_window") or 0)
        self.block_size, self.table_width = spec["block_size"], spec["table_width"]
        self.blocks = spec["blocks"]
        self.top = spec["top_logprobs"]
        self.lanes = int(spec.get("lanes") or 1)
        if self.heads % self.kv_heads:
            raise LoadError(f"decoder: {self.heads} query heads do not group over {self.kv_heads} key/value heads")
        H, Q, KV, I = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.inter

        def param(name: str, *shape: int) -> nn.Parameter:
            return nn.Parameter(take(tensors, name, tuple(shape)).clone(), requires_grad=False)

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
        # Everything a step reads besides its row is resident, made here
        # (item 1 of the step structure: no tensor is created inside the
        # step). RoPE's cosines and sines for every position a sequence may
        # reach, as transformers makes them (float32 angles, then the
        # model's dtype when the module is cast).
        positions = self.table_width * self.block_size
        inv = torch.tensor(spec["inv_freq"], dtype=torch.float64)
        ang = torch.outer(torch.arange(positions, dtype=torch.float64), inv).to(torch.float32)
        self.register_buffer("cos", torch.cat((ang.cos(), ang.cos()), -1), persistent=False)
        self.register_buffer("sin", torch.cat((ang.sin(), ang.sin()), -1), persistent=False)
        # 0, 1, 2, ... as int32: key positions, a vocabulary's ranks, a
        # chunk's token offsets and a batch's rows are its prefixes.
        self.register_buffer("counting", torch.arange(max(positions, self.vocab, MAX_ROWS), dtype=torch.int32),
                             persistent=False)
        # The KV cache: per layer, a key and a value buffer allocated once
        # here, [slots, kv_heads, head_dim], one block more than the
        # scheduler's (padding rows and tokens write to the last one, which
        # no sequence reads). A step writes its tokens' keys and values in
        # place by slot (index_put_ on the buffer: a mutation the compiler
        # sees, not a copy of the cache out and back) and reads only the
        # blocks its context partition covers.
        # Each running sequence's token counts, by its lane (one row more,
        # which rows without penalties write to and nothing reads): how
        # often each token is in its prompt, and in its output.
        if (self.lanes + 1) * self.vocab >= 1 << 31:
            raise LoadError(f"decoder: {self.lanes} lanes of a {self.vocab}-token vocabulary overflow the int32 offsets of the token counts")
        self.register_buffer("prompt_counts", torch.zeros(self.lanes + 1, self.vocab, dtype=torch.int32), persistent=False)
        self.register_buffer("output_counts", torch.zeros(self.lanes + 1, self.vocab, dtype=torch.int32), persistent=False)
        slots = (self.blocks + 1) * self.block_size
        for layer in self.layers:
            layer.register_buffer("keys", torch.zeros(slots, self.kv_heads, self.head_dim), persistent=False)
            layer.register_buffer("values", torch.zeros(slots, self.kv_heads, self.head_dim), persistent=False)

    def kv_buffers(self) -> list[torch.Tensor]:
        """The KV cache: each layer's key and value buffers."""
        return [t for L in self.layers for t in (L.keys, L.values)]

    def rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * xf.to(x.dtype)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin

    def step(self, x: torch.Tensor, T: int, C: int = 0, masked: bool = False) -> torch.Tensor:
        """One step on rows x [B, >= 3T + FIELDS + table_width] (int32)
        whose sequences' contexts fit C positions (a multiple of the block
        size; 0 is max_model_len's), with each row's token mask after its
        table when masked: returns [B, 2 + 2 top] int32. Every integer is
        int32 end to end: ids, positions, slots and block tables index
        their tables as they come."""
        B, bs = x.shape[0], self.block_size
        if B > MAX_ROWS or T > self.table_width * bs:
            raise ValueError(f"decoder: a step of {B} rows of {T} tokens; want at most {MAX_ROWS} rows "
                             f"of at most {self.table_width * bs} tokens")
        if B * max(T, self.vocab) >= 1 << 31:
            raise ValueError(f"decoder: {B} rows of a {self.vocab}-token vocabulary overflow the int32 "
                             "offsets the step indexes its rows by")
        if C % bs or C > self.table_width * bs:
            raise ValueError(f"decoder: a context of {C} positions; want a multiple of the block size {bs} "
                             f"up to {self.table_width * bs}")
        W = C // bs if C else self.table_width
        C = W * bs
        ids = x[:, :T]
        pos = x[:, T:2 * T]
        slots = _index(x[:, 2 * T:3 * T].reshape(B * T))
        meta = x[:, 3 * T:3 * T + FIELDS]
        # The context partition: the first W blocks of each row's table.
        blocks = x[:, 3 * T + FIELDS:3 * T + FIELDS + W].reshape(B * W)
        nh, kvh, hd = self.heads, self.kv_heads, self.head_dim
        group = nh // kvh

        if masked or T > 1:
            # Prefill and masked decode steps count their tokens: the
            # steps a penalized sequence's tokens run in.
            self.count(ids, pos, meta, T)
        h = self.embed.index_select(0, ids.reshape(B * T)).view(B, T, self.hidden)
        cos = self.cos.index_select(0, pos.reshape(B * T)).view(B, T, 1, hd)
        sin = self.sin.index_select(0, pos.reshape(B * T)).view(B, T, 1, hd)
        key_pos = self.counting[:C].view(1, 1, C)
        allowed = key_pos <= pos.unsqueeze(-1)  # [B, T, C]: causal
        if self.window:
            allowed = allowed & (key_pos > pos.unsqueeze(-1) - self.window)
        hidden = ~allowed.view(B, 1, 1, T, C)
        for L in self.layers:
            a = self.rms(h, L.input_norm)
            q = self.rotate(L.q(a).view(B, T, nh, hd), cos, sin)
            k = self.rotate(L.k(a).view(B, T, kvh, hd), cos, sin)
            v = L.v(a).view(B, T, kvh, hd)
            L.keys.index_put_((slots,), k.reshape(B * T, kvh, hd).to(L.keys.dtype))
            L.values.index_put_((slots,), v.reshape(B * T, kvh, hd).to(L.values.dtype))
            # Each row's keys are its blocks', in position order.
            keys = L.keys.view(-1, bs, kvh, hd).index_select(0, blocks).view(B, C, kvh, hd)
            values = L.values.view(-1, bs, kvh, hd).index_select(0, blocks).view(B, C, kvh, hd)
            # Queries grouped by the key/value head they share (GQA with no
            # copy of the keys): query head j reads key head j // group.
            qg = q.view(B, T, kvh, group, hd)
            # Scaled in the model's dtype, then softmax in float32, as
            # transformers' eager attention does.
            scores = (torch.einsum("btkgd,bskd->bkgts", qg, keys) * (1 / math.sqrt(hd))).float()
            scores = scores.masked_fill(hidden, float("-inf"))
            weights = torch.softmax(scores, dim=-1).to(values.dtype)
            attn = torch.einsum("bkgts,bskd->btkgd", weights, values).reshape(B, T, nh * hd)
            h = h + L.o(attn)
            a = self.rms(h, L.post_norm)
            h = h + L.down(F.silu(L.gate(a)) * L.up(a))
        # Each row's last real token.
        last = self.counting[:B] * T + (meta[:, VALID] - 1).clamp(min=0)
        final = self.rms(h.reshape(B * T, self.hidden).index_select(0, last), self.norm)  # [B, H]
        logits = (self.head(final) if self.head is not None else final @ self.embed.t()).float()
        if masked and T > 1:
            # A scoring prefill step: every position's next token scored
            # from the logits its hidden state gives (the prompt's tokens'
            # log-probabilities), beside the sampled row.
            scores = self.score(h, ids, meta, B, T)
            return torch.cat((self.sample(logits, meta), scores), dim=-1)
        if masked:
            at = 3 * T + FIELDS + self.table_width
            words = mask_words(self.vocab)
            bias = x[:, at + words:at + words + 2 * LOGIT_BIAS]
            logits = self.penalized(logits, meta, bias[:, :LOGIT_BIAS], bias[:, LOGIT_BIAS:])
            logits = self.masked(logits, x[:, at:at + words], meta[:, MASKED])
        return self.sample(logits, meta)

    def score(self, h: torch.Tensor, ids: torch.Tensor, meta: torch.Tensor, B: int, T: int) -> torch.Tensor:
        """Each position's next token's log-probability under the raw
        logits there (the row's next token after its last real one is
        NEXT), and
        the PROMPT_TOP most likely tokens', packed as int32 [B, T * (1 +
        2 PROMPT_TOP)]: per position its log-probability's bits, then the
        ids, then their log-probabilities' bits."""
        V = self.vocab
        final = self.rms(h.reshape(B * T, self.hidden), self.norm)
        logits = (self.head(final) if self.head is not None else final @ self.embed.t()).float()
        lsm = torch.log_softmax(logits, dim=-1)  # [B*T, V]
        if B * T * V >= 1 << 31:
            raise ValueError(f"decoder: a scoring step of {B} rows of {T} tokens over a {V}-token vocabulary overflows "
                             "the int32 offsets its scores are read at")
        # Position t's next token: the row's own at t + 1, or NEXT after
        # its last real one.
        inside = (self.counting[:T] + 1).unsqueeze(0) < meta[:, VALID].unsqueeze(-1)
        nxt = torch.where(inside, torch.cat((ids[:, 1:], ids[:, :1]), dim=-1), meta[:, NEXT].unsqueeze(-1))
        at = ((self.counting[:B] * T).unsqueeze(-1) + self.counting[:T].unsqueeze(0)) * V + nxt
        chosen = lsm.reshape(B * T * V).index_select(0, at.reshape(B * T)).unsqueeze(-1)
        tv, ti = torch.topk(lsm, PROMPT_TOP, dim=-1)
        floats = torch.cat((chosen, tv), dim=-1).view(torch.int32)
        packed = torch.cat((floats[:, :1], ti.to(torch.int32), floats[:, 1:]), dim=-1)  # [B*T, 1 + 2k]
        return packed.reshape(B, T * (1 + 2 * PROMPT_TOP))

    def count(self, ids: torch.Tensor, pos: torch.Tensor, meta: torch.Tensor, T: int) -> None:
        """Counts each row's real tokens in its lane's row of the token
        counts, a prompt's (position below PROMPT_LEN) or an output's,
        after zeroing that row where the row RESETs (its sequence starts
        from its first token). Rows without penalties name the last lane,
        which nothing reads."""
        B, V = ids.shape[0], self.vocab
        lane = meta[:, LANE]
        keep = (meta[:, RESET] == 0).to(torch.int32).unsqueeze(-1)
        lanes = _index(lane)
        for table in (self.prompt_counts, self.output_counts):
            table.index_put_((lanes,), table.index_select(0, lane) * keep)
        real = (self.counting[:T].unsqueeze(0) < meta[:, VALID].unsqueeze(-1)).to(torch.int32)  # [B, T]
        prompt = (pos < meta[:, PROMPT_LEN].unsqueeze(-1)).to(torch.int32)
        at = _index((lane.unsqueeze(-1) * V + ids).reshape(B * T))
        self.prompt_counts.view(-1).index_put_((at,), (real * prompt).reshape(B * T), accumulate=True)
        self.output_counts.view(-1).index_put_((at,), (real * (1 - prompt)).reshape(B * T), accumulate=True)

    def penalized(self, logits: torch.Tensor, meta: torch.Tensor, bias_ids: torch.Tensor,
                  bias: torch.Tensor) -> torch.Tensor:
        """logits with each row's logit bias added, then its repetition
        penalty on the tokens its lane has counted, then its frequency and
        presence penalties on its output's, as generation.Sampler.Penalize
        applies them. A row without penalties has a bias of zeros, a
        repetition penalty of 1 and the others 0: it is unchanged."""
        B, V = logits.shape
        flat = (self.counting[:B] * V).unsqueeze(-1) + bias_ids
        logits = logits.reshape(B * V).index_put((_index(flat.reshape(-1)),), bias.contiguous().view(torch.float32).reshape(-1),
                                                 accumulate=True).view(B, V)
        lane = meta[:, LANE]
        prompt = self.prompt_counts.index_select(0, lane)
        output = self.output_counts.index_select(0, lane)
        rep = meta[:, REPETITION].contiguous().view(torch.float32)
        rep = (rep + (rep <= 0).to(torch.float32)).unsqueeze(-1)  # a padding row's 0 is 1
        seen = (prompt > 0) | (output > 0)
        logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
        freq = meta[:, FREQUENCY].contiguous().view(torch.float32).unsqueeze(-1)
        pres = meta[:, PRESENCE].contiguous().view(torch.float32).unsqueeze(-1)
        logits = logits - freq * output.to(torch.float32)
        return logits - pres * (output > 0).to(torch.float32)

    def masked(self, logits: torch.Tensor, words: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
        """logits with the tokens each flagged row's mask words [B, words]
        leave out at -inf (token t is bit t % 32 of word t // 32); rows
        not flagged as they are. The bits come out with shifts by the
        resident counting table: no tensor is made in the step."""
        B, V = logits.shape
        bits = (words.unsqueeze(-1) >> self.counting[:32]) & 1  # [B, words, 32]
        allowed = bits.reshape(B, -1)[:, :V] != 0
        return logits.masked_fill(~(allowed | (flag == 0).unsqueeze(-1)), float("-inf"))

    def sample(self, logits: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
        """Each row's next token, as generation/sample.go draws it, in
        float32: greedy at temperature 0, else temperature, top-k, top-p
        and one draw keyed by the row's seed and position (uniform); with
        its log-probability and the top most likely tokens'. Without a cut
        the draw walks the vocabulary in id order, with one in order of
        probability, as the Go sampler does. The only 64-bit integers are
        the indices argmax, sort and topk return (their operators' own
        type), narrowed at once."""
        B, V = logits.shape
        temp = meta[:, TEMPERATURE].contiguous().view(torch.float32)
        top_p = meta[:, TOP_P].contiguous().view(torch.float32)
        top_k = meta[:, TOP_K].unsqueeze(-1)
        u = uniform(meta[:, SEED_LO], meta[:, SEED_HI], meta[:, POSITION]).unsqueeze(-1)

        greedy = torch.argmax(logits, dim=-1).to(torch.int32)
        z = logits / temp.clamp(min=1e-6).unsqueeze(-1)
        p = torch.exp(z - z.max(dim=-1, keepdim=True).values)
        # Uncut: the first token whose running mass passes u of the whole.
        # The whole is the running sum's own last element, so that u < 1
        # always stops within it (a separately reduced sum may exceed it by
        # a rounding, which would walk past the last token that has mass).
        run = p.cumsum(-1)
        whole = (run <= u * run[:, -1:]).sum(-1, dtype=torch.int32).clamp(max=V - 1)
        sp, order = torch.sort(p, dim=-1, descending=True, stable=True)
        order = order.to(torch.int32)
        rank = self.counting[:V].unsqueeze(0)
        sp = sp * ((top_k <= 0) | (rank < top_k))
        kept = sp.cumsum(-1)
        mass = kept[:, -1:]
        cut_p = ((top_p > 0) & (top_p < 1)).unsqueeze(-1)
        before = kept - sp  # the mass of the tokens ranked above
        sp = sp * ~(cut_p & (before >= top_p.unsqueeze(-1) * mass))
        run = sp.cumsum(-1)
        at = (run <= u * run[:, -1:]).sum(-1, dtype=torch.int32).clamp(max=V - 1)
        # Row r's element i of a [B, V] tensor is element r*V + i of its
        # flat view (index_select takes int32 indices; gather does not).
        flat = self.counting[:B] * V
        ranked = order.reshape(B * V).index_select(0, flat + at)
        cut = ((top_k.squeeze(-1) > 0) & (top_k.squeeze(-1) < V)) | cut_p.squeeze(-1)
        drawn = torch.where(cut, ranked, whole)
        token = torch.where(temp >= MIN_TEMPERATURE, drawn, greedy)

        lsm = torch.log_softmax(logits, dim=-1)
        chosen = lsm.reshape(B * V).index_select(0, flat + token).unsqueeze(-1)
        tv, ti = torch.topk(lsm, self.top, dim=-1)
        # The log-probabilities' bits as int32 in one view (inductor 2.6
        # fails to lower a cat of several bitcast views), then packed with
        # the ids, which stay int32: as float32 bits most ids would be
        # denormals, which a device may flush to zero.
        floats = torch.cat((chosen, tv), dim=-1).view(torch.int32)
        return torch.cat((token.unsqueeze(-1), floats[:, :1], ti.to(torch.int32), floats[:, 1:]), dim=-1)
