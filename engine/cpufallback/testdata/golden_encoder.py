#!/usr/bin/python3
"""Write the encoder reference the CPU engine is checked against.

Builds a small fixed-seed BERT-style encoder from torch's own modules
(nn.Embedding, nn.LayerNorm, nn.TransformerEncoderLayer: post-norm, GELU),
writes its weights as safetensors under the Hugging Face BERT names, and
writes the pooled embeddings torch computes for a padded batch of sequences
of several lengths. Run by `make golden` (Debian's python3-torch), not by the
tests: the tests read the committed files.

    /usr/bin/python3 engine/cpufallback/testdata/golden_encoder.py OUTDIR
"""

from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

SEED = 20261130


@dataclass(frozen=True)
class Dims:
    vocab: int = 100
    hidden: int = 64
    heads: int = 4
    intermediate: int = 128
    layers: int = 2
    max_position: int = 64
    types: int = 2
    eps: float = 1e-12


class Encoder(nn.Module):
    """Embeddings + LayerNorm, then torch's post-norm encoder layers."""

    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.word = nn.Embedding(d.vocab, d.hidden)
        self.pos = nn.Embedding(d.max_position, d.hidden)
        self.types = nn.Embedding(d.types, d.hidden)
        self.norm = nn.LayerNorm(d.hidden, eps=d.eps)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d.hidden, d.heads, d.intermediate, dropout=0.0, activation="gelu",
                layer_norm_eps=d.eps, batch_first=True, norm_first=False)
            for _ in range(d.layers))

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1]).unsqueeze(0)
        x = self.norm(self.word(ids) + self.pos(positions) + self.types(types))
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=(mask == 0))
        return x


def hf_tensors(m: Encoder, d: Dims) -> dict[str, torch.Tensor]:
    """The model's parameters under the Hugging Face BERT names."""
    t: dict[str, torch.Tensor] = {
        "embeddings.word_embeddings.weight": m.word.weight,
        "embeddings.position_embeddings.weight": m.pos.weight,
        "embeddings.token_type_embeddings.weight": m.types.weight,
        "embeddings.LayerNorm.weight": m.norm.weight,
        "embeddings.LayerNorm.bias": m.norm.bias,
    }
    for i, layer in enumerate(m.layers):
        p = f"encoder.layer.{i}."
        qw, kw, vw = layer.self_attn.in_proj_weight.chunk(3)
        qb, kb, vb = layer.self_attn.in_proj_bias.chunk(3)
        t |= {
            p + "attention.self.query.weight": qw, p + "attention.self.query.bias": qb,
            p + "attention.self.key.weight": kw, p + "attention.self.key.bias": kb,
            p + "attention.self.value.weight": vw, p + "attention.self.value.bias": vb,
            p + "attention.output.dense.weight": layer.self_attn.out_proj.weight,
            p + "attention.output.dense.bias": layer.self_attn.out_proj.bias,
            p + "attention.output.LayerNorm.weight": layer.norm1.weight,
            p + "attention.output.LayerNorm.bias": layer.norm1.bias,
            p + "intermediate.dense.weight": layer.linear1.weight,
            p + "intermediate.dense.bias": layer.linear1.bias,
            p + "output.dense.weight": layer.linear2.weight,
            p + "output.dense.bias": layer.linear2.bias,
            p + "output.LayerNorm.weight": layer.norm2.weight,
            p + "output.LayerNorm.bias": layer.norm2.bias,
        }
    return {k: v.detach().contiguous().float() for k, v in t.items()}


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """The safetensors format, written by hand: the library is not in Debian."""
    header: dict[str, object] = {"__metadata__": {"format": "pt", "generator": "golden_encoder.py"}}
    blobs, offset = [], 0
    for name in sorted(tensors):
        data = tensors[name].numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def pool(x: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    if how == "cls":
        return x[:, 0]
    m = mask.unsqueeze(-1).float()
    return (x * m).sum(1) / m.sum(1)


def main(out: Path) -> None:
    torch.manual_seed(SEED)
    d = Dims()
    model = Encoder(d).eval()
    with torch.no_grad():
        # Larger embeddings than nn.Embedding's N(0, 1) keep LayerNorm honest.
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(0.5)

    lengths = [5, 17, 40, 64]
    seq = max(lengths)
    gen = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(4, d.vocab, (len(lengths), seq), generator=gen)
    types = torch.randint(0, d.types, (len(lengths), seq), generator=gen)
    mask = torch.zeros(len(lengths), seq, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        ids[i, n:] = 0
        types[i, n:] = 0

    with torch.no_grad():
        x = model(ids, mask, types)
    cases = []
    for i, n in enumerate(lengths):
        cases.append({
            "input_ids": ids[i, :n].tolist(),
            "token_type_ids": types[i, :n].tolist(),
            "cls": pool(x, mask, "cls")[i].tolist(),
            "mean": pool(x, mask, "mean")[i].tolist(),
        })

    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "weights.safetensors", hf_tensors(model, d))
    (out / "reference.json").write_text(json.dumps({
        "torch": torch.__version__, "seed": SEED, "cases": cases}, indent=None))
    (out / "model.yaml").write_text(f"""# Written by golden_encoder.py: a fixed-seed reference, not a useful model.
architecture: encoder
encoder:
  vocab_size: {d.vocab}
  hidden: {d.hidden}
  layers: {d.layers}
  heads: {d.heads}
  intermediate: {d.intermediate}
  max_position: {d.max_position}
  type_vocab_size: {d.types}
  layer_norm_eps: {d.eps}
  pooling: cls
inputs:
  - {{name: input_ids, datatype: INT64, shape: [-1, -1]}}
  - {{name: attention_mask, datatype: INT64, shape: [-1, -1]}}
  - {{name: token_type_ids, datatype: INT64, shape: [-1, -1]}}
outputs:
  - {{name: embedding, datatype: FP32, shape: [-1, {d.hidden}]}}
buckets:
  batch: [1, 4]
  seq: [32, 64]
""")
    print(f"wrote {out}: {len(cases)} sequences, lengths {lengths}, torch {torch.__version__}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "encoder"))
