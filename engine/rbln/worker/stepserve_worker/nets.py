"""The architectures, built in torch from the same model.yaml hyper-parameters
and safetensors tensors as the Go CPU engine (engine/cpufallback), and the
step body that reads one flat input buffer and returns one packed output."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.nn import functional as F

from . import decoder, usermodel
from .loading import LoadError, own_code, take



def masked_scores(scores: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
    """The attention scores with every padded key's score replaced by the
    dtype's lowest finite value: zero weight after softmax, and an
    all-padding row (warm-up's zeroed rows) gets equal finite scores, hence
    finite weights. Replaced, not added: in float16 an additive -1e9 is
    -inf, and 0 x -inf (a real key's share of it) is NaN; an added lowest
    value can still overflow to -inf beside a negative score."""
    return scores.masked_fill(pad, torch.finfo(scores.dtype).min)


def safe_eps(eps: float, dtype: torch.dtype) -> float:
    """eps raised to the smallest normal number of dtype: a model's 1e-12
    rounds to zero in float16, and 1/sqrt(0 + 0) on a constant row is inf."""
    return max(eps, torch.finfo(dtype).tiny)


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm whose eps never rounds to zero in the dtype it runs in."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, safe_eps(self.eps, x.dtype))


def normalize(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Unit L2 rows, in x's dtype. Rows are first divided by their largest
    magnitude, so the sum of squares is at most the row length: in float16
    a 768-wide row of values near 10 would otherwise sum to inf."""
    tiny = safe_eps(eps, x.dtype)
    x = x / x.abs().amax(dim=-1, keepdim=True).clamp(min=tiny)
    return F.normalize(x, dim=-1, eps=tiny)


def _linear(tensors: dict[str, torch.Tensor], name: str, out: int, inp: int) -> nn.Linear:
    lin = nn.Linear(inp, out)
    with torch.no_grad():
        lin.weight.copy_(take(tensors, name + ".weight", (out, inp)))
        lin.bias.copy_(take(tensors, name + ".bias", (out,)))
    return lin


def _norm(tensors: dict[str, torch.Tensor], name: str, hidden: int, eps: float) -> LayerNorm:
    ln = LayerNorm(hidden, eps=eps)
    with torch.no_grad():
        ln.weight.copy_(take(tensors, name + ".weight", (hidden,)))
        ln.bias.copy_(take(tensors, name + ".bias", (hidden,)))
    return ln


class MLP(nn.Module):
    """Linear layers with relu or gelu between them, optional softmax."""

    def __init__(self, cfg: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        sizes = cfg["sizes"]
        self.layers = nn.ModuleList(
            _linear(tensors, f"layers.{i}", sizes[i + 1], sizes[i]) for i in range(len(sizes) - 1))
        self.activation = F.gelu if cfg.get("activation") == "gelu" else F.relu
        self.softmax = cfg.get("output_activation") == "softmax"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.activation(x)
        return torch.softmax(x, dim=-1) if self.softmax else x


#: The RoBERTa family: positions from pad_token_id + 1, one token type.
ROBERTA_FAMILIES = ("roberta", "xlm-roberta", "camembert")

#: Each family's tensor names after its prefix: the embeddings, the layer
#: pattern, and in a layer query, key, value, attention output, its norm,
#: the feed-forward's two linears and its norm (models/encoder.go).
_BERT_NAMES = {"word": "embeddings.word_embeddings", "pos": "embeddings.position_embeddings",
               "types": "embeddings.token_type_embeddings", "norm": "embeddings.LayerNorm",
               "layer": "encoder.layer.{}.", "query": "attention.self.query", "key": "attention.self.key",
               "value": "attention.self.value", "attn_out": "attention.output.dense",
               "attn_norm": "attention.output.LayerNorm", "inter": "intermediate.dense", "out": "output.dense",
               "out_norm": "output.LayerNorm"}
_DISTIL_NAMES = {"word": "embeddings.word_embeddings", "pos": "embeddings.position_embeddings",
                 "norm": "embeddings.LayerNorm", "layer": "transformer.layer.{}.", "query": "attention.q_lin",
                 "key": "attention.k_lin", "value": "attention.v_lin", "attn_out": "attention.out_lin",
                 "attn_norm": "sa_layer_norm", "inter": "ffn.lin1", "out": "ffn.lin2", "out_norm": "output_layer_norm"}


def family_layout(family: str) -> tuple[str, dict[str, str], tuple[str, str, str] | None]:
    """A family's base prefix, tensor names, and classification head: the
    dense layer's name (under the prefix when it starts with "."), its
    activation, and the classifier's name."""
    if family == "bert":
        return "bert.", _BERT_NAMES, (".pooler.dense", "tanh", "classifier")
    if family in ROBERTA_FAMILIES:
        return "roberta.", _BERT_NAMES, ("classifier.dense", "tanh", "classifier.out_proj")
    if family == "distilbert":
        return "distilbert.", _DISTIL_NAMES, ("pre_classifier", "relu", "classifier")
    raise LoadError(f"encoder family {family!r} is not supported; want bert, roberta, xlm-roberta, camembert or distilbert")


def hidden_act(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """encoder.hidden_act: gelu (erf), gelu_new / gelu_pytorch_tanh (tanh), relu."""
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    if name in ("", "gelu"):
        return F.gelu
    raise LoadError(f"hidden_act {name!r} is not supported; want gelu, gelu_new, gelu_pytorch_tanh or relu")


class EncoderLayer(nn.Module):
    """One post-norm layer, with the family's Hugging Face tensor names."""

    def __init__(self, t: dict[str, torch.Tensor], p: str, h: int, i: int, heads: int, eps: float,
                 names: dict[str, str] = _BERT_NAMES, act: Callable[[torch.Tensor], torch.Tensor] = F.gelu) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, h // heads
        self.query = _linear(t, p + names["query"], h, h)
        self.key = _linear(t, p + names["key"], h, h)
        self.value = _linear(t, p + names["value"], h, h)
        self.attn_out = _linear(t, p + names["attn_out"], h, h)
        self.attn_norm = _norm(t, p + names["attn_norm"], h, eps)
        self.inter = _linear(t, p + names["inter"], i, h)
        self.out = _linear(t, p + names["out"], h, i)
        self.out_norm = _norm(t, p + names["out_norm"], h, eps)
        self.act = act

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """pad is True at padded keys, shaped [batch, 1, 1, seq]."""
        b, s, h = x.shape

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, s, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        # Scaled before the product, so that half-precision scores overflow
        # no sooner than the model's own do. softmax subtracts the row's
        # maximum first, so it is safe in float16 and bfloat16 as long as
        # its input is finite, which masked_scores keeps it.
        scores = masked_scores((q / math.sqrt(self.head_dim)) @ k.transpose(-1, -2), pad)
        ctx = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s, h)
        x = self.attn_norm(x + self.attn_out(ctx))
        return self.out_norm(x + self.out(self.act(self.inter(x))))


class Encoder(nn.Module):
    """A post-norm encoder of one of the families (encoder.family: bert,
    roberta, xlm-roberta, camembert, distilbert): embeddings (RoBERTa's
    positions from pad_token_id + 1; DistilBERT without token types),
    layers, then cls, masked-mean or last-token pooling (optionally
    normalized), or the family's classification head on the first token."""

    def __init__(self, cfg: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        family = cfg.get("family") or "bert"
        prefix, names, head = family_layout(family)
        if prefix + names["word"] + ".weight" not in tensors:
            prefix = ""
        t = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        h, eps = cfg["hidden"], cfg["layer_norm_eps"]
        self.roberta = family in ROBERTA_FAMILIES
        self.pad = int(cfg.get("pad_token_id", 1 if self.roberta else 0))
        self.word = nn.Parameter(take(t, names["word"] + ".weight", (cfg["vocab_size"], h)).clone())
        self.pos = nn.Parameter(take(t, names["pos"] + ".weight", (cfg["max_position"], h)).clone())
        # 0..max_position-1, made once at load: the step slices it rather
        # than make a tensor of its own (the step structure's item 1).
        self.register_buffer("ramp", torch.arange(cfg["max_position"], dtype=torch.int32), persistent=False)
        self.types = None
        if "types" in names:
            self.types = nn.Parameter(take(t, names["types"] + ".weight", (cfg["type_vocab_size"], h)).clone())
        self.norm = _norm(t, names["norm"], h, eps)
        act = hidden_act(cfg.get("hidden_act") or "gelu")
        self.layers = nn.ModuleList(
            EncoderLayer(t, names["layer"].format(i), h, cfg["intermediate"], cfg["heads"], eps, names, act)
            for i in range(cfg["layers"]))
        self.pooling = cfg.get("pooling") or "cls"
        self.normalize = bool(cfg.get("normalize"))
        self.head = None
        if (cfg.get("head") or "none") == "classification":
            dense, self.head_act, classifier = head
            labels = int(cfg["num_labels"])
            dense_t = t if dense.startswith(".") else tensors
            self.head = nn.ModuleDict({
                "dense": _linear(dense_t, dense.lstrip("."), h, h),
                "classifier": _linear(tensors, classifier, labels, h)})

    def positions(self, ids: torch.Tensor) -> torch.Tensor:
        """Position ids: 0.. for BERT and DistilBERT; for the RoBERTa family
        HF's create_position_ids_from_input_ids, pad_token_id + the count of
        non-padding ids so far for a real token, pad_token_id for padding."""
        s = ids.shape[1]
        if not self.roberta:
            return self.ramp[:s].unsqueeze(0).expand(ids.shape[0], s)
        real = (ids != self.pad).to(torch.int32)
        return torch.cumsum(real, dim=1, dtype=torch.int32) * real + self.pad

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        # F.embedding, not indexing: ids arrive as int32 (the staging's
        # narrowest integer type), which torch indexes only as embeddings.
        x = F.embedding(ids, self.word) + F.embedding(self.positions(ids), self.pos)
        if self.types is not None:
            x = x + F.embedding(types, self.types)
        x = self.norm(x)
        maskf = mask.to(x.dtype)
        pad = (mask == 0)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, pad)
        if self.head is not None:
            y = self.head["dense"](x[:, 0])
            y = torch.relu(y) if self.head_act == "relu" else torch.tanh(y)
            return self.head["classifier"](y)
        if self.pooling == "mean":
            pooled = (x * maskf.unsqueeze(-1)).sum(1) / maskf.sum(1, keepdim=True).clamp(min=1)
        elif self.pooling == "last":
            # The last real token: a one-hot of mask's last 1 (none for an
            # all-padding row), as a product rather than a gather.
            last = (mask.sum(1, keepdim=True, dtype=torch.int32) - 1).clamp(min=0)
            pick = (self.ramp[:mask.shape[1]].unsqueeze(0) == last) & (mask != 0)
            pooled = (x * pick.to(x.dtype).unsqueeze(-1)).sum(1)
        else:
            pooled = x[:, 0]
        if self.normalize:
            pooled = normalize(pooled)
        return pooled


@dataclass(frozen=True)
class Shape:
    """One bucket."""

    batch: int
    seq: int
    # A decoder's decode step's context partition: the key positions it
    # reads (0: all of max_model_len's).
    ctx: int = 0
    # A decoder's decode step whose rows carry token masks.
    mask: bool = False

    def label(self) -> str:
        """As the supervisor names buckets: b4, b4xs32, b4xs1xc256, or
        b4xs1xc256m masked."""
        if not self.seq:
            return f"b{self.batch}"
        return f"b{self.batch}xs{self.seq}" + (f"xc{self.ctx}" if self.ctx else "") + ("m" if self.mask else "")


#: The device's rule for last dimensions: eager operators on tensors whose
#: last dimension is not a multiple of 64 fall back to the CPU, and the
#: step structure asks the same of the graph's inputs and output.
ALIGN = 64


def padded(n: int) -> int:
    """n rounded up to a multiple of ALIGN."""
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class Boundary:
    """One bucket's graph boundary. The step graph takes one [batch, in_row]
    tensor of in_dtype and returns one [batch, out_row] tensor of
    out_dtype; the first in_cols (out_cols) elements of each row are data,
    the rest zeros up to a multiple of ALIGN. The supervisor lays the
    staging out the same way (engine/rbln/boundary.go) and converts to and
    from its own host layout."""

    in_dtype: torch.dtype
    in_cols: int
    out_dtype: torch.dtype
    out_cols: int

    @property
    def in_row(self) -> int:
        return padded(self.in_cols)

    @property
    def out_row(self) -> int:
        return padded(self.out_cols)


def boundary(spec: dict[str, Any], shape: Shape, compute: torch.dtype) -> Boundary:
    """The boundary of the step graph of the model spec describes, for
    shape, computing in compute: an mlp's row is its input features; an
    encoder's is the token ids, attention mask and token type ids of one
    sequence side by side, as int32 (the ids index tables of at most 2^22
    rows); the output row is the model's output features."""
    arch = spec.get("architecture")
    if arch == "mlp":
        sizes = spec["mlp"]["sizes"]
        return Boundary(compute, sizes[0], compute, sizes[-1])
    if arch == "encoder":
        # The order Go packs the token tensors in, stated once in
        # models/inputs.go (encoderStepInputs).
        enc = spec["encoder"]
        width = int(enc["num_labels"]) if (enc.get("head") or "none") == "classification" else enc["hidden"]
        return Boundary(torch.int32, 3 * shape.seq, compute, width)
    if arch == "torch":
        # A row of the fields' one dtype where they share one, else a byte
        # row with every field at a multiple of 64 bytes (usermodel.fields).
        ins, outs = usermodel.signature(spec, shape.seq, compute)
        return Boundary(*usermodel.row_cols(ins), *usermodel.row_cols(outs))
    if arch == "decoder":
        # One sequence a row: its tokens' ids, positions and cache slots,
        # then its fields and block table (engine/rbln/decoder.go), and in
        # a masked step its token mask; out, the sampled token, its
        # log-probability and the top tokens'.
        dec = spec["decoder"]
        # A masked decode step's rows carry the sampling words; a masked
        # (scoring) prefill step returns every position's scores.
        words = decoder.sampling_words(dec["vocab"]) if shape.mask and shape.seq == 1 else 0
        scores = decoder.score_words(shape.seq) if shape.mask and shape.seq > 1 else 0
        return Boundary(torch.int32, 3 * shape.seq + decoder.FIELDS + dec["table_width"] + words,
                        torch.int32, 2 + 2 * dec["top_logprobs"] + scores)
    raise LoadError(f"architecture {arch!r} is not supported by the worker; want mlp, encoder, decoder or torch")


def build(spec: dict[str, Any], tensors: dict[str, torch.Tensor]) -> nn.Module:
    """The model a load message describes."""
    arch = spec.get("architecture")
    if arch == "mlp":
        return MLP(spec["mlp"], tensors)
    if arch == "encoder":
        return Encoder(spec["encoder"], tensors)
    if arch == "decoder":
        if spec["decoder"]["vocab"] < spec["decoder"]["top_logprobs"]:
            raise LoadError(f"decoder: a vocabulary of {spec['decoder']['vocab']} tokens is smaller than the {spec['decoder']['top_logprobs']} most likely a step returns")
        return decoder.Decoder(spec["decoder"], tensors)
    raise LoadError(f"architecture {arch!r} is not supported by the worker; want mlp, encoder or decoder")


def is_decoder(model: Optional[nn.Module]) -> bool:
    """Whether model is a decoder language model (prefill and decode steps)."""
    return isinstance(model, decoder.Decoder)


def step_body(model: nn.Module, shape: Shape, bound: Boundary,
              name: str = "step") -> Callable[[torch.Tensor], torch.Tensor]:
    """The function compiled per bucket: the staged input, [batch,
    bound.in_row], in; every output packed into one [batch, bound.out_row]
    tensor out (one download), in the compute dtype. The row padding is
    sliced off the input and put back on the output inside the graph, so
    that the graph's boundary tensors have last dimensions that are
    multiples of ALIGN and nothing outside it reshapes or converts.

    Each call returns a function with a code object of its own, named name:
    Dynamo keys its cache on the code object and keeps a few entries per
    code object (8 by default), so bodies that shared one, as closures over
    one def do, would let a model's later buckets fall back to eager code.
    Its own code object also means a recompile is that bucket's alone, and
    dropping the function drops its compiled graph."""
    out_pad = bound.out_row - bound.out_cols

    def pad(y: torch.Tensor) -> torch.Tensor:
        return F.pad(y, (0, out_pad)) if out_pad else y

    if isinstance(model, decoder.Decoder):
        t, c, m = shape.seq, shape.ctx, shape.mask

        def decoder_body(x: torch.Tensor) -> torch.Tensor:
            return pad(model.step(x, t, c, m))
        return own_code(decoder_body, name)

    if isinstance(model, Encoder):
        s = shape.seq

        def encoder_body(x: torch.Tensor) -> torch.Tensor:
            return pad(model(x[:, :s], x[:, s:2 * s], x[:, 2 * s:3 * s]))
        return own_code(encoder_body, name)

    cols, whole = bound.in_cols, bound.in_cols == bound.in_row

    def mlp_body(x: torch.Tensor) -> torch.Tensor:
        return pad(model(x if whole else x[:, :cols]))
    return own_code(mlp_body, name)
