"""The architectures, built in torch from the same model.yaml hyper-parameters
and safetensors tensors as the Go CPU engine (engine/cpufallback), and the
step body that reads one flat input buffer and returns one packed output."""

from __future__ import annotations

import math
import types
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F



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


class LoadError(ValueError):
    """The model cannot be built; the message names the key or tensor."""


def _take(tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...]) -> torch.Tensor:
    t = tensors.get(name)
    if t is None:
        raise LoadError(f"tensor {name!r} is missing (want shape {list(shape)})")
    if tuple(t.shape) != shape:
        raise LoadError(f"tensor {name!r} has shape {list(t.shape)}, want {list(shape)}")
    return t


def _linear(tensors: dict[str, torch.Tensor], name: str, out: int, inp: int) -> nn.Linear:
    lin = nn.Linear(inp, out)
    with torch.no_grad():
        lin.weight.copy_(_take(tensors, name + ".weight", (out, inp)))
        lin.bias.copy_(_take(tensors, name + ".bias", (out,)))
    return lin


def _norm(tensors: dict[str, torch.Tensor], name: str, hidden: int, eps: float) -> LayerNorm:
    ln = LayerNorm(hidden, eps=eps)
    with torch.no_grad():
        ln.weight.copy_(_take(tensors, name + ".weight", (hidden,)))
        ln.bias.copy_(_take(tensors, name + ".bias", (hidden,)))
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


class EncoderLayer(nn.Module):
    """One post-norm BERT layer, with the Hugging Face tensor names."""

    def __init__(self, t: dict[str, torch.Tensor], p: str, h: int, i: int, heads: int, eps: float) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, h // heads
        self.query = _linear(t, p + "attention.self.query", h, h)
        self.key = _linear(t, p + "attention.self.key", h, h)
        self.value = _linear(t, p + "attention.self.value", h, h)
        self.attn_out = _linear(t, p + "attention.output.dense", h, h)
        self.attn_norm = _norm(t, p + "attention.output.LayerNorm", h, eps)
        self.inter = _linear(t, p + "intermediate.dense", i, h)
        self.out = _linear(t, p + "output.dense", h, i)
        self.out_norm = _norm(t, p + "output.LayerNorm", h, eps)

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
        return self.out_norm(x + self.out(F.gelu(self.inter(x))))


class Encoder(nn.Module):
    """BERT embeddings + post-norm layers + cls or masked-mean pooling."""

    def __init__(self, cfg: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in tensors else ""
        t = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        h, eps = cfg["hidden"], cfg["layer_norm_eps"]
        self.word = nn.Parameter(_take(t, "embeddings.word_embeddings.weight", (cfg["vocab_size"], h)).clone())
        self.pos = nn.Parameter(_take(t, "embeddings.position_embeddings.weight", (cfg["max_position"], h)).clone())
        self.types = nn.Parameter(_take(t, "embeddings.token_type_embeddings.weight", (cfg["type_vocab_size"], h)).clone())
        self.norm = _norm(t, "embeddings.LayerNorm", h, eps)
        self.layers = nn.ModuleList(
            EncoderLayer(t, f"encoder.layer.{i}.", h, cfg["intermediate"], cfg["heads"], eps)
            for i in range(cfg["layers"]))
        self.mean = cfg.get("pooling") == "mean"
        self.normalize = bool(cfg.get("normalize"))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        s = ids.shape[1]
        # F.embedding, not indexing: ids arrive as int32 (the staging's
        # narrowest integer type), which torch indexes only as embeddings.
        x = self.norm(F.embedding(ids, self.word) + self.pos[:s].unsqueeze(0) + F.embedding(types, self.types))
        maskf = mask.to(x.dtype)
        pad = (mask == 0)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, pad)
        if self.mean:
            pooled = (x * maskf.unsqueeze(-1)).sum(1) / maskf.sum(1, keepdim=True).clamp(min=1)
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

    def label(self) -> str:
        """As the supervisor names buckets: b4, or b4xs32."""
        return f"b{self.batch}xs{self.seq}" if self.seq else f"b{self.batch}"


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
        return Boundary(torch.int32, 3 * shape.seq, compute, spec["encoder"]["hidden"])
    if arch == "torch":
        # A byte row: every input (output) in its device type at a multiple
        # of 64 bytes (usermodel.fields), viewed out of it in the graph.
        from . import usermodel
        ins, outs = usermodel.signature(spec, shape.seq, compute)
        return Boundary(torch.uint8, ins[-1].offset + ins[-1].nbytes, torch.uint8, outs[-1].offset + outs[-1].nbytes)
    raise LoadError(f"architecture {arch!r} is not supported by the worker; want mlp, encoder or torch")


def build(spec: dict[str, Any], tensors: dict[str, torch.Tensor]) -> nn.Module:
    """The model a load message describes."""
    arch = spec.get("architecture")
    if arch == "mlp":
        return MLP(spec["mlp"], tensors)
    if arch == "encoder":
        return Encoder(spec["encoder"], tensors)
    raise LoadError(f"architecture {arch!r} is not supported by the worker; want mlp or encoder")


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

    if isinstance(model, Encoder):
        s = shape.seq

        def encoder_body(x: torch.Tensor) -> torch.Tensor:
            return pad(model(x[:, :s], x[:, s:2 * s], x[:, 2 * s:3 * s]))
        return own_code(encoder_body, name)

    cols, whole = bound.in_cols, bound.in_cols == bound.in_row

    def mlp_body(x: torch.Tensor) -> torch.Tensor:
        return pad(model(x if whole else x[:, :cols]))
    return own_code(mlp_body, name)


def own_code(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """fn, with a fresh code object named name (same body, same closure)."""
    code = fn.__code__.replace(co_name=name)
    if hasattr(code, "co_qualname"):  # Python 3.11+
        code = code.replace(co_qualname=name)
    out = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    out.__doc__ = fn.__doc__
    return out
