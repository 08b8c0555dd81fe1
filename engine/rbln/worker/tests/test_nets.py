"""Numerics of the nets in the device dtypes. torch 1.13's CPU has bfloat16
kernels for every op the nets use, but float16 ones only for element-wise
and indexing ops (no matmul, layer_norm, softmax or clamp): the encoder runs
whole in bfloat16 here, and float16 is tested on the mask and eps that
broke it."""

import json
import unittest
from pathlib import Path

import torch
from torch.nn import functional as F

from stepserve_worker import nets, safetensors

HERE = Path(__file__).resolve().parent
REF_DIR = HERE.parents[3] / "engine" / "cpufallback" / "testdata" / "encoder"
HALF = (torch.float16, torch.bfloat16)


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.cosine_similarity(a.double(), b.double(), dim=-1)


class MaskTest(unittest.TestCase):
    # Row 0: every key padded (a warm-up row of zeros); row 1: half padded.
    mask = torch.tensor([[0, 0, 0, 0], [1, 1, 0, 0]])
    pad = (mask == 0)[:, None, None, :]
    scores32 = torch.tensor([[[[0.5, -2.0, 3.0, -7.5]]], [[[1.0, -3.0, -60000.0, 2.5]]]])

    def weights(self, dtype: torch.dtype) -> torch.Tensor:
        """The attention weights from scores in dtype. Softmax has no float16
        kernel on torch's CPU: the float16 masked scores are exact in
        float32, so softmax runs there on exactly the values the device gets."""
        masked = nets.masked_scores(self.scores32.to(dtype), self.pad)
        self.assertEqual(dtype, masked.dtype)
        self.assertTrue(torch.isfinite(masked).all(), f"{dtype}: {masked}")
        if dtype == torch.float16:
            return torch.softmax(masked.float(), dim=-1)
        return torch.softmax(masked, dim=-1).float()

    def test_finite_in_every_dtype(self) -> None:
        want = self.weights(torch.float32)
        for dtype in HALF:
            with self.subTest(dtype=dtype):
                got = self.weights(dtype)
                self.assertTrue(torch.isfinite(got).all(), f"{dtype}: {got}")
                self.assertTrue(torch.equal(got[1, ..., 2:], torch.zeros_like(got[1, ..., 2:])),
                                "padded keys get no weight")
                torch.testing.assert_close(got[0], torch.full_like(got[0], 0.25), msg="an all-padding row is uniform")
                self.assertLess((got - want).abs().max().item(), 1e-2, f"{dtype} against float32")

    def test_additive_mask_was_nan_in_float16(self) -> None:
        # Why the mask is a masked_fill: the first release's (1 - mask) * -1e9
        # is -inf in float16, and a real key's 0 x -inf is NaN.
        additive = (1 - self.mask.to(torch.float16)) * torch.tensor(-1e9, dtype=torch.float16)
        self.assertTrue(torch.isnan(additive[1, :2]).all())


class EpsTest(unittest.TestCase):
    def test_eps_never_rounds_to_zero(self) -> None:
        for dtype in (torch.float32, *HALF):
            eps = nets.safe_eps(1e-12, dtype)
            self.assertGreater(torch.tensor(eps, dtype=dtype).item(), 0, dtype)
        self.assertEqual(0, torch.tensor(1e-12, dtype=torch.float16).item(), "the model's own eps is 0 in float16")
        self.assertEqual(1e-12, nets.safe_eps(1e-12, torch.float32), "float32 keeps the model's eps")

    def test_constant_and_zero_rows_stay_finite(self) -> None:
        ln = nets.LayerNorm(64, eps=1e-12)
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.stack([torch.zeros(64), torch.full((64,), 3.0), torch.randn(64)]).to(dtype)
            with torch.no_grad():
                y = ln.to(dtype)(x)
            self.assertTrue(torch.isfinite(y).all(), dtype)
            n = nets.normalize(torch.stack([torch.zeros(64), torch.randn(64) * 1e3]).to(dtype))
            self.assertTrue(torch.equal(n[0], torch.zeros_like(n[0])), f"{dtype}: a zero row stays zero")
            self.assertAlmostEqual(1.0, n[1].float().norm().item(), delta=1e-2)

    def test_normalize_matches_torch(self) -> None:
        x = torch.randn(5, 128) * 20
        torch.testing.assert_close(nets.normalize(x), F.normalize(x, dim=-1, eps=1e-12))


class EncoderDtypeTest(unittest.TestCase):
    """The reference encoder in bfloat16 against itself in float32, padding
    rows included."""

    def test_bfloat16_matches_float32(self) -> None:
        tensors = safetensors.load(REF_DIR / "weights.safetensors")
        cases = json.loads((REF_DIR / "reference.json").read_text())["cases"]
        cfg = {"vocab_size": 100, "hidden": 64, "layers": 2, "heads": 4, "intermediate": 128,
               "max_position": 64, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "normalize": True}
        seq = max(len(c["input_ids"]) for c in cases)
        rows = [(c["input_ids"], c["token_type_ids"]) for c in cases] + [([], [])]  # the last: all padding
        ids = torch.tensor([i + [0] * (seq - len(i)) for i, _ in rows])
        types = torch.tensor([t + [0] * (seq - len(t)) for _, t in rows])
        mask = torch.tensor([[1] * len(i) + [0] * (seq - len(i)) for i, _ in rows])
        for pooling in ("cls", "mean"):
            model = nets.Encoder(dict(cfg, pooling=pooling), tensors).eval()
            with torch.no_grad():
                want = model(ids, mask, types)
                got = model.to(torch.bfloat16)(ids, mask, types).float()
            self.assertTrue(torch.isfinite(got).all(), f"{pooling}: {got}")
            cos = cosine(got[:-1], want[:-1])
            self.assertGreaterEqual(cos.min().item(), 0.999, f"{pooling}: cosine per row {cos.tolist()}")


FAMILIES_DIR = HERE.parents[3] / "engine" / "cpufallback" / "testdata" / "families"


class FamiliesTest(unittest.TestCase):
    """Every family and head (golden_families.py's references, HF folders)
    built from the load message's encoder spec: float32 matches torch's own
    modules, bfloat16 stays close, and the step boundary is num_labels wide
    for a classification head."""

    def test_families_match_reference(self) -> None:
        for case in sorted(p.name for p in FAMILIES_DIR.iterdir()):
            with self.subTest(case=case):
                ref = json.loads((FAMILIES_DIR / case / "reference.json").read_text())
                spec, seq, cases = ref["spec"], ref["seq"], ref["cases"]
                files = sorted(FAMILIES_DIR.joinpath(case).glob("model*.safetensors"))
                tensors = safetensors.load_all(files, skip={"lm_head.dense.weight"})
                self.assertNotIn("lm_head.dense.weight", tensors, "a skipped tensor is not read")
                pad = spec["pad_token_id"]
                ids = torch.tensor([c["input_ids"] + [pad] * (seq - len(c["input_ids"])) for c in cases])
                types = torch.tensor([c["token_type_ids"] + [0] * (seq - len(c["input_ids"])) for c in cases])
                mask = torch.tensor([[1] * len(c["input_ids"]) + [0] * (seq - len(c["input_ids"])) for c in cases])
                model = nets.build({"architecture": "encoder", "encoder": spec}, tensors).eval()
                with torch.no_grad():
                    got = model(ids, mask, types)
                    half = model.to(torch.bfloat16)(ids, mask, types).float()
                want = torch.tensor([c["batched"] for c in cases])
                self.assertLess((got - want).abs().max().item(), 1e-4)
                if want.shape[1] > 1:
                    self.assertGreaterEqual(cosine(half, want).min().item(), 0.999)
                width = spec["num_labels"] if spec["head"] == "classification" else spec["hidden"]
                bound = nets.boundary({"architecture": "encoder", "encoder": spec}, nets.Shape(4, 64), torch.bfloat16)
                self.assertEqual((width, 64), (bound.out_cols, bound.out_row))

    def test_missing_head_is_named(self) -> None:
        ref = json.loads((FAMILIES_DIR / "xlm-roberta-reranker" / "reference.json").read_text())
        tensors = safetensors.load(FAMILIES_DIR / "xlm-roberta-reranker" / "model.safetensors",
                                   skip={"classifier.out_proj.weight"})
        with self.assertRaisesRegex(nets.LoadError, r"'classifier.out_proj.weight' is missing \(want shape \[1, 32\]\)"):
            nets.build({"architecture": "encoder", "encoder": ref["spec"]}, tensors)


class StepBodyTest(unittest.TestCase):
    """The step graph's boundary: [batch, in_row] in, [batch, out_row] out,
    rows padded to multiples of 64, in the dtypes the staging holds."""

    def test_mlp_slices_its_input_and_pads_its_output(self) -> None:
        torch.manual_seed(0)
        tensors = {"layers.0.weight": torch.randn(8, 4), "layers.0.bias": torch.randn(8),
                   "layers.1.weight": torch.randn(3, 8), "layers.1.bias": torch.randn(3)}
        spec = {"architecture": "mlp", "mlp": {"sizes": [4, 8, 3]}}
        model = nets.build(spec, tensors).eval().to(torch.bfloat16)
        bound = nets.boundary(spec, nets.Shape(2, 0), torch.bfloat16)
        self.assertEqual((torch.bfloat16, 4, 64, torch.bfloat16, 3, 64),
                         (bound.in_dtype, bound.in_cols, bound.in_row, bound.out_dtype, bound.out_cols, bound.out_row))
        x = torch.randn(2, 4).to(torch.bfloat16)
        # Go zeroes the padding; anything there must be ignored anyway.
        staged = torch.cat([x, torch.full((2, 60), 1e3, dtype=torch.bfloat16)], 1)
        with torch.no_grad():
            y = nets.step_body(model, nets.Shape(2, 0), bound)(staged)
            want = model(x)
        self.assertEqual((torch.bfloat16, (2, 64)), (y.dtype, tuple(y.shape)))
        self.assertTrue(torch.equal(want, y[:, :3]))
        self.assertTrue(torch.equal(torch.zeros(2, 61, dtype=torch.bfloat16), y[:, 3:]), "the padding is zeros")

    def test_encoder_reads_int32_token_rows(self) -> None:
        tensors = safetensors.load(REF_DIR / "weights.safetensors")
        cfg = {"vocab_size": 100, "hidden": 64, "layers": 2, "heads": 4, "intermediate": 128,
               "max_position": 64, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pooling": "mean"}
        spec = {"architecture": "encoder", "encoder": cfg}
        shape = nets.Shape(2, 32)
        bound = nets.boundary(spec, shape, torch.bfloat16)
        self.assertEqual((torch.int32, 96, 128, 64, 64),
                         (bound.in_dtype, bound.in_cols, bound.in_row, bound.out_cols, bound.out_row))
        torch.manual_seed(1)
        ids = torch.randint(1, 100, (2, 32))
        mask = torch.ones(2, 32, dtype=torch.int64)
        mask[1, 20:] = 0
        types = torch.zeros(2, 32, dtype=torch.int64)
        types[0, 10:] = 1
        # One row per sequence: its ids, mask and type ids side by side,
        # then zeros to 128, as Go packs them.
        staged = torch.zeros(2, 128, dtype=torch.int32)
        staged[:, :96] = torch.cat([ids, mask, types], 1)
        model = nets.build(spec, tensors).eval().to(torch.bfloat16)
        with torch.no_grad():
            got = nets.step_body(model, shape, bound)(staged)
            want = model(ids, mask, types)
        self.assertEqual((torch.bfloat16, (2, 64)), (got.dtype, tuple(got.shape)))
        self.assertTrue(torch.equal(want, got), "int32 ids embed as int64 ones do")


if __name__ == "__main__":
    unittest.main()
