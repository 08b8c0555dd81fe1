#!/usr/bin/python3
"""Build the encoder the ONNX Runtime comparison runs, reproducibly.

A random-weight encoder of all-MiniLM-L6-v2's dimensions (vocab 30522,
hidden 384, 6 layers, 12 heads, intermediate 1536), made from the same torch
module as the CPU engine's golden reference (engine/cpufallback/testdata/
golden_encoder.py), written three ways into OUTDIR:

  model/             model.yaml + weights.safetensors: what stepserve loads
  encoder.onnx       the same module with mean pooling, exported by torch
  cases.json         the token ids of every benchmark shape, and for each
  <case>.*.bin       ids, mask (int64) and torch's pooled output (float32)

Not a model to ship: the bench writes it under bench/out (git-ignored).
Debian's python3-torch (1.13) exports ONNX without the onnx package.

    /usr/bin/python3 bench/onnx/make_encoder.py OUTDIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine/cpufallback/testdata"))
import golden_encoder as g  # noqa: E402

SEED = 20261130
DIMS = g.Dims(vocab=30522, hidden=384, heads=12, intermediate=1536, layers=6, max_position=512, types=2, eps=1e-12)
# name, batch, seq, mixed: every token real unless mixed (lengths drawn in [8, seq]).
CASES = [("1x128", 1, 128, False), ("16x128", 16, 128, False), ("64x128", 64, 128, False),
         ("64x32", 64, 32, False), ("16x128-mixed", 16, 128, True)]


class Pooled(nn.Module):
    """The encoder with mean pooling over the mask: stepserve's output."""

    def __init__(self, enc: g.Encoder) -> None:
        super().__init__()
        self.enc = enc

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        x = self.enc(ids, mask, types)
        m = mask.unsqueeze(-1).to(x.dtype)
        return (x * m).sum(1) / m.sum(1)


def main(out: Path) -> None:
    torch.manual_seed(SEED)
    enc = g.Encoder(DIMS).eval()
    with torch.no_grad():
        # N(0, 0.02) matrices like a trained BERT's scale (the golden module's
        # nn.Embedding N(0, 1) would saturate a 6-layer softmax).
        for name, p in enc.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
    model = Pooled(enc).eval()

    (out / "model").mkdir(parents=True, exist_ok=True)
    g.write_safetensors(out / "model/weights.safetensors", g.hf_tensors(enc, DIMS))
    batches = sorted({b for _, b, _, _ in CASES})
    seqs = sorted({s for _, _, s, _ in CASES})
    (out / "model/model.yaml").write_text(f"""# Written by bench/onnx/make_encoder.py: random weights, for the ONNX Runtime comparison.
architecture: encoder
encoder:
  vocab_size: {DIMS.vocab}
  hidden: {DIMS.hidden}
  layers: {DIMS.layers}
  heads: {DIMS.heads}
  intermediate: {DIMS.intermediate}
  max_position: {DIMS.max_position}
  type_vocab_size: {DIMS.types}
  layer_norm_eps: {DIMS.eps}
  pooling: mean
inputs:
  - {{name: input_ids, datatype: INT64, shape: [-1, -1]}}
  - {{name: attention_mask, datatype: INT64, shape: [-1, -1]}}
  - {{name: token_type_ids, datatype: INT64, shape: [-1, -1]}}
outputs:
  - {{name: embedding, datatype: FP32, shape: [-1, {DIMS.hidden}]}}
buckets:
  batch: {batches}
  seq: {seqs}
engine: cpu
""")

    gen = torch.Generator().manual_seed(SEED + 1)
    cases = []
    for name, b, s, mixed in CASES:
        ids = torch.randint(1000, DIMS.vocab, (b, s), generator=gen)
        types = torch.zeros(b, s, dtype=torch.long)
        mask = torch.ones(b, s, dtype=torch.long)
        if mixed:
            lengths = torch.randint(8, s + 1, (b,), generator=gen)
            for i, n in enumerate(lengths.tolist()):
                mask[i, n:] = 0
                ids[i, n:] = 0
        with torch.no_grad():
            ref = model(ids, mask, types)
        (out / f"{name}.ids.bin").write_bytes(ids.numpy().astype("<i8").tobytes())
        (out / f"{name}.mask.bin").write_bytes(mask.numpy().astype("<i8").tobytes())
        (out / f"{name}.torch.bin").write_bytes(ref.numpy().astype("<f4").tobytes())
        cases.append({"name": name, "batch": b, "seq": s, "tokens": int(mask.sum())})

    ids = torch.randint(1000, DIMS.vocab, (2, 16), generator=gen)
    mask = torch.ones(2, 16, dtype=torch.long)
    torch.onnx.export(model, (ids, mask, torch.zeros_like(ids)), str(out / "encoder.onnx"),
                      input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["embedding"],
                      dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                                    "token_type_ids": {0: "batch", 1: "seq"}, "embedding": {0: "batch"}},
                      opset_version=14)
    (out / "cases.json").write_text(json.dumps({"torch": torch.__version__, "seed": SEED, "cases": cases}, indent=1))
    print(f"wrote {out}: encoder.onnx, model/, {len(cases)} cases, torch {torch.__version__}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "bench/out/onnx"))
