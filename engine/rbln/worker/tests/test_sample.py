"""The decoder's in-graph draw: the same float32 bits as the Go sampler
(generation.Uniform) for the 1,000 (seed, position) pairs of
testdata/uniform32.json, in eager torch (1.13 and 2.x) and compiled with
inductor (2.x), in 32-bit integer arithmetic only; under a token mask,
the tokens the Go sampler draws from the masked logits."""

from __future__ import annotations

import json
import math
import random
import struct
import types
import unittest
from pathlib import Path

import torch

from stepserve_worker import compiler, decoder

GOLDEN = Path(__file__).resolve().parent.parent / "testdata" / "uniform32.json"


def int32(values: list[int]) -> torch.Tensor:
    """uint32 values as the int32 words a row carries."""
    return torch.tensor([v - (1 << 32) if v >= 1 << 31 else v for v in values], dtype=torch.int32)


class UniformTest(unittest.TestCase):
    def setUp(self) -> None:
        cases = json.loads(GOLDEN.read_text())
        self.assertEqual(1000, len(cases))
        self.lo = int32([c["seed"] & 0xFFFFFFFF for c in cases])
        self.hi = int32([c["seed"] >> 32 for c in cases])
        self.pos = int32([c["pos"] for c in cases])
        self.want = int32([c["bits"] for c in cases])

    def check(self, got: torch.Tensor) -> None:
        self.assertEqual(torch.float32, got.dtype)
        bits = got.contiguous().view(torch.int32)
        bad = (bits != self.want).nonzero().flatten().tolist()
        self.assertEqual([], bad[:10], f"{len(bad)} of 1000 draws differ from generation.Uniform's")

    def test_eager_draws_as_go(self) -> None:
        self.check(decoder.uniform(self.lo, self.hi, self.pos))

    @unittest.skipUnless(compiler.has_dynamo() and not compiler.inductor_problem(),
                         compiler.inductor_problem() or "torch 1.x: no torch.compile")
    def test_compiled_draws_as_go(self) -> None:
        f = torch.compile(decoder.uniform, fullgraph=True, dynamic=False)
        self.check(f(self.lo, self.hi, self.pos))


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _bits(x: float) -> int:
    return struct.unpack("i", struct.pack("f", x))[0]


def _mix32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def go_uniform(seed: int, pos: int) -> float:
    """generation.Uniform, in Python integers."""
    h = _mix32((pos + 0x9E3779B9) & 0xFFFFFFFF)
    h = _mix32(h ^ (seed >> 32))
    h = _mix32(h ^ (seed & 0xFFFFFFFF))
    return (h >> 8) / (1 << 24)


def go_draw(logits: list[float], temp: float, top_p: float, top_k: int, seed: int, pos: int) -> int:
    """generation.Sampler's token, step for step (float32 probabilities,
    float64 sums): the reference the graph's sampler is held to."""
    temp, top_p = _f32(temp), _f32(top_p)
    if temp < _f32(1e-5):
        return logits.index(max(logits))
    inv, m, n = _f32(1 / temp), max(logits), len(logits)
    probs = [_f32(math.exp(_f32(_f32(v - m) * inv))) for v in logits]
    u0 = go_uniform(seed, pos)
    if not (0 < top_k < n or 0 < top_p < 1):
        u = u0 * sum(probs)
        for i, p in enumerate(probs):
            u -= p
            if u < 0:
                return i
        return n - 1
    idx = sorted(range(n), key=lambda i: (-probs[i], i))
    keep = top_k if 0 < top_k < n else n
    mass = sum(probs[i] for i in idx[:keep])
    if 0 < top_p < 1:
        want, cum = top_p * mass, 0.0
        for k, i in enumerate(idx[:keep]):
            cum += probs[i]
            if cum >= want:
                keep = k + 1
                break
        mass = cum
    u = u0 * mass
    for i in idx[:keep]:
        u -= probs[i]
        if u < 0:
            return i
    return idx[keep - 1]


def graph_draw(logits: list[float], temp: float, top_p: float, top_k: int, seed: int, pos: int) -> int:
    """The decoder's in-graph sampler on one row."""
    V = len(logits)
    fake = types.SimpleNamespace(counting=torch.arange(max(V, 64), dtype=torch.int32), top=min(3, V))
    meta = torch.zeros(1, decoder.FIELDS, dtype=torch.int32)
    meta[0, decoder.TEMPERATURE], meta[0, decoder.TOP_P], meta[0, decoder.TOP_K] = _bits(temp), _bits(top_p), top_k
    meta[0, decoder.SEED_LO] = int32([seed & 0xFFFFFFFF])[0]
    meta[0, decoder.SEED_HI] = int32([seed >> 32])[0]
    meta[0, decoder.POSITION] = pos
    with torch.inference_mode():
        return int(decoder.Decoder.sample(fake, torch.tensor([logits], dtype=torch.float32), meta)[0, 0])


class SampleTest(unittest.TestCase):
    def test_the_graph_samples_as_go(self) -> None:
        # Ties, every edge of top-k and top-p, near-greedy temperatures.
        rng = random.Random(45)
        for case in range(2000):
            V = rng.choice([2, 3, 5, 8, 17, 50])
            if case % 3 == 0:
                logits = [float(rng.randint(0, 3)) for _ in range(V)]
            else:
                logits = [_f32(rng.gauss(0, 2)) for _ in range(V)]
            args = (logits, rng.choice([0.0, 1e-6, 1e-5, 0.5, 1.0, 2.0]), rng.choice([0.0, 1.0, 0.5, 0.9, 1e-9, 0.999, -1.0, 1.5]),
                    rng.choice([0, -1, 1, 2, V - 1, V, V + 5, 1 << 30]), rng.getrandbits(64), rng.randint(0, 5000))
            self.assertEqual(go_draw(*args), graph_draw(*args), args)

    def test_a_draw_near_one_stays_on_a_kept_token(self) -> None:
        # The largest draw, 1 - 2^-24, on a 32,000-token vocabulary whose
        # running sum ends a rounding below its reduced sum: the draw must
        # not be carried past the last token with mass (the least likely,
        # which top-k cut; or the last id, which has almost none).
        seed, pos = 7, 7069537
        self.assertEqual(1 - 2 ** -24, go_uniform(seed, pos))
        rng = random.Random(8)
        logits = [_f32(rng.gauss(0, 1)) for _ in range(32000)]
        logits[-1] = -30.0
        for top_k in (0, 31999):
            want = go_draw(logits, 1.0, 1.0, top_k, seed, pos)
            got = graph_draw(logits, 1.0, 1.0, top_k, seed, pos)
            self.assertNotEqual(31999, got, f"top_k {top_k}: drew the last id")
            self.assertEqual(want, got, f"top_k {top_k}")


def mask_row(allowed: list[bool]) -> torch.Tensor:
    """allowed as a row's mask words: token t is bit t % 32 of word t // 32."""
    words = [0] * decoder.mask_words(len(allowed))
    for t, ok in enumerate(allowed):
        if ok:
            words[t // 32] |= 1 << (t % 32)
    return int32(words)


class MaskTest(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = types.SimpleNamespace(counting=torch.arange(4096, dtype=torch.int32))

    def test_a_masked_row_samples_what_go_samples_from_the_masked_logits(self) -> None:
        # Masks with one token allowed, a few, most; vocabularies across
        # word boundaries (31, 32, 33, 65 tokens); bit 31 of a word (the
        # int32's sign) among them; greedy, cut and uncut draws.
        rng = random.Random(48)
        for case in range(1500):
            V = rng.choice([2, 31, 32, 33, 65, 100])
            share = rng.choice([1 / V, 0.1, 0.5, 0.95])
            allowed = [rng.random() < share for _ in range(V)]
            allowed[rng.randrange(V)] = True
            if V > 31 and case % 5 == 0:
                allowed[31] = True
            logits = [_f32(rng.gauss(0, 2)) for _ in range(V)]
            temp, top_p, top_k = rng.choice([0.0, 0.7, 1.0]), rng.choice([1.0, 0.9]), rng.choice([0, 3, V])
            seed, pos = rng.getrandbits(64), rng.randint(0, 5000)
            with torch.inference_mode():
                got = decoder.Decoder.masked(self.fake, torch.tensor([logits]), mask_row(allowed).unsqueeze(0),
                                             torch.tensor([1], dtype=torch.int32))
            want = [v if ok else float("-inf") for v, ok in zip(logits, allowed)]
            self.assertEqual(want, got[0].tolist())
            args = (temp, top_p, top_k, seed, pos)
            self.assertEqual(go_draw(want, *args), graph_draw(want, *args), (allowed, logits, args))

    def test_an_unflagged_row_is_not_masked(self) -> None:
        logits = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
        words = torch.stack((mask_row([True, False, False]), mask_row([True, False, False])))
        with torch.inference_mode():
            got = decoder.Decoder.masked(self.fake, logits, words, torch.tensor([0, 1], dtype=torch.int32))
        self.assertEqual([[1.0, 2.0, 3.0], [1.0, float("-inf"), float("-inf")]], got.tolist())


if __name__ == "__main__":
    unittest.main()
