"""The decoder's in-graph draw: the same float32 bits as the Go sampler
(generation.Uniform) for the 1,000 (seed, position) pairs of
testdata/uniform32.json, in eager torch (1.13 and 2.x) and compiled with
inductor (2.x), in 32-bit integer arithmetic only."""

from __future__ import annotations

import json
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


if __name__ == "__main__":
    unittest.main()
