"""Trains model_repository/digits-cnn reproducibly: the same rows held out
as the shipped MLP (cmd/serve/testdata/digits-heldout.csv, written by
cmd/train-digits), a fixed seed, one thread and deterministic kernels, so
every run on one machine writes the same weights.safetensors (torch picks
its kernels by CPU, so another CPU writes other bytes of the same quality).
Run from the repository root with `make digits-cnn`.

Prints the held-out accuracy, which the README quotes."""

import argparse
import csv
import gzip
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "engine" / "rbln" / "worker"))

from model import build  # noqa: E402
from stepserve_worker import safetensors  # noqa: E402


def rows(path: Path) -> list[tuple[int, ...]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [tuple(int(v) for v in r) for r in csv.reader(line for line in f if not line.startswith("#")) if r]


def tensors(data: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor([r[:64] for r in data], dtype=torch.float32).reshape(-1, 1, 8, 8)
    y = torch.tensor([r[64] for r in data], dtype=torch.int64)
    return x, y


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/digits.csv.gz")
    ap.add_argument("--heldout", default="cmd/serve/testdata/digits-heldout.csv")
    ap.add_argument("--out", default=str(HERE / "weights.safetensors"))
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--epochs", type=int, default=40)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    held = rows(Path(args.heldout))
    pool = rows(Path(args.data))
    remaining = {}
    for r in held:
        remaining[r] = remaining.get(r, 0) + 1
    train = []
    for r in pool:  # every row but the held-out ones (duplicates counted)
        if remaining.get(r, 0) > 0:
            remaining[r] -= 1
        else:
            train.append(r)
    if any(remaining.values()):
        print("held-out rows missing from the data", file=sys.stderr)
        return 1
    xt, yt = tensors(train)
    xh, yh = tensors(held)

    model = build({})
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(args.seed)
    for _ in range(args.epochs):
        model.train()
        order = torch.randperm(len(xt), generator=g)
        for i in range(0, len(order), 32):
            idx = order[i:i + 32]
            probs = model(xt[idx])
            loss = F.nll_loss(torch.log(probs.clamp_min(1e-12)), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        correct = int((model(xh).argmax(-1) == yh).sum())
    safetensors.save(model.state_dict(), Path(args.out), {"seed": str(args.seed), "epochs": str(args.epochs)})
    print(f"train {len(xt)} rows, held-out {len(xh)} rows, held-out accuracy {correct / len(xh):.4f} ({correct} of {len(xh)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
