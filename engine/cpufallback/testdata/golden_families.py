#!/usr/bin/python3
"""Write the encoder family and head references the engines are checked
against.

Each case is a small fixed-seed model of one family (BERT, RoBERTa,
XLM-RoBERTa, CamemBERT, DistilBERT), with or without a sequence
classification head, built from torch's own modules (nn.Embedding,
nn.LayerNorm, nn.TransformerEncoderLayer: post-norm; nn.Linear heads) and the
family's position rule. It is written as a Hugging Face folder as the Hub
has them (config.json, model.safetensors or shards with their index, the
sentence-transformers files where the case has them, tensors under the
family's names, some the model does not use), with a model.yaml that only
overrides the inputs (token ids) and the buckets, and reference.json: the
outputs torch computes for a padded batch of sequences of several lengths
and for each sequence alone. Run by `make golden` (Debian's python3-torch),
not by the tests: the tests read the committed files.

    /usr/bin/python3 engine/cpufallback/testdata/golden_families.py OUTDIR
"""

from __future__ import annotations

import json
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

SEED = 20261207
VOCAB, HIDDEN, HEADS, INTER, LAYERS = 120, 32, 4, 64, 2
LENGTHS = [5, 17, 40, 64]


@dataclass(frozen=True)
class Case:
    name: str
    family: str  # bert, roberta, xlm-roberta, camembert, distilbert
    architecture: str  # config.json's architectures entry
    act: str = "gelu"  # gelu, gelu_new, relu
    pooling: str = "cls"  # cls, mean, last (embedding models)
    normalize: bool = False
    num_labels: int = 0  # 0: no head
    prefix: bool = True  # tensors under the family's prefix
    shards: int = 1
    sentence_transformers: bool = False  # modules.json and 1_Pooling/config.json
    extra: dict[str, list[int]] = field(default_factory=dict)  # tensors the model does not use: name -> shape

    @property
    def roberta(self) -> bool:
        return self.family in ("roberta", "xlm-roberta", "camembert")

    @property
    def distil(self) -> bool:
        return self.family == "distilbert"

    @property
    def pad(self) -> int:
        return 1 if self.roberta else 0

    @property
    def eps(self) -> float:
        return 1e-5 if self.roberta else 1e-12

    @property
    def max_position(self) -> int:
        return 64 + self.pad + 1 if self.roberta else 64

    @property
    def types(self) -> int:
        return 2 if self.family == "bert" else 1

    @property
    def base(self) -> str:
        if not self.prefix:
            return ""
        return {"bert": "bert.", "distilbert": "distilbert."}.get(self.family, "roberta.")


CASES = [
    Case("bert-classifier", "bert", "BertForSequenceClassification", num_labels=3,
         extra={"bert.embeddings.position_ids": [1, 64]}),
    Case("roberta", "roberta", "RobertaModel", act="gelu_new", pooling="mean",
         extra={"roberta.embeddings.position_ids": [1, 66], "roberta.pooler.dense.weight": [HIDDEN, HIDDEN],
                "roberta.pooler.dense.bias": [HIDDEN], "lm_head.dense.weight": [HIDDEN, HIDDEN]}),
    Case("xlm-roberta-reranker", "xlm-roberta", "XLMRobertaForSequenceClassification", num_labels=1),
    Case("camembert", "camembert", "CamembertModel", act="relu", pooling="last", normalize=True,
         prefix=False, shards=2, sentence_transformers=True),
    Case("distilbert", "distilbert", "DistilBertModel", pooling="mean", sentence_transformers=True),
    Case("distilbert-classifier", "distilbert", "DistilBertForSequenceClassification", act="gelu_new", num_labels=2),
]


def activation(name: str):
    if name == "gelu_new":
        return lambda x: F.gelu(x, approximate="tanh")
    return name  # "gelu" (erf) or "relu", as nn.TransformerEncoderLayer names them


class Model(nn.Module):
    """Embeddings + LayerNorm, torch's post-norm encoder layers, the
    family's pooling or classification head."""

    def __init__(self, c: Case) -> None:
        super().__init__()
        self.c = c
        self.word = nn.Embedding(VOCAB, HIDDEN, padding_idx=c.pad)
        self.pos = nn.Embedding(c.max_position, HIDDEN)
        self.types = None if c.distil else nn.Embedding(c.types, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN, eps=c.eps)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(HIDDEN, HEADS, INTER, dropout=0.0, activation=activation(c.act),
                                       layer_norm_eps=c.eps, batch_first=True, norm_first=False)
            for _ in range(LAYERS))
        if c.num_labels:
            self.dense = nn.Linear(HIDDEN, HIDDEN)
            self.classifier = nn.Linear(HIDDEN, c.num_labels)

    def positions(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.c.roberta:
            return torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
        # HF's create_position_ids_from_input_ids: real tokens count from
        # pad + 1, padding sits at pad.
        real = ids.ne(self.c.pad).long()
        return torch.cumsum(real, dim=1) * real + self.c.pad

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        x = self.word(ids) + self.pos(self.positions(ids))
        if self.types is not None:
            x = x + self.types(types)
        x = self.norm(x)
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=(mask == 0))
        if self.c.num_labels:
            first = x[:, 0]
            h = torch.relu(self.dense(first)) if self.c.distil else torch.tanh(self.dense(first))
            return self.classifier(h)
        if self.c.pooling == "cls":
            pooled = x[:, 0]
        elif self.c.pooling == "last":
            last = mask.sum(1) - 1
            pooled = x[torch.arange(x.shape[0]), last]
        else:
            m = mask.unsqueeze(-1).float()
            pooled = (x * m).sum(1) / m.sum(1)
        return F.normalize(pooled, dim=-1) if self.c.normalize else pooled


def hf_tensors(m: Model, c: Case) -> dict[str, torch.Tensor]:
    """The model's parameters under the family's Hugging Face names."""
    b = c.base
    t: dict[str, torch.Tensor] = {
        b + "embeddings.word_embeddings.weight": m.word.weight,
        b + "embeddings.position_embeddings.weight": m.pos.weight,
        b + "embeddings.LayerNorm.weight": m.norm.weight,
        b + "embeddings.LayerNorm.bias": m.norm.bias,
    }
    if m.types is not None:
        t[b + "embeddings.token_type_embeddings.weight"] = m.types.weight
    if c.distil:
        names = {"q": "attention.q_lin", "k": "attention.k_lin", "v": "attention.v_lin", "o": "attention.out_lin",
                 "n1": "sa_layer_norm", "i": "ffn.lin1", "out": "ffn.lin2", "n2": "output_layer_norm"}
        layer_fmt = b + "transformer.layer.{}."
    else:
        names = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
                 "o": "attention.output.dense", "n1": "attention.output.LayerNorm", "i": "intermediate.dense",
                 "out": "output.dense", "n2": "output.LayerNorm"}
        layer_fmt = b + "encoder.layer.{}."
    for i, layer in enumerate(m.layers):
        p = layer_fmt.format(i)
        qw, kw, vw = layer.self_attn.in_proj_weight.chunk(3)
        qb, kb, vb = layer.self_attn.in_proj_bias.chunk(3)
        for key, w, bias in (("q", qw, qb), ("k", kw, kb), ("v", vw, vb),
                             ("o", layer.self_attn.out_proj.weight, layer.self_attn.out_proj.bias),
                             ("n1", layer.norm1.weight, layer.norm1.bias),
                             ("i", layer.linear1.weight, layer.linear1.bias),
                             ("out", layer.linear2.weight, layer.linear2.bias),
                             ("n2", layer.norm2.weight, layer.norm2.bias)):
            t[p + names[key] + ".weight"] = w
            t[p + names[key] + ".bias"] = bias
    if c.num_labels:
        dense, classifier = {"bert": (b + "pooler.dense", "classifier"),
                             "distilbert": ("pre_classifier", "classifier")}.get(
            c.family, ("classifier.dense", "classifier.out_proj"))
        t |= {dense + ".weight": m.dense.weight, dense + ".bias": m.dense.bias,
              classifier + ".weight": m.classifier.weight, classifier + ".bias": m.classifier.bias}
    out = {k: v.detach().contiguous().float() for k, v in t.items()}
    gen = torch.Generator().manual_seed(SEED + 7)
    for name, shape in c.extra.items():
        if name.endswith("position_ids"):
            out[name] = torch.arange(shape[-1]).reshape(shape)  # I64, as HF checkpoints hold it
        else:
            out[name] = torch.randn(shape, generator=gen)
    return out


_DTYPES = {torch.float32: ("F32", "<f4"), torch.int64: ("I64", "<i8")}


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """The safetensors format, written by hand: the library is not in Debian."""
    header: dict[str, object] = {"__metadata__": {"format": "pt", "generator": "golden_families.py"}}
    blobs, offset = [], 0
    for name in sorted(tensors):
        dtype, np_dtype = _DTYPES[tensors[name].dtype]
        data = tensors[name].numpy().astype(np_dtype).tobytes()
        header[name] = {"dtype": dtype, "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def config_json(c: Case) -> dict[str, object]:
    """config.json as transformers writes it for the family (the keys
    stepserve reads, and a few it ignores)."""
    cfg: dict[str, object] = {"architectures": [c.architecture], "model_type": c.family,
                              "vocab_size": VOCAB, "max_position_embeddings": c.max_position,
                              "pad_token_id": c.pad, "transformers_version": "4.44.0", "torch_dtype": "float32"}
    if c.distil:
        cfg |= {"dim": HIDDEN, "n_layers": LAYERS, "n_heads": HEADS, "hidden_dim": INTER, "activation": c.act,
                "sinusoidal_pos_embds": False, "dropout": 0.1, "seq_classif_dropout": 0.2}
    else:
        cfg |= {"hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
                "intermediate_size": INTER, "hidden_act": c.act, "type_vocab_size": c.types,
                "layer_norm_eps": c.eps, "position_embedding_type": "absolute", "hidden_dropout_prob": 0.1}
    if c.roberta:
        cfg |= {"bos_token_id": 0, "eos_token_id": 2}
    if c.num_labels:
        labels = {1: ["score"], 2: ["negative", "positive"], 3: ["contradiction", "entailment", "neutral"]}[c.num_labels]
        cfg["id2label"] = {str(i): n for i, n in enumerate(labels)}
        cfg["label2id"] = {n: i for i, n in enumerate(labels)}
    return cfg


def write_folder(out: Path, c: Case, tensors: dict[str, torch.Tensor]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config_json(c), indent=2) + "\n")
    if c.shards == 1:
        write_safetensors(out / "model.safetensors", tensors)
    else:
        names = sorted(tensors)
        weight_map = {}
        for s in range(c.shards):
            shard = f"model-{s + 1:05d}-of-{c.shards:05d}.safetensors"
            part = {n: tensors[n] for n in names[s::c.shards]}
            write_safetensors(out / shard, part)
            weight_map |= {n: shard for n in part}
        (out / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")
    if c.sentence_transformers:
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        if c.normalize:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (out / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
        (out / "1_Pooling").mkdir(exist_ok=True)
        (out / "1_Pooling" / "config.json").write_text(json.dumps({
            "word_embedding_dimension": HIDDEN, "pooling_mode_cls_token": c.pooling == "cls",
            "pooling_mode_mean_tokens": c.pooling == "mean", "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
            "pooling_mode_lasttoken": c.pooling == "last", "include_prompt": True}, indent=2) + "\n")
    # Only what config.json and the sentence-transformers files cannot
    # say: token-id inputs (the tests send ids) and small buckets. A case
    # without those files says its pooling here, as a user would.
    lines = [f"# Written by golden_families.py: a fixed-seed {c.family} reference, not a useful model.",
             "# config.json decides the rest; this file only overrides."]
    if not c.num_labels and not c.sentence_transformers:
        lines.append(f"encoder: {{pooling: {c.pooling}, normalize: {str(c.normalize).lower()}}}")
    lines += ["inputs:",
              "  - {name: input_ids, datatype: INT64, shape: [-1, -1]}",
              "  - {name: attention_mask, datatype: INT64, shape: [-1, -1]}",
              "  - {name: token_type_ids, datatype: INT64, shape: [-1, -1]}",
              "buckets: {batch: [1, 4], seq: [32, 64]}", ""]
    (out / "model.yaml").write_text("\n".join(lines))


def main(root: Path) -> None:
    for n, c in enumerate(CASES):
        torch.manual_seed(SEED + 100 * n)
        model = Model(c).eval()
        with torch.no_grad():
            # Larger weights than the defaults keep LayerNorm and the
            # heads honest; the padding row stays the embedding's own.
            for p in model.parameters():
                if p.dim() > 1:
                    p.mul_(0.5)
        seq = max(LENGTHS)
        gen = torch.Generator().manual_seed(SEED + 100 * n + 1)
        ids = torch.randint(c.pad + 3, VOCAB, (len(LENGTHS), seq), generator=gen)
        types = torch.zeros(len(LENGTHS), seq, dtype=torch.long)
        mask = torch.zeros(len(LENGTHS), seq, dtype=torch.long)
        for i, length in enumerate(LENGTHS):
            mask[i, :length] = 1
            ids[i, length:] = c.pad
            if c.family == "bert":
                types[i, length // 2:length] = 1  # a pair: the second text's tokens
        with torch.no_grad():
            batched = model(ids, mask, types)
            alone = [model(ids[i:i + 1, :length], mask[i:i + 1, :length], types[i:i + 1, :length])[0]
                     for i, length in enumerate(LENGTHS)]
        cases = [{"input_ids": ids[i, :length].tolist(), "token_type_ids": types[i, :length].tolist(),
                  "batched": batched[i].tolist(), "alone": alone[i].tolist()}
                 for i, length in enumerate(LENGTHS)]
        out = root / c.name
        write_folder(out, c, hf_tensors(model, c))
        # The load message's encoder spec, as the supervisor sends it
        # (engine/rbln/program.go), for the worker's own tests.
        spec = {"vocab_size": VOCAB, "hidden": HIDDEN, "layers": LAYERS, "heads": HEADS, "intermediate": INTER,
                "max_position": c.max_position, "type_vocab_size": c.types, "layer_norm_eps": c.eps,
                "pooling": "cls" if c.num_labels else c.pooling, "normalize": c.normalize, "family": c.family,
                "hidden_act": c.act, "pad_token_id": c.pad, "head": "classification" if c.num_labels else "none",
                "num_labels": c.num_labels}
        (out / "reference.json").write_text(json.dumps(
            {"torch": torch.__version__, "seed": SEED, "spec": spec, "seq": seq, "cases": cases}))
        print(f"wrote {out}: {c.family}, lengths {LENGTHS}, torch {torch.__version__}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "families"))
