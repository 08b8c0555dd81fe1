import json
import os
import socket
import struct
import sys
import tempfile
import unittest
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "testdata" / "fake_torch_rbln"))
import torch_rbln  # the test double: installs torch.rbln  # noqa: E402,F401

from stepserve_worker import nets, safetensors  # noqa: E402
from stepserve_worker.protocol import read_message  # noqa: E402
from stepserve_worker.worker import CPU_DTYPE_ENV, DeviceError, Runtime, Server, Worker  # noqa: E402


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
        # the supervisor passes its memfd; in_path and out_path are the
        # tests' own handles on them.
        self.buckets, self.fds = [], []
        for batch in (1, 2):
            inp, out = self.dir / f"in{batch}", self.dir / f"out{batch}"
            inp.write_bytes(bytes(batch * 4 * 4))
            out.write_bytes(bytes(batch * 3 * 4))
            self.fds += [os.open(inp, os.O_RDWR), os.open(out, os.O_RDWR)]
            self.buckets.append({"batch": batch, "seq": 0, "in_path": str(inp), "in_fd": len(self.fds) - 2,
                                 "in_offset": 0, "in_bytes": batch * 16, "out_path": str(out),
                                 "out_fd": len(self.fds) - 1, "out_offset": 0, "out_bytes": batch * 12})
        self.load = {"model": "m", "weights": str(self.dir / "w.safetensors"), "architecture": "mlp",
                     "mlp": {"sizes": [4, 8, 3], "activation": "relu", "output_activation": "softmax"},
                     "input_dtype": "float32", "device_dtype": "float16", "buckets": self.buckets, "fds": self.fds}
        clear_env()
        self.workers: list[Worker] = []

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
        w.compile({"model": "m", "bucket": 1})
        x = torch.tensor([[1.0, 2, 3, 4], [-1, 0, 0.5, 2]])
        Path(self.buckets[1]["in_path"]).write_bytes(x.numpy().tobytes())
        rep = w.step({"model": "m", "bucket": 1})["explain"]
        self.assertEqual((1, 1), (rep["h2d"], rep["d2h"]))
        got = torch.frombuffer(bytearray(Path(self.buckets[1]["out_path"]).read_bytes()), dtype=torch.float32).view(2, 3)
        want = torch.softmax(torch.relu(x @ self.w1.T + self.b1) @ self.w2.T + self.b2, -1)
        self.assertLess((got - want).abs().max().item(), 1e-6)

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
        for dtype, env in (("float32", None), ("bfloat16", "device")):
            if env:
                os.environ[CPU_DTYPE_ENV] = env
            w = self.worker()
            info = w.load(dict(self.load, device_dtype="bfloat16"))
            self.assertEqual(dtype, info["compute_dtype"])
            w.compile({"model": "m", "bucket": 1})
            Path(self.buckets[1]["in_path"]).write_bytes(x.numpy().tobytes())
            w.step({"model": "m", "bucket": 1})
            out[dtype] = torch.frombuffer(bytearray(Path(self.buckets[1]["out_path"]).read_bytes()), dtype=torch.float32)
            w.unload({"model": "m"})
        diff = (out["bfloat16"] - out["float32"]).abs().max().item()
        self.assertGreater(diff, 0, "bfloat16 rounds: the two runs differ")
        self.assertLess(diff, 2e-2)

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
        graphs = [bk.graph for bk in w.models["m"].buckets]
        self.assertIsNot(graphs[0].__code__, graphs[1].__code__)
        self.assertEqual(["step_m_b0", "step_m_b1"], [g.__code__.co_name for g in graphs])
        rep = w.step({"model": "m", "bucket": 1})["explain"]
        self.assertEqual((1, 1), (rep["h2d"], rep["d2h"]), "the renamed body still steps")

    def test_compile_asks_for_one_whole_graph(self) -> None:
        w = self.worker()
        w.load(self.load)
        calls = []
        real = getattr(torch, "compile", None)
        torch.compile = lambda fn, **kw: calls.append(kw) or fn  # type: ignore[attr-defined]
        w.rt.compile_available = True
        try:
            w.compile({"model": "m", "bucket": 0})
        finally:
            if real is None:
                del torch.compile
            else:
                torch.compile = real
        self.assertEqual([{"backend": "rbln", "dynamic": False, "fullgraph": True, "options": {}}], calls)

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
