"""Compiled step graphs for real: torch.compile with inductor on the host
CPU, graph breaks, recompiles and the step audit, with torch's own Dynamo
(no double). They need torch 2.x: make test runs them in the torch 2.x
root (engine/rbln/worker/torch2), where they must run, and skips them on
Debian 12's torch 1.13 saying so."""

from __future__ import annotations

import gc
import math
import os
import re
import sys
import unittest
import weakref
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "testdata" / "fake_torch_rbln"))

from stepserve_worker import audit, compiler, decoder, nets  # noqa: E402
from stepserve_worker.worker import Worker  # noqa: E402

from tests.test_worker import Fixture  # noqa: E402

#: Set by make test where the root's torch 2.x runs these: a skip there is
#: a failure.
REQUIRED_ENV = "REQUIRE_COMPILE_TESTS"

HAVE = compiler.has_dynamo() and not compiler.inductor_problem()
WHY = compiler.inductor_problem() or "inductor works"


def setUpModule() -> None:
    print(f"\ntest_compile: torch {torch.__version__}: {'compiling with inductor' if HAVE else 'skipped: ' + WHY}",
          file=sys.stderr)
    if not HAVE and os.environ.get(REQUIRED_ENV):
        raise RuntimeError(f"{REQUIRED_ENV} is set, but these tests cannot compile here: {WHY}")


def body_of(module: nn.Module, name: str):
    def body(x: torch.Tensor) -> torch.Tensor:
        return module(x)
    return nets.own_code(body, name)


class HostRead(nn.Module):
    """A forward that reads a value on the host: its graph breaks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        if float(y.max()) > 1:  # the break
            y = y + 1
        return y


class Counting(nn.Module):
    """A forward whose compiled guard stops holding: it bakes in a Python
    attribute it changes every call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * self.calls


@unittest.skipUnless(HAVE, WHY)
class ProgramTest(unittest.TestCase):
    def program(self, module: nn.Module, name: str, strict: bool = True) -> compiler.Program:
        p = compiler.Program("b4", "step", compiler.INDUCTOR, strict, refuse_findings=False)
        p.compile(body_of(module, name), {})
        return p

    def test_a_whole_step_is_one_graph_and_agrees_with_eager(self) -> None:
        torch.manual_seed(0)
        mlp = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)).eval()
        p = self.program(mlp, "whole_step")
        x = torch.randn(4, 64)
        with torch.inference_mode():
            for _ in range(3):
                got = p.run(x)
                self.assertEqual((0, 0), (p.step_recompiles, p.step_fallbacks))
            want = mlp(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        r = p.report()
        self.assertEqual(("inductor", True, 1, 0, 0), (r["compiler"], r["built"], r["graphs"], r["graph_breaks"], r["recompiles"]))
        self.assertGreater(r["compile_seconds"], 0)
        self.assertIn(r["cache_hit"], (True, False))
        self.assertEqual({}, r["audit"]["by_rule"], r["audit"])

    def test_a_host_read_breaks_the_graph_strictly_refused(self) -> None:
        p = self.program(HostRead(), "host_read_strict")
        with self.assertRaises(compiler.CompileRefused) as cm, torch.inference_mode():
            p.run(torch.ones(4, 64))
        msg = str(cm.exception)
        self.assertIn("bucket b4: the step graph breaks at tests/test_compile.py:", msg)
        self.assertIn("if float(y.max()) > 1:", msg)
        r = p.report()
        self.assertEqual(1, r["graph_breaks"])
        self.assertFalse(r["built"])

    def test_a_host_read_served_counts_a_fallback_every_step(self) -> None:
        p = self.program(HostRead(), "host_read_lenient", strict=False)
        with torch.inference_mode():
            for _ in range(3):
                out = p.run(torch.ones(4, 64))
                self.assertEqual(1, p.step_fallbacks, "every step falls back at the break")
        self.assertTrue(torch.equal(out, torch.full((4, 64), 3.0)))
        r = p.report()
        self.assertEqual(1, r["graph_breaks"])
        self.assertGreaterEqual(r["graphs"], 2)
        line = HostRead.forward.__code__.co_firstlineno + 2
        self.assertEqual(f"tests/test_compile.py:{line}", r["breaks"][0]["line"])
        self.assertIn("item", r["breaks"][0]["reason"])
        self.assertEqual(1, r["audit"]["by_rule"].get("host_read"), r["audit"])

    def test_a_guard_that_stops_holding_recompiles(self) -> None:
        m = Counting()
        p = self.program(m, "counting")
        with torch.inference_mode():
            p.run(torch.ones(4, 64))
            self.assertEqual(0, p.step_recompiles, "the first run builds: not a recompile")
            p.run(torch.ones(4, 64))
        self.assertEqual(1, p.step_recompiles)
        r = p.report()
        self.assertEqual((2, 1), (r["graphs"], r["recompiles"]))
        self.assertIn("calls", " ".join(r["recompile_reasons"]), "Dynamo's guard failure names the attribute")

    def test_a_steps_own_error_is_not_a_compilers(self) -> None:
        class Mismatch(nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x @ torch.ones(3, 3)  # [4, 64] @ [3, 3]: the step is wrong

        for strict in (True, False):
            p = self.program(Mismatch(), f"mismatch_{strict}", strict=strict)
            with self.assertRaises(RuntimeError) as cm, torch.inference_mode():
                p.run(torch.ones(4, 64))
            self.assertNotIsInstance(cm.exception, compiler.CompileRefused, "the step's error, as eager raises it")
            self.assertIn("cannot be multiplied", str(cm.exception))
            r = p.report()
            self.assertEqual(("inductor", False, ""), (r["compiler"], r["built"], r.get("error", "")),
                             "not called a compiler's failure")

    def test_the_rbln_engine_refuses_a_step_with_findings(self) -> None:
        # A stand-in for torch_rbln's backend, registered as "rbln": the
        # real Dynamo in front of it, the graph run as captured behind it.
        if "rbln" not in torch._dynamo.list_backends(exclude_tags=()):
            torch._dynamo.register_backend(name="rbln")(lambda gm, example_inputs, **kw: gm.forward)

        class Ramp(nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x + torch.arange(64, dtype=x.dtype)  # made in the step

        strict = compiler.Program("b4", "step", compiler.RBLN, True, refuse_findings=True)
        strict.compile(body_of(Ramp(), "ramp_strict"), {})
        with self.assertRaises(compiler.CompileRefused) as cm, torch.inference_mode():
            strict.run(torch.ones(4, 64))
        line = Ramp.forward.__code__.co_firstlineno + 1
        self.assertIn(f"the step audit found created_in_step (arange at tests/test_compile.py:{line})", str(cm.exception))
        self.assertIn("bucket b4", str(cm.exception))

        lenient = compiler.Program("b4", "step", compiler.RBLN, False, refuse_findings=False)
        lenient.compile(body_of(Ramp(), "ramp_lenient"), {})
        with torch.inference_mode():
            out = lenient.run(torch.ones(4, 64))
        self.assertEqual(64.0, float(out[0, -1]))
        self.assertEqual(1, lenient.report()["audit"]["by_rule"]["created_in_step"])

    def test_only_an_operators_own_indices_are_widened(self) -> None:
        # sort's and max's indices, narrowed at once, are listed as
        # widened; max's values of an int64 tensor, arithmetic the step
        # chose, are a finding.
        class Indices(nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                order = torch.sort(x, dim=-1)[1].to(torch.int32)
                best = x.max(dim=-1)[1].to(torch.int32).unsqueeze(-1)
                wide = (x * 8).to(torch.int64).max(dim=-1)[0].to(torch.int32).unsqueeze(-1)
                return (order + best + wide).float()

        p = compiler.Program("b4", "step", compiler.INDUCTOR, strict=True, refuse_findings=False)
        p.compile(body_of(Indices(), "indices_audit"), {})
        with torch.inference_mode():
            p.run(torch.rand(4, 64))
        found = p.report()["audit"]
        self.assertEqual({("sort", "widened"), ("max", "widened")}, {(w["op"], w["rule"]) for w in found["widened"]}, found)
        int64 = [f for f in found["findings"] if f["rule"] == "int64"]
        self.assertTrue(int64, found)
        self.assertIn("wide = ", " ".join(f.get("code", "") for f in int64), found)

    def test_the_decoder_steps_compile_whole_and_pass_the_audit(self) -> None:
        # GQA (4 query heads over 2), a sliding window shorter than the
        # context, tied and untied heads, q/k/v biases: every decoder
        # family's step, decode and prefill, in a context partition
        # narrower than the cache and in the whole of it, and a decode
        # step's masked twin (structured output).
        for tied, bias, window, shapes in ((True, False, 0, ((1, 16, False), (4, 0, False), (1, 16, True), (4, 0, True))),
                                           (False, True, 6, ((1, 0, False), (1, 0, True)))):
            dec = small_decoder(tied=tied, qkv_bias=bias, window=window)
            for T, C, masked in shapes:
                with self.subTest(tied=tied, bias=bias, window=window, T=T, C=C, masked=masked):
                    x = decoder_rows(dec, B=3, T=T, masked=masked)
                    staged, body = decoder_body(dec, x, nets.Shape(3, T, C, masked), f"dec_{int(tied)}_{T}_{C}_{int(masked)}")
                    p = compiler.Program(f"b3xs{T}", "decode" if T == 1 else "prefill", compiler.INDUCTOR,
                                         strict=True, refuse_findings=True)
                    p.compile(body, {})
                    cache = [(L.keys.clone(), L.values.clone()) for L in dec.layers]
                    with torch.inference_mode():
                        got = p.run(staged.clone())
                        again = p.run(staged.clone())
                    for L, (k, v) in zip(dec.layers, cache):
                        L.keys.copy_(k)
                        L.values.copy_(v)
                    with torch.inference_mode():
                        want = body(staged.clone())
                    rep = p.report()
                    self.assertEqual((1, 0, 0), (rep["graphs"], rep["graph_breaks"], rep["recompiles"]), rep)
                    self.assertEqual(0, rep["audit"]["total"], rep["audit"])
                    widened = {w["op"] for w in rep["audit"].get("widened", [])}
                    self.assertLessEqual(widened, {"argmax", "sort", "topk"}, rep["audit"])
                    # Tokens and top tokens as eager torch's; log-probs to
                    # float32 rounding.
                    self.assertTrue(torch.equal(got, again))
                    k = dec.top
                    self.assertTrue(torch.equal(want[:, :1], got[:, :1]), (want, got))
                    self.assertTrue(torch.equal(want[:, 2:2 + k], got[:, 2:2 + k]))
                    lp = lambda t: torch.cat((t[:, 1:2], t[:, 2 + k:2 + 2 * k]), 1).contiguous().view(torch.float32)
                    torch.testing.assert_close(lp(got), lp(want), rtol=1e-5, atol=1e-5)
                    if masked and T > 1:
                        # A scoring prefill step: the scores as eager
                        # torch's, every log-probability at most 0.
                        n = decoder.score_words(T)
                        s = got[:, 2 + 2 * k:2 + 2 * k + n].reshape(3, T, 1 + 2 * decoder.PROMPT_TOP)
                        w = want[:, 2 + 2 * k:2 + 2 * k + n].reshape(3, T, 1 + 2 * decoder.PROMPT_TOP)
                        self.assertTrue(torch.equal(s[:, :, 1:1 + decoder.PROMPT_TOP], w[:, :, 1:1 + decoder.PROMPT_TOP]))
                        lps = lambda t: torch.cat((t[:, :, :1], t[:, :, 1 + decoder.PROMPT_TOP:]), -1).contiguous().view(torch.float32)
                        torch.testing.assert_close(lps(s), lps(w), rtol=1e-5, atol=1e-5)
                        self.assertTrue(bool((lps(s) <= 0).all()))
                    elif masked:
                        # Rows 0 and 2 sample among their masks' tokens.
                        self.assertIn(int(got[0, 0]), MASKED_ROW0)
                        self.assertEqual(MASKED_ROW2, int(got[2, 0]))

    def test_the_kv_cache_is_written_in_place(self) -> None:
        # The step writes its tokens' keys into the layer's own buffer
        # (the same storage before and after, no copy swapped in), at the
        # rows' slots and nowhere else.
        dec = small_decoder(tied=True, qkv_bias=False, window=0)
        x = decoder_rows(dec, B=2, T=4)
        staged, body = decoder_body(dec, x, nets.Shape(2, 4, 0), "dec_in_place")
        p = compiler.Program("b2xs4", "prefill", compiler.INDUCTOR, strict=True, refuse_findings=True)
        p.compile(body, {})
        keys = dec.layers[0].keys
        ptr = keys.data_ptr()
        with torch.inference_mode():
            p.run(staged)
        self.assertIs(keys, dec.layers[0].keys)
        self.assertEqual(ptr, dec.layers[0].keys.data_ptr())
        written = set(x[:, 8:12].reshape(-1).tolist())
        touched = {i for i in range(keys.shape[0]) if keys[i].abs().sum() > 0}
        self.assertEqual(written, touched)

    def test_no_step_copies_the_kv_cache(self) -> None:
        # Inductor's code for a decode step allocates nothing the size of a
        # layer's key or value buffer, and no loop of it runs over the
        # whole buffer: the cache is written where it lies, by slot, not
        # copied out, updated and copied back (nor rewritten in place).
        from torch._inductor.utils import run_and_get_code
        dec = small_decoder(tied=True, qkv_bias=False, window=0)
        x = decoder_rows(dec, B=2, T=1)
        staged, body = decoder_body(dec, x, nets.Shape(2, 1, 8), "dec_no_copy")
        with torch.inference_mode():
            _, codes = run_and_get_code(torch.compile(body, fullgraph=True, dynamic=False), staged)
        code = "\n".join(codes)
        shapes = re.findall(r"empty_strided_cpu\(\(([0-9, ]*)\)", code)
        self.assertTrue(shapes, "no buffer allocations found in inductor's code: its format changed")
        sizes = [math.prod(int(d) for d in s.split(",") if d.strip()) for s in shapes]
        cache = dec.layers[0].keys.numel()
        self.assertLess(max(sizes), cache, f"a buffer of {max(sizes)} elements, a layer's cache is {cache}")
        self.assertNotIn("aten.copy_", code)
        slots, kvh, hd = dec.layers[0].keys.shape
        bounds = {int(n) for n in re.findall(r"for\s*\([^;]*;[^;<]*<\s*(?:static_cast<int64_t>\()?(\d+)L", code)}
        self.assertTrue(bounds, "no loop bounds found in inductor's code: its format changed")
        self.assertFalse(bounds & {slots, slots * kvh, slots * kvh * hd},
                         f"a loop over the whole cache ({slots} slots): bounds {sorted(bounds)}")


class DecoderTest(unittest.TestCase):
    """The decoder's step on either torch, eager."""

    def test_a_context_partition_computes_what_the_whole_context_does(self) -> None:
        # Rows whose sequences fit 16 positions: the same tokens,
        # log-probabilities and cache writes reading 4 blocks as reading
        # all 8, with and without a sliding window (what a partition
        # leaves out is masked, so it weighs exactly nothing).
        for window in (0, 6):
            dec = small_decoder(tied=False, qkv_bias=True, window=window)
            for T in (1, 4):
                with self.subTest(window=window, T=T):
                    x = decoder_rows(dec, B=3, T=T)  # positions up to 10 + T - 1 < 16
                    cache = [(L.keys.clone(), L.values.clone()) for L in dec.layers]
                    with torch.inference_mode():
                        narrow = dec.step(x.clone(), T, 16)
                        written = [(L.keys.clone(), L.values.clone()) for L in dec.layers]
                        for L, (k, v) in zip(dec.layers, cache):
                            L.keys.copy_(k)
                            L.values.copy_(v)
                        whole = dec.step(x.clone(), T, 0)
                    # Tokens and top tokens the same; log-probabilities to
                    # float32 rounding (a BLAS may sum a longer contraction
                    # in another order, its extra terms all zero).
                    k = dec.top
                    ids = lambda t: torch.cat((t[:, :1], t[:, 2:2 + k]), 1)
                    lp = lambda t: torch.cat((t[:, 1:2], t[:, 2 + k:]), 1).contiguous().view(torch.float32)
                    self.assertTrue(torch.equal(ids(narrow), ids(whole)), (narrow, whole))
                    torch.testing.assert_close(lp(narrow), lp(whole), rtol=1e-6, atol=1e-6)
                    for L, (k, v) in zip(dec.layers, written):
                        self.assertTrue(torch.equal(L.keys, k) and torch.equal(L.values, v))

    def test_a_step_refuses_what_it_cannot_index(self) -> None:
        dec = small_decoder(tied=True, qkv_bias=False, window=0)
        x = decoder_rows(dec, B=2, T=1)
        with self.assertRaisesRegex(ValueError, "want a multiple of the block size 4"):
            dec.step(x, 1, 6)
        with self.assertRaisesRegex(ValueError, "up to 32"):
            dec.step(x, 1, 64)


def small_decoder(tied: bool, qkv_bias: bool, window: int) -> decoder.Decoder:
    """A random 2-layer decoder of 4 query heads over 2 key/value heads,
    blocks of 4 tokens, 8 blocks a sequence."""
    spec = {"vocab": 64, "hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 16,
            "intermediate": 128, "rms_norm_eps": 1e-6, "block_size": 4, "table_width": 8, "blocks": 24,
            "top_logprobs": 3, "lanes": 4, "tied": tied, "qkv_bias": qkv_bias, "o_bias": False, "sliding_window": window,
            "inv_freq": [1.0 / (10000 ** (i / 16)) for i in range(0, 16, 2)]}
    g = torch.Generator().manual_seed(0)
    rnd = lambda *shape: torch.randn(*shape, generator=g)
    tensors = {"model.embed_tokens.weight": rnd(64, 64), "model.norm.weight": torch.ones(64)}
    if not tied:
        tensors["lm_head.weight"] = rnd(64, 64) * 0.3
    for i in range(2):
        pre = f"model.layers.{i}."
        tensors |= {pre + "input_layernorm.weight": torch.ones(64), pre + "post_attention_layernorm.weight": torch.ones(64),
                    pre + "self_attn.q_proj.weight": rnd(64, 64) * 0.1,
                    pre + "self_attn.k_proj.weight": rnd(32, 64) * 0.1,
                    pre + "self_attn.v_proj.weight": rnd(32, 64) * 0.1,
                    pre + "self_attn.o_proj.weight": rnd(64, 64) * 0.1,
                    pre + "mlp.gate_proj.weight": rnd(128, 64) * 0.1,
                    pre + "mlp.up_proj.weight": rnd(128, 64) * 0.1,
                    pre + "mlp.down_proj.weight": rnd(64, 128) * 0.1}
        if qkv_bias:
            tensors |= {pre + "self_attn.q_proj.bias": rnd(64) * 0.1, pre + "self_attn.k_proj.bias": rnd(32) * 0.1,
                        pre + "self_attn.v_proj.bias": rnd(32) * 0.1}
    return decoder.Decoder(spec, tensors).eval()


def decoder_body(dec: decoder.Decoder, x: torch.Tensor, shape: nets.Shape, name: str):
    """x staged as the worker stages a bucket's rows (padded to 64), and
    the bucket's step body."""
    scores = decoder.score_words(shape.seq) if shape.mask and shape.seq > 1 else 0
    bound = nets.Boundary(torch.int32, x.shape[1], torch.int32, 2 + 2 * dec.top + scores)
    return F.pad(x, (0, bound.in_row - x.shape[1])), nets.step_body(dec, shape, bound, name=name)


#: The tokens decoder_rows' masked rows allow: row 0 a few (one in the
#: second word), row 2 one (bit 31, the int32's sign).
MASKED_ROW0, MASKED_ROW2 = (3, 17, 40), 31


def decoder_rows(dec: decoder.Decoder, B: int, T: int, masked: bool = False) -> torch.Tensor:
    """B rows of T tokens, as engine/rbln/decoder.go packs them: row r's
    tokens at positions 5r.., its table blocks 3r+1.. (the last block of
    the cache, 24, is the padding's), sampled at temperature 0.8 with a
    seed of its own, every other row cut to its top 5; masked, each row
    then carries a token mask, rows 0 and 2 flagged to sample under it."""
    width = 3 * T + decoder.FIELDS + dec.table_width
    words = decoder.sampling_words(dec.vocab) if masked and T == 1 else 0
    x = torch.zeros(B, width + words, dtype=torch.int32)
    g = torch.Generator().manual_seed(1)
    for r in range(B):
        start = 5 * r
        table = [3 * r + 1 + j for j in range(dec.table_width)]
        pos = torch.arange(start, start + T, dtype=torch.int32)
        x[r, :T] = torch.randint(0, dec.vocab, (T,), generator=g, dtype=torch.int32)
        x[r, T:2 * T] = pos
        x[r, 2 * T:3 * T] = torch.tensor([table[p // dec.block_size] * dec.block_size + p % dec.block_size for p in pos.tolist()],
                                         dtype=torch.int32)
        m = 3 * T
        x[r, m + decoder.VALID] = T
        x[r, m + decoder.SAMPLES] = 1
        x[r, m + decoder.TEMPERATURE] = torch.tensor([0.8]).view(torch.int32)
        x[r, m + decoder.TOP_K] = 5 * (r % 2)
        x[r, m + decoder.SEED_LO] = 1000 + r
        x[r, m + decoder.POSITION] = start + T
        x[r, m + decoder.FIELDS:width] = torch.tensor(table, dtype=torch.int32)
        # Every other row penalized, in its own lane, from its first token.
        x[r, m + decoder.LANE] = r if r % 2 == 0 else dec.lanes
        x[r, m + decoder.RESET] = 1
        x[r, m + decoder.PROMPT_LEN] = start + 2
        x[r, m + decoder.REPETITION] = torch.tensor([1.3 if r % 2 == 0 else 1.0]).view(torch.int32)
        x[r, m + decoder.FREQUENCY] = torch.tensor([0.5 if r % 2 == 0 else 0.0]).view(torch.int32)
        x[r, m + decoder.NEXT] = 7 + r
        if masked and T == 1 and r in (0, 2):
            x[r, m + decoder.MASKED] = 1
            for t in (MASKED_ROW0 if r == 0 else (MASKED_ROW2,)):
                bit = 1 << (t % 32)
                x[r, width + t // 32] |= bit - (1 << 32) if bit >= 1 << 31 else bit
    return x


@unittest.skipUnless(HAVE, WHY)
class WorkerCompileTest(Fixture):
    def test_the_mlp_compiles_with_inductor_and_reports_its_programs(self) -> None:
        w = self.worker()
        reply = w.load(dict(self.load, torch_compile="inductor"))
        self.assertEqual(("inductor", True), (reply["compiler"], reply["compiled"]))
        for b in (0, 1):
            w.compile({"model": "m", "bucket": b})
            for _ in range(3):
                rep = w.step({"model": "m", "bucket": b})["explain"]
        self.assertEqual(0, rep["recompiles"], rep)
        self.assertEqual(0, rep["cpu_fallbacks"], rep)
        progs = w.programs({"model": "m"})["programs"]
        self.assertEqual(["b1", "b2"], [p["bucket"] for p in progs])
        for p in progs:
            self.assertEqual(("inductor", 1, 0, 0), (p["compiler"], p["graphs"], p["graph_breaks"], p["recompiles"]), p)

    def test_unload_frees_the_module_and_programs(self) -> None:
        w = self.worker()
        w.load(dict(self.load, torch_compile="inductor"))
        w.compile({"model": "m", "bucket": 0})
        w.step({"model": "m", "bucket": 0})
        module = weakref.ref(w.models["m"].module)
        program = weakref.ref(w.models["m"].buckets[0].program)
        w.unload({"model": "m"})
        gc.collect()
        self.assertIsNone(program(), "the compiled program is freed on unload")
        self.assertIsNone(module(), "and the module with it")

    def test_off_runs_eagerly_and_says_so(self) -> None:
        w = self.worker()
        reply = w.load(dict(self.load, torch_compile="off"))
        self.assertEqual(("none", False), (reply["compiler"], reply["compiled"]))
        self.assertIn("rbln.torch_compile is off", " ".join(reply["notes"]))


class ChooseTest(unittest.TestCase):
    """Runs on every torch: what each mode gives."""

    def test_modes(self) -> None:
        self.assertEqual("none", compiler.choose("cpu", "off", False)[0])
        self.assertEqual("rbln", compiler.choose("rbln", "off", True)[0], "the rbln engine always compiles")
        if HAVE:
            self.assertEqual(("inductor", ""), compiler.choose("cpu", "auto", False))
        else:
            got, note = compiler.choose("cpu", "auto", False)
            self.assertEqual("none", got)
            self.assertIn("step bodies run eagerly", note)
            with self.assertRaisesRegex(compiler.Unavailable, "rbln.torch_compile is inductor, but"):
                compiler.choose("cpu", "inductor", False)
        with self.assertRaisesRegex(ValueError, "want one of auto, inductor, off"):
            compiler.choose("cpu", "sometimes", False)

    def test_source_lines(self) -> None:
        trace = '  File "/x/engine/rbln/worker/stepserve_worker/decoder.py", line 12, in step\n    ids = x.long()\n'
        self.assertEqual(("stepserve_worker/decoder.py:12", "ids = x.long()"), audit.source_line(trace))
        self.assertEqual(("", ""), audit.source_line(None))


if __name__ == "__main__":
    unittest.main()
