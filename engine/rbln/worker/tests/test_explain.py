import copy
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "testdata" / "fake_torch_rbln"))
from torch_rbln import CLEAN  # the test double's clean scenario  # noqa: E402

from stepserve_worker.explain import chiplet_memory, host_step, normalize, unmeasured  # noqa: E402


def older(s: dict) -> dict:
    """The same scenario with an older release's keys: rebel_runtime, and
    no wall time or per-op maps."""
    d = copy.deepcopy(s["dump"])
    d["rebel_runtime"] = d.pop("runtime")
    for k in ("wall_ns", "cpu_fallback_by_op", "recompile_by_op"):
        d.pop(k)
    return d


class NormalizeTest(unittest.TestCase):
    def test_clean_newer_keys(self) -> None:
        r = normalize(CLEAN["verdict"], CLEAN["dump"], None)
        self.assertTrue(r.measured)
        self.assertTrue(r.clean)
        self.assertEqual((0, 0, 0, 0, 1, 1, 50000), (r.cpu_fallbacks, r.recompiles, r.host_bounces,
                                                      r.host_bounce_bytes, r.h2d, r.d2h, r.wall_ns))
        self.assertEqual("", r.report, "report text is kept only for steps that are not clean")

    def test_dispatch_detail(self) -> None:
        """dispatch.total / warm_hit / cpu_fallback_ns, runtime.total_ns and
        v2v ns (issue 33, item 8)."""
        from stepserve_worker import doorbell
        from stepserve_worker.explain import DISPATCH_KEYS
        self.assertEqual(doorbell.DISPATCH, DISPATCH_KEYS)
        r = normalize(CLEAN["verdict"], CLEAN["dump"], None)
        self.assertEqual({"total": 3, "warm_hits": 3, "cpu_fallback_ns": 0, "runtime_ns": 40000, "v2v_ns": None}, r.dispatch)
        d = copy.deepcopy(CLEAN["dump"])
        del d["dispatch"], d["runtime"]
        self.assertIsNone(normalize(CLEAN["verdict"], d, None).dispatch, "nothing known: no detail")

    def test_clean_newer_fields(self) -> None:
        r = normalize(CLEAN["verdict"], CLEAN["dump"], None)
        self.assertEqual((1000, 2000), (r.h2d_ns, r.d2h_ns), "transfer time from runtime.by_primitive")
        self.assertEqual(0, r.v2v_slow, "the runtime observed no slow device copy")
        self.assertIsNone(r.v2v, "v2v is not in the runtime's table: unknown, not 0")
        self.assertEqual({}, r.cpu_fallback_reasons)
        self.assertEqual([], r.notes)

    def test_missing_primitive_is_unknown(self) -> None:
        d = copy.deepcopy(CLEAN["dump"])
        del d["runtime"]["by_primitive"]["v2h"]
        d["runtime"]["by_primitive"]["v2v_multi"] = {"ns": 30, "calls": 3}
        r = normalize(CLEAN["verdict"], d, None)
        self.assertEqual(1, r.h2d)
        self.assertIsNone(r.d2h, "a primitive the table leaves out was not counted: unknown, never 0")
        self.assertIsNone(r.d2h_ns)
        self.assertEqual(3, r.v2v, "the _multi form alone counts")
        self.assertIsNone(r.to_wire()["d2h"])

    def test_v2v_slow_and_fallback_reasons_and_notes(self) -> None:
        v = {"clean": False, "reasons": ["runtime hidden d2h [src_not_on_device]: 2x"], "runtime_hidden_d2h": 2,
             "notes": [{"signal": "runtime/v2v_slow:src_not_on_device", "fix": "establish device residency"}, "plain note"]}
        d = copy.deepcopy(CLEAN["dump"])
        d["runtime_residency"] = {"available": True, "total_count": 2, "by_reason": {"src_not_on_device": {"count": 2, "bytes": 64}}}
        d["cpu_fallback_reasons"] = {"dtype-not-fp16": 3}
        r = normalize(v, d, "[overhead: 1 signal]")
        self.assertEqual(2, r.v2v_slow)
        self.assertEqual({"dtype-not-fp16": 3}, r.cpu_fallback_reasons)
        self.assertEqual(["runtime/v2v_slow:src_not_on_device: establish device residency", "plain note"], r.notes)

    def test_v2v_slow_unknown_where_the_runtime_cannot_see(self) -> None:
        d = copy.deepcopy(CLEAN["dump"])
        d["runtime_residency"] = {"available": False}
        self.assertIsNone(normalize(CLEAN["verdict"], d, None).v2v_slow)
        del d["runtime_residency"]
        self.assertEqual(0, normalize(CLEAN["verdict"], d, None).v2v_slow, "the verdict's runtime_hidden_d2h")
        self.assertIsNone(normalize({"clean": True}, d, None).v2v_slow)

    def test_clean_older_keys(self) -> None:
        r = normalize(CLEAN["verdict"], older(CLEAN), None)
        self.assertEqual((1, 1), (r.h2d, r.d2h), "rebel_runtime is read like runtime")
        self.assertIsNone(r.wall_ns, "absent means unknown, not zero")
        self.assertIsNone(r.cpu_fallback_by_op)

    def test_cpu_fallback(self) -> None:
        v = {"clean": False, "reasons": ["cpu_fallback: aten::nonzero ran on the CPU"], "cpu_fallbacks": 2}
        d = copy.deepcopy(CLEAN["dump"])
        d["dispatch"]["cpu_fallback"] = 2
        d["cpu_fallback_by_op"] = {"aten::nonzero": 2}
        r = normalize(v, d, "[overhead: 1 signal] ...")
        self.assertFalse(r.clean)
        self.assertEqual(2, r.cpu_fallbacks)
        self.assertEqual({"aten::nonzero": 2}, r.cpu_fallback_by_op)
        self.assertEqual("[overhead: 1 signal] ...", r.report)

    def test_recompile_and_host_bounce_and_multi_transfers(self) -> None:
        d = copy.deepcopy(CLEAN["dump"])
        d["dispatch"]["recompile_miss"] = 1
        d["recompile_by_op"] = {"aten::addmm": {"count": 1}}
        d["hidden_host_bounce"] = {"by_site": {"model.py:12": {"count": 3, "bytes": 4096}}, "total_count": 3, "total_bytes": 4096}
        d["runtime"]["by_primitive"]["h2v_multi"] = {"ns": 5, "calls": 2}
        r = normalize({"clean": False, "reasons": ["recompile", "host_bounce"]}, d, "report")
        self.assertEqual((1, 3, 4096, 3, 1), (r.recompiles, r.host_bounces, r.host_bounce_bytes, r.h2d, r.d2h))
        self.assertEqual({"aten::addmm": 1}, r.recompile_by_op)
        self.assertEqual({"model.py:12": 3}, r.host_bounce_by_site)

    def test_unknown_fields(self) -> None:
        r = normalize({"reasons": "not a list"}, {"dispatch": {"cpu_fallback": "many"}, "runtime": None}, None)
        self.assertTrue(r.measured)
        self.assertFalse(r.clean, "no boolean clean is not clean")
        self.assertIn("verdict has no boolean 'clean'", r.reasons)
        for v in (r.cpu_fallbacks, r.recompiles, r.host_bounces, r.host_bounce_bytes, r.h2d, r.d2h, r.wall_ns,
                  r.h2d_ns, r.d2h_ns, r.v2v, r.v2v_slow):
            self.assertIsNone(v)
        r = normalize(None, None, None)
        self.assertIsNone(r.h2d)

    def test_unmeasured(self) -> None:
        r = unmeasured("torch.rbln.explain is unavailable")
        self.assertFalse(r.measured)
        self.assertIsNone(r.h2d)
        self.assertEqual(["torch.rbln.explain is unavailable"], r.to_wire()["reasons"])

    def test_chiplet_memory(self) -> None:
        rows = chiplet_memory({"npu.0.chiplet.1.allocated.current": 10, "npu.0.chiplet.1.reserved.peak": 30,
                               "npu.0.chiplet.1.active.current": 5, "npu.0.chiplet.1.cached.current": 7,
                               "npu.0.chiplet.1.num_ooms": 2, "npu.0.chiplet.1.num_alloc_retries": 1,
                               "npu.0.chiplet.1.num_device_alloc": 9, "npu.0.chiplet.1.allocated.total_freed": 4,
                               "allocated.current": 99, "npu.0.chiplet.1.reserved.current": "x"})
        self.assertEqual([{"npu": "0", "chiplet": "1", "kind": "allocated", "bytes": 10},
                          {"npu": "0", "chiplet": "1", "kind": "reserved_peak", "bytes": 30},
                          {"npu": "0", "chiplet": "1", "kind": "active", "bytes": 5},
                          {"npu": "0", "chiplet": "1", "kind": "cached", "bytes": 7},
                          {"npu": "0", "chiplet": "1", "kind": "num_ooms", "bytes": 2},
                          {"npu": "0", "chiplet": "1", "kind": "num_alloc_retries", "bytes": 1}],
                         sorted(rows, key=lambda r: ["allocated", "reserved_peak", "active", "cached", "num_ooms", "num_alloc_retries"].index(r["kind"])))
        self.assertEqual([], chiplet_memory(None))


if __name__ == "__main__":
    unittest.main()


class HostStepTest(unittest.TestCase):
    """A torch-engine step on the host CPU, seen by a real explain(): no
    device copy, so missing transfers; reported as a host step, not a
    failure (issue 33, item 10)."""

    def host_dump(self) -> dict:
        d = copy.deepcopy(CLEAN["dump"])
        for prim in ("h2v", "v2h"):
            d["runtime"]["by_primitive"][prim] = {"ns": 0, "calls": 0}
        return d

    def test_missing_transfers_on_the_host_are_unknown(self) -> None:
        verdict = {"clean": False, "reasons": ["missing h2d: 0 host-to-device copies", "missing d2h: 0"]}
        r = host_step(normalize(verdict, self.host_dump(), "[missing transfers]"))
        self.assertTrue(r.measured)
        self.assertTrue(r.clean, "nothing else fired")
        self.assertEqual([], r.reasons)
        self.assertIsNone(r.h2d)
        self.assertIsNone(r.d2h)
        self.assertEqual("", r.report)
        self.assertIn("host step", r.notes[-1])

    def test_other_signals_still_count(self) -> None:
        d = self.host_dump()
        verdict = {"clean": False, "reasons": ["cpu_fallback: aten::nonzero", "missing h2d"]}
        r = normalize(verdict, d, "text")
        r.cpu_fallbacks = 2
        r = host_step(r)
        self.assertFalse(r.clean)
        self.assertEqual(["cpu_fallback: aten::nonzero"], r.reasons)

    def test_a_step_that_copied_is_left_alone(self) -> None:
        r = normalize(CLEAN["verdict"], CLEAN["dump"], None)
        self.assertEqual((1, 1), (host_step(r).h2d, host_step(r).d2h))
