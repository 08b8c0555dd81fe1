#!/usr/bin/python3
"""The OpenBLAS side of the engine benchmark: the same chains of float32
matrix products as one step of the shipped models, per bucket, through numpy
(Debian's python3-numpy with libopenblas0). FLOPs are counted exactly as
cpufallback.EncoderFLOPs and the digits benchmark count them, so that the
GFLOP/s figures compare. Prints: model, bucket, rows/s, GFLOP/s.

    /usr/bin/python3 bench/encoder_numpy.py
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

HIDDEN, HEADS, INTER, LAYERS = 128, 4, 512, 2


def encoder_step(x: np.ndarray, w: dict[str, np.ndarray], b: int, s: int) -> np.ndarray:
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


def encoder_flops(b: int, s: int) -> float:
    t = b * s
    return LAYERS * (2 * t * HIDDEN * HIDDEN * 4 + 2 * t * HIDDEN * INTER * 2 + 2 * b * s * s * HIDDEN * 2)


def timed(fn: Callable[[], object], seconds: float = 0.4, rounds: int = 3) -> float:
    """Seconds per call: the best of a few rounds, so that a moment of
    interference from the rest of the machine does not count against
    OpenBLAS."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            fn()
            n += 1
        best = min(best, (time.perf_counter() - start) / n)
    return best


def main() -> None:
    rng = np.random.default_rng(0)
    f32 = lambda *shape: rng.standard_normal(shape, dtype=np.float32) * 0.02  # noqa: E731
    w1, w2 = f32(128, 64), f32(10, 128)
    for b in (1, 4, 16, 32):
        x = f32(b, 64)
        sec = timed(lambda: (x @ w1.T) @ w2.T)
        print(f"digits\tb{b}\t{b / sec:.0f}\t{2 * b * (64 * 128 + 128 * 10) / sec / 1e9:.2f}")
    w = {"q": f32(HIDDEN, HIDDEN), "k": f32(HIDDEN, HIDDEN), "v": f32(HIDDEN, HIDDEN), "o": f32(HIDDEN, HIDDEN),
         "i": f32(INTER, HIDDEN), "f": f32(HIDDEN, INTER)}
    for b in (1, 4, 16, 64):
        for s in (32, 64, 128):
            x = f32(b * s, HIDDEN)
            sec = timed(lambda: encoder_step(x, w, b, s))
            print(f"tiny-encoder\tb{b}xs{s}\t{b / sec:.0f}\t{encoder_flops(b, s) / sec / 1e9:.2f}")


if __name__ == "__main__":
    main()
