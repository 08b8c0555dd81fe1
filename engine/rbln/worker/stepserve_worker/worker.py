"""The worker process: one per logical device, started by the Go supervisor
with exec. It loads models (weights moved to the device once), compiles one
step graph per bucket with a bound input buffer, and runs steps inside
torch.rbln.explain(), reading and writing the shared-memory staging buffers
Go created."""

from __future__ import annotations

import argparse
import io
import mmap
import os
import queue
import socket
import sys
import threading
import time
import traceback
from contextlib import nullcontext, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from . import PROTOCOL_VERSION
from . import explain as ex
from . import nets
from . import safetensors
from .protocol import ProtocolError, Writer, read_message

_DTYPES = {"float32": torch.float32, "int64": torch.int64, "float16": torch.float16, "bfloat16": torch.bfloat16}

#: Set to "device" to compute on torch's CPU in the model's device_dtype, as
#: the tests of half-precision numerics do; otherwise the CPU computes in
#: float32 (torch 1.13's CPU has bfloat16 kernels but no float16 matmul).
CPU_DTYPE_ENV = "STEPSERVE_WORKER_CPU_DTYPE"


# The device kinds a worker may be told to compute on: "rbln" for the rbln
# engine (an RBLN NPU and nothing else), "cpu" for the torch engine (the
# host's CPU, explain where torch_rbln offers it).
DEVICE_KINDS = ("rbln", "cpu")


class DeviceError(RuntimeError):
    """The worker cannot compute where its engine requires."""


@dataclass
class Runtime:
    """What this process can use: the device, and torch.rbln if present."""

    device: torch.device
    rbln: Any  # the torch.rbln module, or None
    compile_available: bool
    kind: str = "cpu"  # the device kind this worker must compute on
    # Why the required device is not there; loads are refused with it.
    unusable: str = ""
    # torch.rbln's view of the devices (rbln kind only; None when unknown).
    device_count: Optional[int] = None
    physical_device_count: Optional[int] = None
    device_summary: Optional[str] = None
    notes: list[str] = field(default_factory=list)

    @classmethod
    def detect(cls, kind: str = "cpu") -> "Runtime":
        if kind not in DEVICE_KINDS:
            raise ValueError(f"device kind {kind!r}; want one of {', '.join(DEVICE_KINDS)}")
        notes: list[str] = []
        missing = ""
        try:
            import torch_rbln  # noqa: F401  (registers torch.rbln)
        except Exception as e:  # ImportError, or a runtime that rejects its device list at import
            missing = f"torch_rbln is not importable ({type(e).__name__}: {e})"
        rbln = getattr(torch, "rbln", None)
        if rbln is None and not missing:
            missing = "torch_rbln imported but registered no torch.rbln"
        rt = cls(device=torch.device("cpu"), rbln=rbln, compile_available=False, kind=kind, notes=notes)
        if kind == "cpu":
            # The host's CPU by design: never query or claim an NPU here.
            notes.append("computing on the host CPU (engine torch)")
            if not hasattr(rbln, "explain"):
                notes.append(f"explain unavailable ({missing or 'torch.rbln has no explain'}): steps are unmeasured")
            return rt
        if missing:
            rt.unusable = missing
            return rt
        rt.device_count = _query(rbln, "device_count")
        rt.physical_device_count = _query(rbln, "physical_device_count")
        rt.device_summary = _summary(rbln)
        available = _query(rbln, "is_available")
        visible = os.environ.get("RBLN_VISIBLE_DEVICES", "(unset)")
        if available is not True:
            rt.unusable = (f"torch.rbln.is_available() is {available}: no RBLN device visible to this process "
                           f"(RBLN_VISIBLE_DEVICES={visible}; check the driver and the device plugin's allocation)")
            return rt
        try:
            rt.device = torch.device("rbln:0")
        except RuntimeError as e:
            rt.unusable = f"torch has no rbln device type ({e})"
            return rt
        rt.compile_available = hasattr(torch, "compile")
        if not rt.compile_available:
            notes.append("torch.compile unavailable: step bodies run eagerly")
        return rt

    def require_device(self, what: str, tensors: Any) -> None:
        """Raise DeviceError unless the runtime is usable and every tensor
        lies on its device kind."""
        if self.unusable:
            raise DeviceError(f"engine rbln computes only on an RBLN device, and this worker has none: {self.unusable}")
        for t in tensors:
            if t.device.type != self.kind:
                raise DeviceError(f"{what} are on {t.device}, not {self.kind}:*: the engine requires the {self.kind} device")

    def explain(self) -> Any:
        """A fresh explain region, or None where explain is unavailable."""
        if self.rbln is None or not hasattr(self.rbln, "explain"):
            return None
        return self.rbln.explain()


def _query(rbln: Any, name: str) -> Any:
    """A torch.rbln device query, or None where it is missing or fails."""
    fn = getattr(rbln, name, None)
    if fn is None:
        return None
    try:
        return fn()
    except Exception:
        return None


def _summary(rbln: Any) -> Optional[str]:
    """torch.rbln.device_summary(), which prints its table: what it printed
    (or returned), or None."""
    fn = getattr(rbln, "device_summary", None)
    if fn is None:
        return None
    buf = io.StringIO()
    try:
        with redirect_stdout(buf):
            ret = fn()
    except Exception as e:
        return f"device_summary() failed: {type(e).__name__}: {e}"
    text = ret if isinstance(ret, str) else buf.getvalue()
    return text.strip() or None


class Staging:
    """A shared-memory staging file Go created, mapped as a flat tensor."""

    def __init__(self, path: str, nbytes: int, dtype: torch.dtype) -> None:
        self._file = open(path, "r+b")
        self._map = mmap.mmap(self._file.fileno(), nbytes)
        count = nbytes // torch.empty(0, dtype=dtype).element_size()
        self.tensor = torch.frombuffer(self._map, dtype=dtype, count=count) if count else torch.empty(0, dtype=dtype)

    def close(self) -> None:
        del self.tensor
        try:
            self._map.close()
        except BufferError:
            pass  # a view is still alive; the mapping goes with the process
        self._file.close()


@dataclass
class Bucket:
    shape: nets.Shape
    staging_in: Staging
    staging_out: Staging
    device_in: Optional[torch.Tensor] = None
    graph: Optional[Callable[[torch.Tensor], torch.Tensor]] = None


@dataclass
class Model:
    name: str
    module: torch.nn.Module
    buckets: list[Bucket]
    in_dtype: torch.dtype
    in_features: int
    compute_dtype: torch.dtype
    cache_dir: str


class Worker:
    """Handles the supervisor's requests, one at a time."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.models: dict[str, Model] = {}

    # -- requests ---------------------------------------------------------

    def load(self, msg: dict[str, Any]) -> dict[str, Any]:
        name = msg["model"]
        if name in self.models:
            self.unload({"model": name})
        self.rt.require_device("loads", [])
        tensors = safetensors.load(Path(msg["weights"]))
        module = nets.build(msg, tensors).eval()
        on_cpu = self.rt.device.type == "cpu"
        compute = _DTYPES[msg.get("device_dtype", "float16")]
        if on_cpu and os.environ.get(CPU_DTYPE_ENV) != "device":
            compute = torch.float32
        with torch.inference_mode():
            module = module.to(device=self.rt.device, dtype=compute)  # weights move once
        self.rt.require_device(f"model {name!r}'s weights", [*module.parameters(), *module.buffers()])
        in_dtype = _DTYPES[msg["input_dtype"]]
        buckets = [
            Bucket(nets.Shape(b["batch"], b.get("seq", 0)),
                   Staging(b["in_path"], b["in_bytes"], in_dtype),
                   Staging(b["out_path"], b["out_bytes"], torch.float32))
            for b in msg["buckets"]]
        in_features = msg["mlp"]["sizes"][0] if msg.get("architecture") == "mlp" else 0
        self.models[name] = Model(name, module, buckets, in_dtype, in_features, compute, msg.get("compile_cache_dir", ""))
        return {"device": str(self.rt.device), "compiled": self.rt.compile_available, "notes": self.rt.notes,
                "compute_dtype": str(compute).replace("torch.", "")}

    def compile(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Build one bucket's graph and bound input buffer. Nothing runs
        here: the supervisor's warm-up runs each bucket twice (the first run
        builds the graph, since torch.compile is lazy, and re-lays out the
        new buffer) and judges the second."""
        m, b = self._bucket(msg)
        start = time.monotonic()
        body = nets.step_body(m.module, b.shape, m.in_features, m.compute_dtype)
        if self.rt.compile_available:
            opts = {"cache_dir": m.cache_dir} if m.cache_dir else {}
            body = torch.compile(body, backend="rbln", dynamic=False, options=opts)
        b.graph = body
        b.device_in = torch.empty(b.staging_in.tensor.shape, dtype=m.in_dtype, device=self.rt.device)
        if self.rt.device.type != "cpu" and hasattr(self.rt.rbln, "bind_device_memory"):
            self.rt.rbln.bind_device_memory(b.device_in)
        return {"compile_seconds": time.monotonic() - start}

    def step(self, msg: dict[str, Any]) -> dict[str, Any]:
        _, b = self._bucket(msg)
        if b.graph is None:
            # Lazy warm-up: the graph is built now, which is a recompile
            # whatever explain saw (the build happens outside its region).
            self.compile(msg)
            report = self._run(b)
            report.recompiles = (report.recompiles or 0) + 1
            report.clean = False
            report.reasons.append("recompile: the bucket's graph was built on first use, not at load")
            return {"explain": report.to_wire()}
        return {"explain": self._run(b).to_wire()}

    def unload(self, msg: dict[str, Any]) -> dict[str, Any]:
        m = self.models.pop(msg["model"], None)
        if m is not None:
            for b in m.buckets:
                b.staging_in.close()
                b.staging_out.close()
        return {}

    def memory(self, msg: dict[str, Any]) -> dict[str, Any]:
        # A worker on the host CPU has no device memory, and must not query
        # (or wake) an NPU that another worker may own.
        fn = getattr(self.rt.rbln, "memory_stats_per_chiplet", None) if self.rt.kind == "rbln" else None
        if fn is None:
            return {"chiplets": []}
        return {"chiplets": ex.chiplet_memory(fn())}

    # -- the step ---------------------------------------------------------

    def _bucket(self, msg: dict[str, Any]) -> tuple[Model, Bucket]:
        m = self.models.get(msg["model"])
        if m is None:
            raise KeyError(f"model {msg['model']!r} is not loaded on this worker")
        i = msg["bucket"]
        if not 0 <= i < len(m.buckets):
            raise IndexError(f"model {m.name!r} has no bucket {i}")
        return m, m.buckets[i]

    def _body(self, b: Bucket) -> None:
        """One copy in, the graph, one copy out."""
        assert b.device_in is not None and b.graph is not None
        b.device_in.copy_(b.staging_in.tensor)
        out = b.graph(b.device_in)
        b.staging_out.tensor[: out.numel()].copy_(out)

    def _run(self, b: Bucket) -> ex.Report:
        with torch.inference_mode():
            region = self.rt.explain()
            if region is None:
                self._body(b)
                return ex.unmeasured("torch.rbln.explain is unavailable")
            try:
                p = region.__enter__()
            except Exception as e:  # e.g. RuntimeError: regions overlap
                self._body(b)
                return ex.unmeasured(f"explain region failed to open: {type(e).__name__}: {e}")
            try:
                self._body(b)
            except BaseException:
                region.__exit__(*sys.exc_info())
                raise
            try:
                region.__exit__(None, None, None)
                verdict, dump = p.verdict(), p.dump()
                clean = verdict.get("clean") if isinstance(verdict, dict) else None
                text = p.report() if clean is not True else None
            except Exception as e:
                return ex.unmeasured(f"explain region failed to close or report: {type(e).__name__}: {e}")
            return ex.normalize(verdict, dump, text)


class Server:
    """The control loop: a reader thread answers pings at once (so a long
    compile never looks like a hang) and queues everything else for the
    main thread, which runs one request at a time."""

    def __init__(self, sock: socket.socket, worker: Worker) -> None:
        self.sock = sock
        self.out = Writer(sock)
        self.worker = worker
        self.requests: queue.Queue[Optional[dict[str, Any]]] = queue.Queue()

    def hello(self) -> None:
        rt = self.worker.rt
        self.out.send({"type": "hello", "protocol": PROTOCOL_VERSION, "pid": os.getpid(),
                       "torch": torch.__version__, "device": "none" if rt.unusable else str(rt.device),
                       "rbln": rt.rbln is not None, "notes": rt.notes,
                       "device_kind": rt.kind, "unusable": rt.unusable, "device_count": rt.device_count,
                       "physical_device_count": rt.physical_device_count, "device_summary": rt.device_summary})

    def read_loop(self) -> None:
        try:
            while True:
                msg = read_message(self.sock)
                if msg["type"] == "ping":
                    self.out.send({"type": "pong", "id": msg.get("id", 0)})
                elif msg["type"] == "shutdown":
                    break
                else:
                    self.requests.put(msg)
        except EOFError:
            pass
        except ProtocolError as e:
            print(f"stepserve_worker: protocol error from the supervisor: {e}", file=sys.stderr, flush=True)
        finally:
            self.requests.put(None)

    def serve(self) -> None:
        handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "load": self.worker.load, "compile": self.worker.compile, "step": self.worker.step,
            "unload": self.worker.unload, "memory": self.worker.memory,
        }
        threading.Thread(target=self.read_loop, name="reader", daemon=True).start()
        while (msg := self.requests.get()) is not None:
            reply: dict[str, Any] = {"type": "result", "id": msg.get("id", 0)}
            handler = handlers.get(msg["type"])
            try:
                if handler is None:
                    raise ValueError(f"unknown request type {msg['type']!r}")
                reply |= {"ok": True, **handler(msg)}
            except Exception as e:
                print(f"stepserve_worker: {msg['type']} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
                reply |= {"ok": False, "error": f"{type(e).__name__}: {e}"}
            self.out.send(reply)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="stepserve_worker")
    ap.add_argument("--fd", type=int, required=True, help="the control socket's file descriptor")
    ap.add_argument("--device", choices=DEVICE_KINDS, default="rbln",
                    help="where the engine requires this worker to compute: rbln (an RBLN NPU only) or cpu")
    args = ap.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    rt = Runtime.detect(args.device)
    for note in rt.notes:
        print(f"stepserve_worker: {note}", file=sys.stderr, flush=True)
    server = Server(sock, Worker(rt))
    server.hello()
    server.serve()
    return 0
