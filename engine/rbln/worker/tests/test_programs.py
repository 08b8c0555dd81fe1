import json
import sys
import tempfile
import unittest
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "testdata" / "fake_torch_rbln"))

from stepserve_worker import programs  # noqa: E402


def artifact(directory: str, name: str, info: dict) -> None:
    """A saved program as the rebel double reads it back."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    (Path(directory) / name).write_text(json.dumps(info))


class InspectTest(unittest.TestCase):
    def test_reads_host_ops_in_every_shape(self) -> None:
        # inspect()'s result is read defensively: a mapping, a list of
        # names or records, a per-graph table one level down.
        for value, want in [
            ({"aten::sort": "int64"}, {"aten::sort": "int64"}),
            (["aten::sort", "aten::topk"], {"aten::sort": "", "aten::topk": ""}),
            ([{"op": "aten::sort", "reason": "int64"}], {"aten::sort": "int64"}),
            ("aten::sort", {"aten::sort": ""}),
            ({}, {}),
            (None, {}),
        ]:
            with self.subTest(value=value):
                self.assertEqual(want, programs._ops(value))
        self.assertEqual((True, [{"a": "b"}]), programs._find({"graph0": {"host_op_reason": {"a": "b"}}}))
        self.assertEqual((True, {"a": "b"}), programs._find(SimpleNamespace(host_op_reason={"a": "b"})))
        self.assertIsNone(programs._ops(42), "an unreadable value is unknown, not zero")

    def test_counts_every_artifact_of_the_bucket(self) -> None:
        with tempfile.TemporaryDirectory() as base:
            d = programs.bucket_dir(base, "m-0123", 4, 0)
            artifact(d, "a.rbln", {"host_op_reason": {"aten::sort": "int64"}})
            artifact(d, "b.rbln", {"host_op_reason": ["aten::nonzero"]})
            artifact(d, "c.rbln", {"something_else": 1})  # inspected: none
            got = programs.inspect(d)
            self.assertEqual(2, got["count"])
            self.assertEqual({"aten::nonzero": "", "aten::sort": "int64"}, got["ops"])
            self.assertEqual(3, got["artifacts"])

    def test_found_below_the_top(self) -> None:
        # A per-graph list of per-partition tables: found wherever it is,
        # not read as "none".
        info = {"graphs": [{"partitions": [{"host_op_reason": {"aten::sort": "int64"}}, {"host_op_reason": None}]}]}
        found, value = programs._find(info)
        self.assertTrue(found)
        self.assertEqual({"aten::sort": "int64"}, programs._ops(value))
        self.assertEqual((False, []), programs._find({"graphs": [{"partitions": [{"other": 1}]}]}))

    def test_an_earlier_build_is_not_this_one(self) -> None:
        # The directory outlives loads: artifacts written before the graph
        # was built are not its program's, unless none was written since
        # (a cache hit).
        import os
        import time
        with tempfile.TemporaryDirectory() as d:
            artifact(d, "old.rbln", {"host_op_reason": ["aten::nonzero"]})
            hour_ago = time.time() - 3600
            os.utime(Path(d) / "old.rbln", (hour_ago, hour_ago))
            since = time.time_ns()
            self.assertEqual(1, programs.inspect(d, since_ns=since)["count"], "a cache hit reads what is there")
            artifact(d, "new.rbln", {"something_else": 1})
            got = programs.inspect(d, since_ns=since)
            self.assertEqual(0, got["count"], "the new build has no host operator")
            self.assertEqual(1, got["artifacts"])
            self.assertEqual(1, programs.inspect(d)["count"], "without a build time every artifact is read")

    def test_a_new_compiler_builds_apart(self) -> None:
        msg = {"name": "digits", "version": "1", "architecture": "mlp", "mlp": {"sizes": [64, 10]}}
        a = programs.identity(msg)
        real = programs.toolchain
        programs.toolchain = lambda: "rebel=9.9 torch_rbln=9.9 torch=1.13"
        try:
            self.assertNotEqual(a, programs.identity(msg))
        finally:
            programs.toolchain = real
        self.assertIn("torch=", programs.toolchain())

    def test_unknown_is_never_zero(self) -> None:
        self.assertIsNone(programs.inspect("")["count"])
        with tempfile.TemporaryDirectory() as base:
            got = programs.inspect(base)
            self.assertIsNone(got["count"])
            self.assertIn("no compiled artifact", got["reason"])
            artifact(base, "x.rbln", {"host_op_reason": 42})
            got = programs.inspect(base)
            self.assertIsNone(got["count"])
            self.assertIn("unreadable host_op_reason", got["reason"])

    def test_not_a_table_is_unknown(self) -> None:
        # inspect() answered with text: nothing was read, so nothing is
        # claimed; a per-graph null reads as none.
        import rebel  # the double, on this test's path

        class Text(rebel.RBLNCompiledModel):
            def inspect(self) -> str:  # type: ignore[override]
                return "host_op_reason: aten::sort"

        with tempfile.TemporaryDirectory() as base:
            artifact(base, "x.rbln", {})
            real, rebel.RBLNCompiledModel = rebel.RBLNCompiledModel, Text
            try:
                got = programs.inspect(base)
            finally:
                rebel.RBLNCompiledModel = real
            self.assertIsNone(got["count"])
            self.assertIn("inspect() returned str", got["reason"])
        self.assertEqual((True, []), programs._find({"g0": {"host_op_reason": None}}))

    def test_identity_follows_the_model_not_the_load(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            w = Path(d) / "weights.safetensors"
            w.write_bytes(b"1234")
            msg = {"model": "digits.7", "name": "digits", "version": "1", "architecture": "mlp",
                   "mlp": {"sizes": [64, 10]}, "weights": str(w)}
            a = programs.identity(msg)
            self.assertTrue(a.startswith("digits-"))
            self.assertEqual(a, programs.identity(dict(msg, model="digits.8")), "another load of the same model")
            self.assertNotEqual(a, programs.identity(dict(msg, version="2")))
            self.assertNotEqual(a, programs.identity(dict(msg, mlp={"sizes": [64, 32, 10]})))
            w.write_bytes(b"12345")
            self.assertNotEqual(a, programs.identity(msg), "new weights")
            self.assertNotEqual(programs.identity(dict(msg, name="a.b")), programs.identity(dict(msg, name="a_b")))

    def test_bucket_dirs_never_shared(self) -> None:
        self.assertNotEqual(programs.bucket_dir("/c", "a", 1, 0), programs.bucket_dir("/c", "a", 4, 0))
        self.assertNotEqual(programs.bucket_dir("/c", "a", 1, 32), programs.bucket_dir("/c", "a", 1, 64))
        self.assertNotEqual(programs.bucket_dir("/c", "a", 1, 1, 128), programs.bucket_dir("/c", "a", 1, 1, 512))


if __name__ == "__main__":
    unittest.main()
