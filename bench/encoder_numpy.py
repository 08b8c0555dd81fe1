#!/usr/bin/python3
"""The OpenBLAS side of the encoder benchmark: the same chain of float32
matrix products as one step of models/tiny-encoder, per bucket, through numpy
(Debian's python3-numpy, linked to OpenBLAS). Counts FLOPs exactly as
cpufallback.EncoderFLOPs does, so that the two GFLOP/s figures compare.

    /usr/bin/python3 bench/encoder_numpy.py
"""

from __future__ import annotations

import time

import numpy as np

HIDDEN, HEADS, INTER, LAYERS = 128, 4, 512, 2
BATCH, SEQ = [1, 4, 16], [32, 64, 128]


def step(x: np.ndarray, w: dict[str, np.ndarray], b: int, s: int) -> np.ndarray:
    d = HIDDEN // HEADS
    for _ in range(LAYERS):
        q, k, v = x @ w["q"].T, x @ w["k"].T, x @ w["v"].T
        qh = q.reshape(b, s, HEADS, d).transpose(0, 2, 1, 3)
        kh = k.reshape(b, s, HEADS, d).transpose(0, 2, 1, 3)
        vh = v.reshape(b, s, HEADS, d).transpose(0, 2, 1, 3)
        scores = qh @ kh.transpose(0, 1, 3, 2)
        ctx = (scores @ vh).transpose(0, 2, 1, 3).reshape(b * s, HIDDEN)
        x = ctx @ w["o"].T
        h = x @ w["i"].T
        x = h @ w["f"].T
    return x


def flops(b: int, s: int) -> float:
    t = b * s
    return LAYERS * (2 * t * HIDDEN * HIDDEN * 4 + 2 * t * HIDDEN * INTER * 2 + 2 * b * s * s * HIDDEN * 2)


def main() -> None:
    rng = np.random.default_rng(0)
    w = {n: rng.standard_normal(shape, dtype=np.float32) * 0.02 for n, shape in
         {"q": (HIDDEN, HIDDEN), "k": (HIDDEN, HIDDEN), "v": (HIDDEN, HIDDEN), "o": (HIDDEN, HIDDEN),
          "i": (INTER, HIDDEN), "f": (HIDDEN, INTER)}.items()}
    print("bucket\tseq/s\tGFLOP/s")
    for b in BATCH:
        for s in SEQ:
            x = rng.standard_normal((b * s, HIDDEN), dtype=np.float32)
            step(x, w, b, s)
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < 0.5:
                step(x, w, b, s)
                n += 1
            sec = (time.perf_counter() - start) / n
            print(f"b{b}xs{s}\t{b / sec:.0f}\t{flops(b, s) / sec / 1e9:.2f}")


if __name__ == "__main__":
    main()
