import json
import os
import socket
import struct
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "testdata" / "fake_torch_rbln"))
import torch_rbln  # the test double: installs torch.rbln  # noqa: E402,F401

from stepserve_worker import nets, safetensors  # noqa: E402
from stepserve_worker.protocol import read_message  # noqa: E402
from stepserve_worker.worker import CPU_DTYPE_ENV, DeviceError, Runtime, Server, StagingError, Worker  # noqa: E402


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        data = t.float().contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def clear_env() -> None:
    """Unset what tests set to script the test double and the worker."""
    for env in (torch_rbln.SCENARIO_ENV, torch_rbln.REGIONS_ENV, CPU_DTYPE_ENV):
        os.environ.pop(env, None)


class Fixture(unittest.TestCase):
    """The mlp model of sizes 4, 8, 3 in two buckets, and workers that are
    cleaned up."""

    def setUp(self) -> None:
        self.dir = Path(tempfile.mkdtemp())
        torch.manual_seed(0)
        self.w1, self.b1 = torch.randn(8, 4), torch.randn(8)
        self.w2, self.b2 = torch.randn(3, 8), torch.randn(3)
        write_safetensors(self.dir / "w.safetensors", {
            "layers.0.weight": self.w1, "layers.0.bias": self.b1, "layers.1.weight": self.w2, "layers.1.bias": self.b2})
        # Each staging buffer in a file of its own, passed by descriptor as
        # the supervisor passes its memfd; paths are the tests' own handles
        # on them. Rows are padded to 64 elements (4 and 3 of them data),
        # and the files hold them in float32, the widest dtype: a load in
        # another lays the same files out for it.
        self.fds = []
        self.paths: list[tuple[Path, Path]] = []
        for batch in (1, 2):
            inp, out = self.dir / f"in{batch}", self.dir / f"out{batch}"
            inp.write_bytes(bytes(batch * 64 * 4))
            out.write_bytes(bytes(batch * 64 * 4))
            self.fds += [os.open(inp, os.O_RDWR), os.open(out, os.O_RDWR)]
            self.paths.append((inp, out))
        self.load = self.staged("float32")
        clear_env()
        self.workers: list[Worker] = []

    def staged(self, dtype: str, **load: Any) -> dict[str, Any]:
        """The mlp's load message, its staging laid out in dtype as the
        supervisor lays it out (engine/rbln/boundary.go)."""
        size = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
        buckets = [{"batch": batch, "seq": 0,
                    "in_fd": 2 * i, "in_offset": 0, "in_bytes": batch * 64 * size,
                    "in_dtype": dtype, "in_cols": 4, "in_row": 64,
                    "out_fd": 2 * i + 1, "out_offset": 0, "out_bytes": batch * 64 * size,
                    "out_dtype": dtype, "out_cols": 3, "out_row": 64}
                   for i, batch in enumerate((1, 2))]
        return {"model": "m", "weights": str(self.dir / "w.safetensors"), "architecture": "mlp",
                "mlp": {"sizes": [4, 8, 3], "activation": "relu", "output_activation": "softmax"},
                "device_dtype": "float16", "compute_dtype": dtype, "buckets": buckets, "fds": self.fds,
                # Eager unless a test asks: tests/test_compile.py compiles.
                "torch_compile": "off", **load}

    def put(self, bucket: int, x: torch.Tensor, dtype: torch.dtype = torch.float32) -> None:
        """Stage x's rows in bucket's input, padded to 64 as Go pads them."""
        raw = F.pad(x, (0, 64 - x.shape[1])).to(dtype)
        if raw.element_size() == 2:
            raw = raw.view(torch.int16)  # numpy has no bfloat16
        self.paths[bucket][0].write_bytes(raw.numpy().tobytes())

    def got(self, bucket: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Bucket's staged output rows, all 64 elements of each, as float32."""
        batch = bucket + 1
        raw = bytearray(self.paths[bucket][1].read_bytes())
        return torch.frombuffer(raw, dtype=dtype, count=batch * 64).view(batch, 64).float()

    def tearDown(self) -> None:
        clear_env()
        for w in self.workers:
            for name in list(w.models):
                w.unload({"model": name})
        for fd in self.fds:
            os.close(fd)

    def worker(self) -> Worker:
        w = Worker(Runtime.detect())
        self.workers.append(w)
        return w

    def scenario(self, s: dict) -> None:
        path = self.dir / "scenario.json"
        path.write_text(json.dumps(s))
        os.environ["STEPSERVE_FAKE_RBLN_SCENARIO"] = str(path)


class WorkerTest(Fixture):
    def test_step_computes_the_mlp_through_shared_staging(self) -> None:
        w = self.worker()
        info = w.load(self.load)
        self.assertEqual("cpu", info["device"])
        self.assertEqual("float32", info["compute_dtype"], "torch's CPU computes in float32")
        self.assertEqual([{"in": {"dtype": "float32", "shape": [b, 64], "element_bytes": 4},
                           "out": {"dtype": "float32", "shape": [b, 64], "element_bytes": 4}} for b in (1, 2)],
                         info["staging"], "the worker says how it reads the staging")
        w.compile({"model": "m", "bucket": 1})
        x = torch.tensor([[1.0, 2, 3, 4], [-1, 0, 0.5, 2]])
        self.put(1, x)
        rep = w.step({"model": "m", "bucket": 1})["explain"]
        self.assertEqual((1, 1), (rep["h2d"], rep["d2h"]))
        got = self.got(1)
        want = torch.softmax(torch.relu(x @ self.w1.T + self.b1) @ self.w2.T + self.b2, -1)
        # 1e-5 on probabilities: the worker multiplies the rows padded to
        # the bucket's 64 columns, the reference the 4 given, and the BLAS
        # (chosen by cpuid) may block and order the two sums differently:
        # a few float32 ulps, never more.
        self.assertLess((got[:, :3] - want).abs().max().item(), 1e-5)
        self.assertTrue(torch.equal(got[:, 3:], torch.zeros(2, 61)), "the output's row padding is zeros")

    def regions(self) -> int:
        path = self.dir / "regions"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def test_compile_runs_nothing(self) -> None:
        # The supervisor's warm-up runs each bucket twice, and those are the
        # only runs: the first release's compile ran two more.
        os.environ[torch_rbln.REGIONS_ENV] = str(self.dir / "regions")
        w = self.worker()
        w.load(self.load)
        reply = w.compile({"model": "m", "bucket": 1})
        self.assertEqual(["compile_seconds"], list(reply))
        self.assertEqual(0, self.regions())
        for run in (1, 2):
            w.step({"model": "m", "bucket": 1})
            self.assertEqual(run, self.regions())

    def test_cpu_computes_in_the_device_dtype_when_asked(self) -> None:
        x = torch.tensor([[1.0, 2, 3, 4], [-1, 0, 0.5, 2]])
        out = {}
        for dtype, env, size in ((torch.float32, None, 4), (torch.bfloat16, "device", 2)):
            name = str(dtype).removeprefix("torch.")
            if env:
                os.environ[CPU_DTYPE_ENV] = env
            w = self.worker()
            info = w.load(self.staged(name, device_dtype="bfloat16"))
            self.assertEqual(name, info["compute_dtype"])
            self.assertEqual({"dtype": name, "shape": [2, 64], "element_bytes": size}, info["staging"][1]["in"],
                             "the staging holds the compute dtype")
            w.compile({"model": "m", "bucket": 1})
            self.put(1, x, dtype)
            w.step({"model": "m", "bucket": 1})
            out[name] = self.got(1, dtype)
            w.unload({"model": "m"})
        diff = (out["bfloat16"] - out["float32"]).abs().max().item()
        self.assertGreater(diff, 0, "bfloat16 rounds: the two runs differ")
        self.assertLess(diff, 2e-2)

    def test_staging_laid_out_for_another_graph_is_refused(self) -> None:
        w = self.worker()
        for name, load, want in [
            ("compute dtype", self.staged("bfloat16"),
             r"model 'm': the supervisor staged its floats as bfloat16, but this worker computes it in float32 "
             r"\(on the host CPU unless STEPSERVE_WORKER_CPU_DTYPE=device\)"),
            ("unpadded row", self.edit(1, in_row=4, in_bytes=2 * 4 * 4),
             r"model 'm' bucket 1 \(b2\): the staging is laid out for another step graph: "
             r"input float32\[2, 4\] of 4 data columns in 32 bytes, want float32\[2, 64\] of 4 in 512$"),
            ("output dtype", self.edit(0, out_dtype="float16", out_bytes=64 * 2),
             r"model 'm' bucket 0 \(b1\): .*output float16\[1, 64\] of 3 data columns in 128 bytes, "
             r"want float32\[1, 64\] of 3 in 256"),
            ("another model's width", self.edit(0, in_cols=8),
             r"bucket 0 \(b1\): .*input float32\[1, 64\] of 8 data columns in 256 bytes, want float32\[1, 64\] of 4 in 256"),
        ]:
            with self.subTest(name), self.assertRaisesRegex(StagingError, want):
                w.load(load)
        self.assertEqual({}, w.models, "nothing is loaded")

    def edit(self, bucket: int, **spec: Any) -> dict[str, Any]:
        """The float32 load with bucket's spec changed."""
        load = self.staged("float32")
        load["buckets"][bucket].update(spec)
        return load

    def test_lazy_bucket_is_a_recompile(self) -> None:
        w = self.worker()
        w.load(self.load)
        rep = w.step({"model": "m", "bucket": 0})["explain"]
        self.assertEqual(1, rep["recompiles"])
        self.assertFalse(rep["clean"])
        rep = w.step({"model": "m", "bucket": 0})["explain"]
        self.assertTrue(rep["clean"])

    def test_explain_that_raises_leaves_the_step_unmeasured(self) -> None:
        w = self.worker()
        w.load(self.load)
        w.compile({"model": "m", "bucket": 0})
        self.scenario({"raise_on_enter": True})
        rep = w.step({"model": "m", "bucket": 0})["explain"]
        self.assertFalse(rep["measured"])
        self.assertIn("explain region failed to open: RuntimeError", rep["reasons"][0])

    def test_errors_name_the_problem(self) -> None:
        w = self.worker()
        with self.assertRaisesRegex(KeyError, "not loaded"):
            w.step({"model": "nope", "bucket": 0})
        bad = dict(self.load, mlp={"sizes": [4, 9, 3]})
        with self.assertRaisesRegex(nets.LoadError, r"tensor 'layers.0.weight' has shape \[8, 4\], want \[9, 4\]"):
            w.load(bad)
        (self.dir / "bad.safetensors").write_bytes(b"\x01\x00")
        with self.assertRaisesRegex(safetensors.SafetensorsError, "shorter than the 8-byte header"):
            w.load(dict(self.load, weights=str(self.dir / "bad.safetensors")))
        w.load(self.load)
        with self.assertRaisesRegex(IndexError, "no bucket 5"):
            w.step({"model": "m", "bucket": 5})

    def test_memory(self) -> None:
        self.scenario({"memory": {"npu.0.chiplet.0.allocated.current": 4096}})
        npu = Worker(Runtime(device=torch.device("cpu"), rbln=torch.rbln, compile_available=False, kind="rbln"))
        self.assertEqual([{"npu": "0", "chiplet": "0", "kind": "allocated", "bytes": 4096}], npu.memory({})["chiplets"])
        self.assertEqual([], self.worker().memory({})["chiplets"], "a worker on the host CPU reads no NPU's memory")


class DeviceTest(Fixture):
    """Engine rbln computes on an RBLN device or refuses to load; engine
    torch computes on the host CPU."""

    def test_without_torch_rbln(self) -> None:
        saved = sys.modules.get("torch_rbln"), torch.rbln
        sys.modules["torch_rbln"] = None  # type: ignore[assignment]  # import torch_rbln raises ImportError
        del torch.rbln
        try:
            npu, host = Runtime.detect("rbln"), Runtime.detect("cpu")
        finally:
            sys.modules["torch_rbln"], torch.rbln = saved
        self.assertIn("torch_rbln is not importable (", npu.unusable)
        self.assertIsNone(npu.device_count)
        with self.assertRaisesRegex(DeviceError, "engine rbln computes only on an RBLN device, and this worker has none: torch_rbln is not importable"):
            Worker(npu).load(self.load)
        self.assertEqual("", host.unusable)
        self.assertIn("explain unavailable", " ".join(host.notes))
        w = Worker(host)
        self.workers.append(w)
        self.assertEqual("cpu", w.load(self.load)["device"])
        w.compile({"model": "m", "bucket": 0})
        self.assertFalse(w.step({"model": "m", "bucket": 0})["explain"]["measured"], "no explain: unmeasured")

    def test_no_device_visible(self) -> None:
        os.environ["RBLN_VISIBLE_DEVICES"] = "3"
        self.addCleanup(os.environ.pop, "RBLN_VISIBLE_DEVICES")
        rt = Runtime.detect("rbln")
        self.assertEqual(0, rt.device_count)
        self.assertIn("torch.rbln.is_available() is False", rt.unusable)
        self.assertIn("RBLN_VISIBLE_DEVICES=3", rt.unusable)
        with self.assertRaisesRegex(DeviceError, r"is_available\(\) is False"):
            Worker(rt).load(self.load)

    def test_device_queries_and_a_torch_without_the_rbln_type(self) -> None:
        self.scenario({"available": True, "device_count": 1, "physical_device_count": 2,
                       "device_summary": "| rbln:0 | [ 0, 1 ] | Active (Aggregated) |"})
        rt = Runtime.detect("rbln")
        self.assertEqual((1, 2), (rt.device_count, rt.physical_device_count))
        self.assertEqual("| rbln:0 | [ 0, 1 ] | Active (Aggregated) |", rt.device_summary, "the printed table is captured")
        self.assertIn("torch has no rbln device type", rt.unusable, "this torch cannot place tensors on rbln:0")
        with self.assertRaises(DeviceError):
            Worker(rt).load(self.load)

    def test_weights_that_stay_on_the_host_are_refused(self) -> None:
        # A runtime that believes it has an NPU, but whose weights land on
        # the host: the load says so instead of serving on the CPU.
        rt = Runtime(device=torch.device("cpu"), rbln=torch.rbln, compile_available=False, kind="rbln")
        with self.assertRaisesRegex(DeviceError, r"model 'm''s weights are on cpu, not rbln:\*"):
            Worker(rt).load(self.load)

    def test_host_cpu_worker_with_explain_is_measured(self) -> None:
        w = self.worker()
        self.assertEqual("cpu", w.rt.kind)
        self.assertIsNone(w.rt.device_count, "the torch engine's worker never queries an NPU")
        w.load(self.load)
        w.compile({"model": "m", "bucket": 0})
        self.assertTrue(w.step({"model": "m", "bucket": 0})["explain"]["measured"])

    def test_hello_carries_the_device_view(self) -> None:
        self.scenario({"available": True, "device_count": 2, "device_summary": "table"})
        a, b = socket.socketpair()
        with a, b:
            Server(a, Worker(Runtime.detect("rbln"))).hello()
            hi = read_message(b)
        self.assertEqual("hello", hi["type"])
        self.assertEqual(("rbln", 2, 2, "table"), (hi["device_kind"], hi["device_count"], hi["physical_device_count"], hi["device_summary"]))
        self.assertIn("rbln device type", hi["unusable"])
        with self.assertRaisesRegex(ValueError, "device kind 'gpu'"):
            Runtime.detect("gpu")


class EncoderTest(unittest.TestCase):
    """The torch encoder matches the reference written from torch's own
    nn.TransformerEncoderLayer (engine/cpufallback/testdata/encoder)."""

    def test_matches_reference(self) -> None:
        ref_dir = HERE.parents[3] / "engine" / "cpufallback" / "testdata" / "encoder"
        ref = json.loads((ref_dir / "reference.json").read_text())
        tensors = safetensors.load(ref_dir / "weights.safetensors")
        cfg = {"vocab_size": 100, "hidden": 64, "layers": 2, "heads": 4, "intermediate": 128,
               "max_position": 64, "type_vocab_size": 2, "layer_norm_eps": 1e-12}
        for pooling in ("cls", "mean"):
            model = nets.Encoder(dict(cfg, pooling=pooling), tensors).eval()
            for case in ref["cases"]:
                n = len(case["input_ids"])
                pad = min(3, 64 - n)  # padded positions are masked out
                ids = torch.tensor([case["input_ids"] + [0] * pad])
                types = torch.tensor([case["token_type_ids"] + [0] * pad])
                mask = torch.tensor([[1] * n + [0] * pad])
                with torch.no_grad():
                    got = model(ids, mask, types)[0]
                err = (got - torch.tensor(case[pooling])).abs().max().item()
                self.assertLess(err, 1e-4, f"{pooling}, length {len(case['input_ids'])}")


if __name__ == "__main__":
    unittest.main()


class StepStructureTest(Fixture):
    def test_each_bucket_has_a_code_object_of_its_own(self) -> None:
        # Dynamo keeps a few cache entries per code object: bodies sharing
        # one would push a model's later buckets to eager code.
        w = self.worker()
        w.load(self.load)
        for b in (0, 1):
            w.compile({"model": "m", "bucket": b})
        graphs = [bk.program.body for bk in w.models["m"].buckets]
        self.assertIsNot(graphs[0].__code__, graphs[1].__code__)
        self.assertEqual(["step_m_b0", "step_m_b1"], [g.__code__.co_name for g in graphs])
        rep = w.step({"model": "m", "bucket": 1})["explain"]
        self.assertEqual((1, 1), (rep["h2d"], rep["d2h"]), "the renamed body still steps")

    def test_compile_asks_for_one_whole_graph(self) -> None:
        w = self.worker()
        w.load(self.load)
        w.models["m"].compiler = "rbln"  # as a load on the rbln engine chooses
        calls = []
        real = getattr(torch, "compile", None)
        torch.compile = lambda fn, **kw: calls.append(kw) or fn  # type: ignore[attr-defined]
        try:
            w.compile({"model": "m", "bucket": 0})
        finally:
            if real is None:
                del torch.compile
            else:
                torch.compile = real
        self.assertEqual(1, len(calls))
        backend = calls[0].pop("backend")
        # Backend rbln: by name where torch.compile is not Dynamo's, else
        # behind the step audit, which hands each graph on to it.
        self.assertIn(getattr(backend, "__name__", backend), ("rbln", "audited_rbln"))
        self.assertEqual({"dynamic": False, "fullgraph": True}, {k: calls[0][k] for k in ("dynamic", "fullgraph")})
        self.assertFalse(calls[0].get("options"), "no cache_dir, no RSD group: no options")

    def test_unload_drops_the_module_and_graphs(self) -> None:
        import weakref
        w = self.worker()
        w.load(self.load)
        w.compile({"model": "m", "bucket": 0})
        module = weakref.ref(w.models["m"].module)
        graph = weakref.ref(w.models["m"].buckets[0].graph)
        emptied = []
        w.rt.kind, w.rt.rbln = "rbln", type("R", (), {"empty_cache": staticmethod(lambda: emptied.append(1))})
        w.unload({"model": "m"})
        self.assertIsNone(module(), "the module is freed on unload")
        self.assertIsNone(graph(), "and the bucket's compiled body")
        self.assertEqual([1], emptied, "and the device allocator's cache is emptied")


class ProfileTest(Fixture):
    """Trace level PROFILE: a step asked for with "profile" runs inside
    torch.profiler and returns its events, bounded."""

    def profiled(self, w: Worker) -> dict:
        w.load(self.load)
        w.compile({"model": "m", "bucket": 1})
        self.put(1, torch.tensor([[1.0, 2, 3, 4], [-1, 0, 0.5, 2]]))
        return w.step({"model": "m", "bucket": 1, "profile": True})

    def test_a_profiled_step_returns_its_events_around_the_anchor(self) -> None:
        reply = self.profiled(self.worker())
        p = reply["profile"]
        self.assertEqual(["CPU"], p["activities"], "no PrivateUse1 in torch 1.13 without the bridge")
        self.assertEqual("stepserve.step", p["anchor"])
        names = [e.get("name") for e in p["events"]]
        self.assertEqual("stepserve.step m bucket 1", names[0], "the range the supervisor aligns on comes first")
        anchor = p["events"][0]
        inside = [e for e in p["events"][1:] if e.get("ph") == "X" and e["ts"] >= anchor["ts"]
                  and e["ts"] + e["dur"] <= anchor["ts"] + anchor["dur"]]
        self.assertTrue(any(str(e["name"]).startswith("aten::") for e in inside), names)
        self.assertEqual(0, p["dropped"])
        self.assertGreater(reply["body_ns"], 0)
        self.assertEqual((1, 1), (reply["explain"]["h2d"], reply["explain"]["d2h"]), "the step ran as ever")
        self.assertNotIn("profile", self.workers[0].step({"model": "m", "bucket": 1}), "only when asked")

    def test_privateuse1_is_asked_for_where_the_bridge_can_be_active(self) -> None:
        if not torch_rbln.install_privateuse1():
            self.skipTest("this torch has ProfilerActivity.PrivateUse1 of its own")
        self.addCleanup(torch_rbln.uninstall_privateuse1)
        from stepserve_worker import profile as prof
        self.assertIsNone(prof.device_activity(torch.rbln), "RBLN_PROFILER unset: the runtime records nothing")
        os.environ[prof.BRIDGE_ENV] = "1"
        self.addCleanup(os.environ.pop, prof.BRIDGE_ENV, None)
        self.assertIsNone(prof.device_activity(None), "no torch_rbln: no bridge")
        self.assertIs(torch.profiler.ProfilerActivity.PrivateUse1, prof.device_activity(torch.rbln))
        p = self.profiled(self.worker())["profile"]
        self.assertEqual(["CPU", "PrivateUse1"], p["activities"])
        self.assertEqual("stepserve.step m bucket 1", p["events"][0]["name"])

    def test_events_past_the_bound_are_dropped_and_counted(self) -> None:
        from stepserve_worker import profile as prof
        events = [{"name": f"op{i}", "ph": "X", "ts": i, "dur": 1} for i in range(100)]
        events.insert(50, {"name": "stepserve.step m bucket 0", "ph": "X", "ts": 0, "dur": 200})
        kept, dropped = prof.bound(events, 600, "stepserve.step m bucket 0")
        self.assertEqual("stepserve.step m bucket 0", kept[0]["name"], "the anchor is kept first")
        self.assertEqual(101, len(kept) + dropped)
        self.assertGreater(dropped, 0)
        self.assertLessEqual(len(json.dumps(kept)), 600)
