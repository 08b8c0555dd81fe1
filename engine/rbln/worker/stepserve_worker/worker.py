"""The worker process: one per logical device, started by the Go supervisor
with exec. It loads models (weights moved to the device once), compiles one
step graph per bucket with a bound input buffer, and runs steps inside
torch.rbln.explain(), reading and writing the shared-memory staging buffers
Go created."""

from __future__ import annotations

import argparse
import ctypes
import gc
import io
import mmap
import os
import queue
import signal
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
from . import doorbell as bell
from . import explain as ex
from . import nets
from . import profile as prof
from . import compiler, programs, safetensors, usermodel
from .protocol import ProtocolError, Writer, read_message

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

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


class StagingError(ValueError):
    """The supervisor laid the staging out for another step graph than
    the one this worker builds; the message names the model, the bucket
    and what was expected."""


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
    # NPUs in this worker's logical device (an RSD group when above 1), as
    # the supervisor started it: compiled graphs are partitioned across
    # them (torch.compile's num_devices).
    group_npus: int = 1
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
        try:
            rt.group_npus = max(int(os.environ.get("STEPSERVE_WORKER_NPUS", "1") or 1), 1)
        except ValueError:
            rt.group_npus = 1
        if rt.group_npus > 1:
            notes.append(f"RSD group of {rt.group_npus} NPUs (RBLN_VISIBLE_DEVICES={os.environ.get('RBLN_VISIBLE_DEVICES', '')}, "
                         f"RBLN_NPUS_PER_DEVICE={os.environ.get('RBLN_NPUS_PER_DEVICE', '')}): compiled with num_devices={rt.group_npus}")
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

    def bind(self, t: torch.Tensor) -> None:
        """Give t its device memory now, one flat region at a fixed address
        (torch.rbln.bind_device_memory), where the device has such a call:
        buffers a graph reads or writes in place every step."""
        if self.device.type != "cpu" and hasattr(self.rbln, "bind_device_memory"):
            self.rbln.bind_device_memory(t)

    def explain(self, with_stack: bool = False) -> Any:
        """A fresh explain region, or None where explain is unavailable;
        with_stack records the call sites (a release without the argument
        gets a plain region)."""
        if self.rbln is None or not hasattr(self.rbln, "explain"):
            return None
        if with_stack:
            try:
                return self.rbln.explain(with_stack=True)
            except TypeError:
                pass
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


class StagingMap:
    """Shared memory the supervisor created (a memfd) and passed over the
    control socket, mapped whole; each bucket's buffers are views of it."""

    def __init__(self, fd: int) -> None:
        self._map = mmap.mmap(fd, 0)  # the mapping keeps its own descriptor

    def view(self, offset: int, shape: tuple[int, int], dtype: torch.dtype) -> "Staging":
        return Staging(self._map, offset, shape, dtype)

    def close(self) -> None:
        try:
            self._map.close()
        except BufferError:
            pass  # a view is still alive; the mapping goes with the process


class Staging:
    """One staging buffer: a [batch, row] tensor over part of a StagingMap."""

    def __init__(self, mapping: mmap.mmap, offset: int, shape: tuple[int, int], dtype: torch.dtype) -> None:
        count = shape[0] * shape[1]
        self.tensor = (torch.frombuffer(mapping, dtype=dtype, count=count, offset=offset).view(shape) if count
                       else torch.empty(shape, dtype=dtype))

    def view(self) -> dict[str, Any]:
        """The buffer as this worker reads it, for the load reply."""
        t = self.tensor
        return {"dtype": _dtype_name(t.dtype), "shape": list(t.shape), "element_bytes": t.element_size()}

    def close(self) -> None:
        del self.tensor


@dataclass
class Bucket:
    shape: nets.Shape
    bound: nets.Boundary
    staging_in: Staging
    staging_out: Staging
    # The staging lanes after the first (double buffering): (in, out)
    # each, the same layout as the first's.
    lanes: list[tuple[Staging, Staging]] = field(default_factory=list)
    device_in: Optional[torch.Tensor] = None
    graph: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
    # The bucket's first step that was not clean makes the next one open
    # its explain region with_stack=True, once, so that its report (in
    # /explain) shows the call sites.
    stack_next: bool = False
    stacked: bool = False
    # Where torch.compile writes this bucket's artifacts ("" for its
    # default), and what inspecting them found once the graph was built
    # (programs.inspect).
    cache_dir: str = ""
    host_ops: Optional[dict[str, Any]] = None
    inspected: bool = False
    built_ns: int = 0  # when its graph was built: the artifacts since are its program's
    # The NPUs its program spans (the RSD group's, or 1 after a
    # tensor-parallel failover), and whether it has run since it was
    # compiled (its first run builds it).
    num_devices: int = 1
    ran: bool = False
    # What compiles its step and what building and running it showed
    # (compiler.Program); None until its graph is built.
    program: Optional[compiler.Program] = None


@dataclass
class Model:
    name: str
    module: Optional[torch.nn.Module]  # None once unloaded
    buckets: list[Bucket]
    compute_dtype: torch.dtype
    cache_dir: str
    staging: list[StagingMap] = field(default_factory=list)
    # The load message of an architecture torch model (its signature);
    # None for the built-in architectures.
    user: Optional[dict[str, Any]] = None
    # model.yaml tp_failover: a bucket whose program fails across the RSD
    # group is compiled again for one NPU.
    tp_failover: bool = False
    # Names its compiled programs' directory (programs.identity).
    identity: str = ""
    # What compiles its buckets' steps (compiler.RBLN, INDUCTOR or NONE),
    # and why none does, if so.
    compiler: str = compiler.NONE
    compile_note: str = ""
    # rbln.strict_warmup: a graph break or a compiler error refuses the
    # bucket (and, on the rbln engine, audit findings) instead of serving
    # it eagerly.
    strict: bool = True


class Worker:
    """Handles the supervisor's device requests, one at a time, and reads
    the device memory."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.models: dict[str, Model] = {}
        self.slots: dict[int, str] = {}  # the doorbell's model numbers

    # -- requests ---------------------------------------------------------

    def load(self, msg: dict[str, Any]) -> dict[str, Any]:
        _test_crash_on_load()
        name = msg["model"]
        if name in self.models:
            self.unload({"model": name})
        self.rt.require_device("loads", [])
        compute = self._compute_dtype(name, msg)
        try:
            chosen, compile_note = compiler.choose(self.rt.kind, msg.get("torch_compile") or "auto", self.rt.compile_available)
        except compiler.Unavailable as e:
            raise compiler.Unavailable(f"model {name!r}: {e}") from None
        maps = [StagingMap(fd) for fd in msg.get("fds", [])]
        try:
            buckets = [_staged_bucket(msg, i, compute, maps) for i in range(len(msg["buckets"]))]
        except BaseException:
            for sm in maps:
                sm.close()
            raise
        user = msg.get("architecture") == "torch"
        try:
            if user:
                module = usermodel.build(msg)
            else:
                # Sharded weights come as weight_files; the tensors the
                # supervisor found unused (skip_tensors) are not read.
                files = [Path(f) for f in msg.get("weight_files") or [msg["weights"]]]
                module = nets.build(msg, safetensors.load_all(files, frozenset(msg.get("skip_tensors") or ()))).eval()
            if user:
                # The declared signature, checked once on zeros on the host
                # CPU in float32 (shapes and types only) before the weights
                # move and before any graph is built: a wrong output count
                # or shape fails the load, naming the output. Not eagerly on
                # the device: with the unsupported_op fallback disabled, a
                # module the compiler lowers whole but with one operator
                # outside the eager tables would be refused, which is the
                # case the documentation compiles for. The compiled graph is
                # judged by the warm-up (clean and finite, strict_warmup).
                with torch.inference_mode():
                    module = module.float()
                ins, outs = usermodel.signature(msg, buckets[0].shape.seq, torch.float32)
                if problem := usermodel.probe(module, buckets[0].shape.batch, ins, outs):
                    raise usermodel.UserModelError(f"{msg['torch'].get('name') or msg['torch']['module']}: {problem}")
            with torch.inference_mode():
                module = module.to(device=self.rt.device, dtype=compute)  # weights move once
            self.rt.require_device(f"model {name!r}'s weights", [*module.parameters(), *module.buffers()])
            if nets.is_decoder(module):
                # The KV cache's buffers get their device memory now, as
                # the input buffers do: every step's graph writes them in
                # place.
                for t in module.kv_buffers():
                    self.rt.bind(t)
        except BaseException:
            usermodel.forget(name)
            for sm in maps:
                sm.close()
            raise
        self.models[name] = Model(name, module, buckets, compute, msg.get("compile_cache_dir", ""), maps,
                                  msg if user else None, bool(msg.get("tp_failover")), programs.identity(msg),
                                  chosen, compile_note, msg.get("strict_warmup", True) is not False)
        if isinstance(msg.get("slot"), int):
            self.slots[msg["slot"]] = name
        notes = self.rt.notes + ([compile_note] if compile_note else [])
        return {"device": str(self.rt.device), "compiled": chosen != compiler.NONE, "compiler": chosen, "notes": notes,
                "compile_note": compile_note,
                "compute_dtype": _dtype_name(compute),
                "staging": [{"in": b.staging_in.view(), "out": b.staging_out.view()} for b in buckets]}

    def _compute_dtype(self, name: str, msg: dict[str, Any]) -> torch.dtype:
        """The dtype to compute the model in, which must be the one the
        supervisor staged its floats in: the model's device_dtype, except
        on the host CPU, whose torch has no float16 matmul, float32 unless
        CPU_DTYPE_ENV says "device"."""
        compute, why = _DTYPES[msg.get("device_dtype", "float16")], "the model's device_dtype"
        if self.rt.device.type == "cpu" and os.environ.get(CPU_DTYPE_ENV) != "device":
            compute, why = torch.float32, f"on the host CPU unless {CPU_DTYPE_ENV}=device"
        if msg.get("compute_dtype") != _dtype_name(compute):
            raise StagingError(f"model {name!r}: the supervisor staged its floats as {msg.get('compute_dtype')}, "
                               f"but this worker computes it in {_dtype_name(compute)} ({why})")
        return compute

    def compile(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Build one bucket's graph and bound input buffer. Nothing runs
        here: the supervisor's warm-up runs each bucket twice (the first run
        builds the graph, since torch.compile is lazy, and re-lays out the
        new buffer) and judges the second."""
        m, b = self._bucket(msg)
        start = time.monotonic()
        self._build(m, b, msg["bucket"], self.rt.group_npus)
        return {"compile_seconds": time.monotonic() - start}

    def _build(self, m: Model, b: Bucket, bucket: int, num_devices: int) -> None:
        """Bucket's step graph, compiled (lazily) for num_devices NPUs, and
        its bound input buffer."""
        if m.user is not None:
            ins, outs = usermodel.signature(m.user, b.shape.seq, m.compute_dtype)
            body = usermodel.step_body(m.module, b.shape.batch, ins, b.bound.in_row, outs, b.bound.out_row,
                                       name=_code_name(m.name, bucket))
        else:
            body = nets.step_body(m.module, b.shape, b.bound, name=_code_name(m.name, bucket))
        kind = "step"
        if m.user is None and nets.is_decoder(m.module):
            kind = "decode" if b.shape.seq == 1 else "prefill"
        prog = compiler.Program(b.shape.label(), kind, m.compiler, m.strict,
                                refuse_findings=self.rt.kind == "rbln" and m.strict)
        # A program that may fail across an RSD group goes back to the
        # worker, which compiles it again for one NPU (tp_failover).
        prog.raise_compile_errors = m.tp_failover and num_devices > 1
        opts: dict[str, Any] = {}
        if m.compiler == compiler.RBLN:
            if m.cache_dir:
                # Each bucket's artifacts in a directory of their own, so
                # that the program built there is the one inspected (an
                # RSD group's apart from single-NPU ones).
                base = m.cache_dir
                if num_devices > 1:
                    base = os.path.join(base, f"npus{num_devices}")
                b.cache_dir = programs.bucket_dir(base, m.identity, b.shape.batch, b.shape.seq, b.shape.ctx, b.shape.mask)
                opts["cache_dir"] = b.cache_dir
            if self.rt.group_npus > 1:
                # An RSD group: the graph is partitioned across its NPUs
                # (num_devices overrides the group's size: 1 after a
                # tensor-parallel failover).
                opts["num_devices"] = num_devices
        # fullgraph: a graph break would split the step into several
        # programs with eager code between them; the first run refuses it
        # (or, without strict warm-up, counts it on every step).
        b.program = prog
        b.graph, b.inspected, b.ran, b.num_devices = prog.compile(body, opts), False, False, num_devices
        b.built_ns = time.time_ns()
        b.device_in = torch.empty(b.staging_in.tensor.shape, dtype=b.bound.in_dtype, device=self.rt.device)
        self.rt.bind(b.device_in)

    def step(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A step asked for as a message: its explain report, the ns its
        body took (body_ns; absent for a first step, whose body builds the
        graph), and, when msg asks for "profile", the step's torch.profiler
        events (profile.py)."""
        m, b = self._bucket(msg)
        lane = msg.get("lane", 0)
        first = b.graph is None
        if first:
            # Lazy warm-up: the graph is built now, which is a recompile
            # whatever explain saw (the build happens outside its region).
            self.compile(msg)
        reply: dict[str, Any] = {}
        failover = ""
        try:
            report, ns = self._profiled_run(m, b, msg, lane, reply)
        except compiler.CompileRefused:
            raise  # the step itself: no number of NPUs changes it
        except RuntimeError as e:
            if b.ran or not m.tp_failover or b.num_devices <= 1:
                raise
            # Tensor-parallel failover (torch-rbln's TORCH_RBLN_USE_TP_FAILOVER,
            # for this model): the program failed across the group on its
            # first run; it is compiled again for one NPU and runs on the
            # group's first.
            failover = (f"tensor-parallel failover: the bucket's program failed across the {b.num_devices}-NPU group "
                        f"({type(e).__name__}: {str(e)[:300]}); compiled again with num_devices=1, it runs on the "
                        f"group's first NPU (model.yaml tp_failover)")
            print(f"stepserve_worker: model {m.name!r} bucket {msg['bucket']}: {failover}", file=sys.stderr, flush=True)
            self._build(m, b, msg["bucket"], 1)
            report, ns = self._profiled_run(m, b, msg, lane, reply)
        b.ran = True
        if failover:
            report.notes = report.notes + [failover]
        if first:
            report.recompiles = (report.recompiles or 0) + 1
            report.clean = False
            report.reasons.append("recompile: the bucket's graph was built on first use, not at load")
        else:
            reply["body_ns"] = ns
        if b.program is not None and b.program.compiler == compiler.RBLN and not b.inspected:
            # The graph's first run built its program (torch.compile is
            # lazy): its host operators, which explain() cannot see, are
            # read from the artifact now.
            b.inspected = True
            b.host_ops = programs.inspect(b.cache_dir, since_ns=b.built_ns)
            reply["host_ops"] = b.host_ops
        reply["explain"] = report.to_wire()
        return reply

    def _profiled_run(self, m: Model, b: Bucket, msg: dict[str, Any], lane: int,
                      reply: dict[str, Any]) -> tuple[ex.Report, int]:
        """The step, under torch.profiler when msg asks for it (its events
        go in reply)."""
        if msg.get("profile"):
            with prof.StepProfile(self.rt.rbln, f"{prof.ANCHOR} {m.name} bucket {msg['bucket']}") as p:
                out = self._run_timed(b, lane)
            reply["profile"] = p.result()
            return out
        return self._run_timed(b, lane)

    def programs(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Each bucket's compiled program, in bucket order, as
        compiler.Program.report() gives it (a bucket not built yet: its
        compiler, and nothing counted)."""
        m = self.models.get(msg["model"])
        if m is None:
            raise KeyError(f"model {msg['model']!r} is not loaded on this worker")
        out = []
        for b in list(m.buckets):
            p = b.program
            if p is None:
                out.append({"bucket": b.shape.label(), "compiler": m.compiler, "built": False})
                continue
            r = p.report()
            if m.compile_note and "note" not in r:
                r["note"] = m.compile_note
            if b.host_ops is not None:
                r["host_ops"] = b.host_ops.get("count")
            out.append(r)
        return {"programs": out, "note": m.compile_note}

    def unload(self, msg: dict[str, Any]) -> dict[str, Any]:
        m = self.models.pop(msg["model"], None)
        usermodel.forget(msg["model"])
        self.slots = {k: v for k, v in self.slots.items() if v != msg["model"]}
        if m is not None:
            for b in m.buckets:
                # The compiled graph (its code object's cache) and the bound
                # buffer go with the bucket's references to them.
                b.graph, b.device_in, b.program = None, None, None
                b.staging_in.close()
                b.staging_out.close()
                for sin, sout in b.lanes:
                    sin.close()
                    sout.close()
                b.lanes.clear()
            for sm in m.staging:
                sm.close()
            m.buckets.clear()
            m.module = None
            del m
            gc.collect()
            kept = self._release_programs()
            # Freed tensors stay in the caching allocator until emptied.
            empty = getattr(self.rt.rbln, "empty_cache", None) if self.rt.kind == "rbln" else None
            if empty is not None:
                empty()
            if kept:
                return {"notes": [kept]}
        return {}

    def _release_programs(self) -> str:
        """Release compiled programs' device buffers after an unload:
        dropping a graph's references leaves its program in dynamo's cache,
        which only torch._dynamo.reset() clears (execution semantics, the
        torch.compile section). reset() clears every model's, so it runs
        only when no model left on this worker has a compiled graph; else
        the unloaded model's programs stay cached until the last compiled
        model here unloads, and the note returned says so."""
        if not self.rt.compile_available and not compiler.has_dynamo():
            return ""
        others = sorted(n for n, o in self.models.items()
                        if any(b.program is not None and b.program.compiler != compiler.NONE for b in o.buckets))
        if others:
            return (f"compiled programs stay cached on this worker: torch._dynamo.reset() would drop those of "
                    f"{', '.join(others)} too; they are released when the last compiled model here unloads")
        reset = getattr(getattr(torch, "_dynamo", None), "reset", None)
        if reset is None:
            return "torch._dynamo.reset() is unavailable: compiled programs stay cached until the worker restarts"
        reset()
        return ""

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
        lane = msg.get("lane", 0)
        if not 0 <= lane <= len(m.buckets[i].lanes):
            raise IndexError(f"model {m.name!r} bucket {i} has no staging lane {lane}")
        return m, m.buckets[i]

    def _body(self, b: Bucket, lane: int = 0) -> int:
        """One copy in, the graph, one copy out, on staging lane lane: the
        staging holds the graph's boundary tensors as they are (dtype and
        padded shape). Returns the ns it took."""
        assert b.device_in is not None and b.graph is not None
        sin, sout = (b.staging_in, b.staging_out) if lane == 0 else b.lanes[lane - 1]
        start = time.perf_counter_ns()
        b.device_in.copy_(sin.tensor)
        sout.tensor.copy_(b.graph(b.device_in))
        return time.perf_counter_ns() - start

    def _run(self, b: Bucket, lane: int = 0) -> ex.Report:
        return self._run_timed(b, lane)[0]

    def _run_timed(self, b: Bucket, lane: int = 0) -> tuple[ex.Report, int]:
        kind, value, ns = self._measure(b, lane)
        if kind == "clean":
            verdict, dump = value
            return ex.normalize(verdict, dump, None), ns
        return value, ns

    def _measure(self, b: Bucket, lane: int = 0) -> tuple[str, Any, int]:
        """Run the step inside an explain region: ("clean", (verdict, dump),
        ns) for a clean step, whose report the caller builds as it needs;
        ("report", Report, ns) for any other."""
        with torch.inference_mode():
            stacked = b.stack_next
            if stacked:
                b.stack_next, b.stacked = False, True
            region = self.rt.explain(with_stack=stacked)
            if region is None:
                ns = self._body(b, lane)
                return "report", _compiled_signals(b, None, "torch.rbln.explain is unavailable"), ns
            try:
                p = region.__enter__()
            except Exception as e:  # e.g. RuntimeError: regions overlap
                ns = self._body(b, lane)
                return "report", _compiled_signals(b, None, f"explain region failed to open: {type(e).__name__}: {e}"), ns
            try:
                ns = self._body(b, lane)
            except BaseException:
                region.__exit__(*sys.exc_info())
                raise
            try:
                region.__exit__(None, None, None)
                verdict = p.verdict()
                if type(verdict) is dict and verdict.get("clean") is True and not _signalled(b):
                    return "clean", (verdict, p.dump()), ns
                dump = p.dump()
                clean = verdict.get("clean") if isinstance(verdict, dict) else None
                text = p.report() if clean is not True else None
            except Exception as e:
                return "report", ex.unmeasured(f"explain region failed to close or report: {type(e).__name__}: {e}"), ns
            r = ex.normalize(verdict, dump, text)
            if self.rt.kind == "cpu":
                r = ex.host_step(r)
            r = _compiled_signals(b, r, "")
            if stacked:
                r.notes = r.notes + ["explain(with_stack=True): this report carries the call sites"]
            elif not r.clean and not b.stacked:
                b.stack_next = True
            return "report", r, ns

    def step_binary(self, slot: int, bucket: int, lane: int = 0) -> tuple[int, tuple[int, ...], int, bytes]:
        """A step asked for over the doorbell: (flags, counters, body ns,
        text) for its binary report. A clean step's report is its counters
        alone, read straight from the region."""
        name = self.slots.get(slot)
        if name is None:
            raise KeyError(f"model slot {slot} is not loaded on this worker")
        msg = {"model": name, "bucket": bucket, "lane": lane}
        m, b = self._bucket(msg)
        if b.graph is None:
            # The supervisor sends a bucket's first step as a message (it
            # builds the graph, announced); this one was compiled anew.
            r = ex.Report.from_wire(self.step(msg)["explain"])
            return _flags(r), _wire_counts(r), 0, bell.extras(r)
        kind, value, ns = self._measure(b, lane)
        if kind == "clean":
            verdict, dump = value
            counts = ex.counters(verdict, dump)
            if None in counts:
                counts = tuple(-1 if c is None else c for c in counts)
            return bell.FLAG_MEASURED | bell.FLAG_CLEAN, counts, ns, b""
        return _flags(value), _wire_counts(value), ns, bell.extras(value)


def _signalled(b: Bucket) -> bool:
    """Whether the bucket's last step recompiled or fell back to the host
    at a graph break, as Dynamo counted it."""
    p = b.program
    return p is not None and (p.step_recompiles > 0 or p.step_fallbacks > 0)


def _compiled_signals(b: Bucket, r: Optional[ex.Report], unmeasured: str) -> ex.Report:
    """The step's report with what the compiler counted in it added: a
    recompile (a graph captured after the first run, with Dynamo's guard
    failure) and the falls back to the host at graph breaks. Where no
    explain region saw the step (r None), the compiler's counts are the
    report, measured for those two signals alone (every other count
    unknown); without a compiler that counts, the step is unmeasured."""
    p = b.program
    if r is None:
        # Only a host step is the compiler's to measure: on a device the
        # signals are the runtime's, which nobody observed.
        if p is None or not p.counted or p.compiler != compiler.INDUCTOR:
            return ex.unmeasured(unmeasured)
        r = ex.Report(measured=True, clean=True, cpu_fallbacks=0, recompiles=0,
                      notes=[f"counted by the compiler ({p.compiler}): {unmeasured}; its other counters are unknown"])
    if p is None or not _signalled(b):
        return r
    if p.step_recompiles:
        r.recompiles = (r.recompiles or 0) + p.step_recompiles
        why = p.recompile_reasons[-1] if p.recompile_reasons else "no guard failure recorded"
        r.reasons.append(f"recompile: the bucket's step graph was compiled again after warm-up ({why})")
    if p.step_fallbacks:
        r.cpu_fallbacks = (r.cpu_fallbacks or 0) + p.step_fallbacks
        where = "; ".join(f"{x['line'] or '?'} {x['reason']}" for x in p.breaks[:4])
        r.reasons.append(f"cpu_fallback: the step graph breaks {p.step_fallbacks} time(s), each a fall back to the host ({where})")
    r.clean = False
    return r


def _flags(r: ex.Report) -> int:
    return (bell.FLAG_MEASURED if r.measured else 0) | (bell.FLAG_CLEAN if r.clean else 0) | bell.FLAG_EXTRAS


def _wire_counts(r: ex.Report) -> tuple[int, ...]:
    d = r.dispatch or {}
    return (tuple(-1 if (v := getattr(r, k)) is None else v for k in bell.COUNTERS)
            + tuple(-1 if (v := d.get(k)) is None else v for k in bell.DISPATCH))


#: The requests the device thread runs, one at a time and in the order they
#: came; the others (ping, memory, cancel) are control requests, answered at
#: once by the main thread.
DEVICE_REQUESTS = ("load", "compile", "step", "unload")

#: TEST ONLY (the supervisor's fault tests): "<seconds>" makes every compile
#: request sleep that long before it starts, "<seconds>:gil" holding the
#: interpreter lock throughout, as a compile stuck in native code would.
#: How old the device memory reading may grow while steps keep the device
#: thread busy before it is read again, between two steps.
MEMORY_REFRESH_SECONDS = 5.0

TEST_COMPILE_SLEEP_ENV = "STEPSERVE_WORKER_TEST_COMPILE_SLEEP"
# For the supervisor's fault tests: while the file this names exists, a load
# kills the process, as a model that crashes the device would.
TEST_CRASH_ON_LOAD_ENV = "STEPSERVE_WORKER_TEST_CRASH_ON_LOAD"


class Server:
    """The control loop. The main thread reads the supervisor's messages and
    answers the control requests itself; the device requests go, in order,
    to one device thread, which runs them one at a time, so that explain
    regions never overlap and a compile never delays a pong or a memory
    reading.

    A device request that builds a graph (load, compile, a bucket's first
    step) is announced with a "building" message before it starts: it may
    hold the interpreter lock for minutes, during which this process answers
    nothing, and the supervisor then watches the process and the compile
    deadline instead of pings."""

    def __init__(self, sock: socket.socket, worker: Worker, doorbell: Optional[bell.Doorbell] = None) -> None:
        self.sock = sock
        self.out = Writer(sock)
        self.worker = worker
        # The device thread sleeps on the bell: the supervisor rings it for
        # a step, the main thread for a queued device request.
        self.bell = doorbell if doorbell is not None else bell.Doorbell()
        self._requests: queue.Queue[Optional[dict[str, Any]]] = queue.Queue()
        self._lock = threading.Lock()  # guards _queued and _cancelled
        self._queued: set[int] = set()  # ids of the device requests waiting to run
        self._cancelled: set[int] = set()  # of those, the ones the supervisor gave up on
        self._busy = threading.Lock()  # held by the device thread while it runs a request
        self._memory: dict[str, Any] = {"chiplets": []}  # the last reading, for while it is busy
        self._memory_at = 0.0  # when it was read (time.monotonic()); 0: never
        self._ran: set[tuple[str, int]] = set()  # (model, bucket) whose graph has run
        self._stopping = threading.Event()
        self._terminated = False
        self._device = threading.Thread(target=self._device_loop, name="device", daemon=True)

    def hello(self) -> None:
        rt = self.worker.rt
        self.out.send({"type": "hello", "protocol": PROTOCOL_VERSION, "pid": os.getpid(),
                       "torch": torch.__version__, "device": "none" if rt.unusable else str(rt.device),
                       "rbln": rt.rbln is not None, "notes": rt.notes,
                       "device_kind": rt.kind, "unusable": rt.unusable, "device_count": rt.device_count,
                       "physical_device_count": rt.physical_device_count, "device_summary": rt.device_summary,
                       "doorbell": self.bell.block is not None})

    def terminate(self, signum: int, frame: Any) -> None:
        """The SIGTERM (and SIGINT) handler: stop as the supervisor's exit
        would, without a traceback. It runs on the main thread, which then
        reads the end of the stream."""
        self._terminated = True
        try:
            self.sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def serve(self) -> int:
        """Answer requests until shutdown, SIGTERM or the supervisor's exit;
        returns the exit status."""
        self._device.start()
        why = "the supervisor closed the control socket"
        try:
            while True:
                msg = read_message(self.sock)
                if msg["type"] == "shutdown":
                    why = "shutdown requested"
                    break
                if msg["type"] in DEVICE_REQUESTS:
                    with self._lock:
                        self._queued.add(msg.get("id", 0))
                    self._requests.put(msg)
                    self.bell.wake()
                else:
                    _close_fds(msg)
                    self._control(msg)
        except EOFError:
            pass
        except ProtocolError as e:
            why = f"protocol error from the supervisor: {e}"
            print(f"stepserve_worker: {why}", file=sys.stderr, flush=True)
        if self._terminated:
            why = "terminated by a signal"
        return self._stop(why, wait=why == "shutdown requested")

    def _control(self, msg: dict[str, Any]) -> None:
        kind = msg["type"]
        if kind == "ping":
            self.out.send({"type": "pong", "id": msg.get("id", 0)})
        elif kind == "cancel":
            with self._lock:
                if msg.get("target") in self._queued:
                    self._cancelled.add(msg["target"])
        elif kind == "memory":
            self._answer(msg, self._memory_now)
        elif kind == "programs":
            # Read while the device thread runs: the reports are plain
            # values it replaces, never half-written.
            self._answer(msg, self.worker.programs)
        else:
            self._answer(msg, None)

    def _memory_now(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The device memory, read now while the device thread is idle
        (never inside a step's explain region, whose counters are
        process-wide), else the last reading."""
        if not self._busy.acquire(blocking=False):
            return dict(self._memory, cached=True, age_seconds=self._memory_age())
        try:
            self._memory = self.worker.memory(msg)
            self._memory_at = time.monotonic()
        finally:
            self._busy.release()
        return dict(self._memory, cached=False, age_seconds=0.0)

    def _memory_age(self) -> float:
        return max(time.monotonic() - self._memory_at, 0.0) if self._memory_at else -1.0

    def _remember_memory(self) -> None:
        """Read the device memory now (on the device thread, between
        steps, never inside an explain region)."""
        try:
            self._memory = self.worker.memory({})
            self._memory_at = time.monotonic()
        except Exception as e:
            print(f"stepserve_worker: reading device memory failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)

    def _refresh_memory(self) -> None:
        """Between steps, read the device memory again once the last
        reading is MEMORY_REFRESH_SECONDS old: a poll that comes while
        steps keep the device thread busy is answered with a reading that
        old at most, not the one from the last load."""
        if time.monotonic() - self._memory_at >= MEMORY_REFRESH_SECONDS:
            self._remember_memory()

    def _answer(self, msg: dict[str, Any], handler: Optional[Callable[[dict[str, Any]], dict[str, Any]]]) -> None:
        self.out.send(self._result(msg, handler))

    def _result(self, msg: dict[str, Any], handler: Optional[Callable[[dict[str, Any]], dict[str, Any]]]) -> dict[str, Any]:
        """Run handler: its result, or its error."""
        reply: dict[str, Any] = {"type": "result", "id": msg.get("id", 0)}
        try:
            if handler is None:
                raise ValueError(f"unknown request type {msg['type']!r}")
            reply |= {"ok": True, **handler(msg)}
        except Exception as e:
            print(f"stepserve_worker: {msg['type']} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            self._log_oom(e)
            reply |= {"ok": False, "error": f"{type(e).__name__}: {e}"}
        finally:
            _close_fds(msg)  # what the handler keeps, it has mapped
        return reply

    def _device_loop(self) -> None:
        """Sleep on the bell; when rung, run the queued device requests in
        order, then the step the supervisor asked for, if any."""
        handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "load": self.worker.load, "compile": self.worker.compile, "step": self.worker.step,
            "unload": self.worker.unload,
        }
        try:
            while True:
                self.bell.wait()
                while True:
                    try:
                        msg = self._requests.get_nowait()
                    except queue.Empty:
                        break
                    if msg is None:
                        return
                    self._device_request(msg, handlers)
                if (req := self.bell.request()) is not None and not self._stopping.is_set():
                    self._bell_step(*req)
        except OSError:
            return  # the socket is gone: the main thread is stopping
        except Exception:  # noqa: BLE001 - a bug here must not leave callers waiting
            # The thread that answers pings would go on while nobody
            # answers device requests: end the process instead, and the
            # supervisor restarts it.
            traceback.print_exc(file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)

    def _device_request(self, msg: dict[str, Any], handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]]) -> None:
        rid = msg.get("id", 0)
        with self._lock:
            self._queued.discard(rid)
            cancelled = rid in self._cancelled
            self._cancelled.discard(rid)
        try:
            if self._stopping.is_set():
                return  # nobody waits for it any more
            if cancelled:
                self.out.send({"type": "result", "id": rid, "ok": False,
                               "error": "cancelled: the supervisor gave up on it before it ran"})
                return
            with self._busy:
                building = self._builds(msg)
                if building:
                    self.out.send({"type": "building", "id": rid})
                if msg["type"] == "compile":
                    _test_compile_sleep()
                reply = self._result(msg, handlers[msg["type"]])
                self._ran_after(msg, reply["ok"])
                if msg["type"] != "step" or building:
                    # Device memory changed: loads, compiles, unloads, and a
                    # bucket's first step, which builds its graph and
                    # commits lazily allocated weights and buffers.
                    self._remember_memory()
                else:
                    self._refresh_memory()
            # Answered once idle: a memory poll that follows reads live.
            self._reply(rid, reply)
        finally:
            _close_fds(msg)

    def _bell_step(self, seq: int, slot: int, bucket: int, lane: int) -> None:
        """Run a step the supervisor rang for and write its binary report;
        a step that fails reports its error, as a step message's would."""
        # A graph built inside this step (a recompile) is announced on the
        # block, so that the supervisor waits for it as for a compile.
        compiler.on_build = lambda: self.bell.building(seq)
        try:
            with self._busy:
                flags, counts, ns, text = self.worker.step_binary(slot, bucket, lane)
        except Exception as e:
            print(f"stepserve_worker: step failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            self._log_oom(e)
            self.bell.fail(seq, f"{type(e).__name__}: {e}")
            return
        finally:
            compiler.on_build = None
        self.bell.report(seq, bell.STATUS_DONE, flags, counts, ns, text)
        if time.monotonic() - self._memory_at >= MEMORY_REFRESH_SECONDS:
            with self._busy:  # after the report: the step's latency is not the reading's
                self._refresh_memory()

    def _log_oom(self, e: BaseException) -> None:
        """On a device out-of-memory error, print torch.rbln.memory_summary()
        (one row per NPU and chiplet: one full chiplet is the usual cause
        when the totals look comfortable), and read the memory again so
        that the OOM counters reach the gauges."""
        if "out of memory" not in str(e).lower():
            return
        summary = getattr(self.worker.rt.rbln, "memory_summary", None) if self.worker.rt.kind == "rbln" else None
        if summary is not None:
            try:
                print(f"stepserve_worker: device out of memory; memory_summary():\n{summary()}", file=sys.stderr, flush=True)
            except Exception as se:
                print(f"stepserve_worker: memory_summary() failed: {type(se).__name__}: {se}", file=sys.stderr, flush=True)
        self._memory_at = 0.0  # stale: the next chance re-reads it

    def _reply(self, rid: int, reply: dict[str, Any]) -> None:
        """Send reply; one that cannot be encoded (too large, not JSON) is
        answered as an error instead, so its caller never waits forever."""
        try:
            self.out.send(reply)
        except (ProtocolError, TypeError, ValueError) as e:
            self.out.send({"type": "result", "id": rid, "ok": False,
                           "error": f"the worker could not encode its reply: {e}"})

    def _builds(self, msg: dict[str, Any]) -> bool:
        kind = msg["type"]
        return kind in ("load", "compile") or (kind == "step" and (msg["model"], msg["bucket"]) not in self._ran)

    def _ran_after(self, msg: dict[str, Any], ok: bool) -> None:
        """Keep track of which buckets' graphs have run, so that a bucket's
        first step (which builds its graph: torch.compile is lazy) is known
        to build."""
        kind, model = msg["type"], msg.get("model")
        if kind == "step" and ok:
            self._ran.add((model, msg["bucket"]))
        elif kind == "compile":
            self._ran.discard((model, msg["bucket"]))
        elif kind in ("load", "unload"):
            self._ran = {r for r in self._ran if r[0] != model}

    def _stop(self, why: str, wait: bool) -> int:
        """Stop the device thread: after its current request on shutdown
        (until a signal says not to wait), at once otherwise."""
        print(f"stepserve_worker: stopping: {why}", flush=True)
        self._stopping.set()
        self._requests.put(None)
        self.bell.wake()
        self._device.join(1.0)
        while wait and self._device.is_alive() and not self._terminated:
            self._device.join(0.1)
        if self._device.is_alive():
            # A request cannot be interrupted: the process ends under it, as
            # it would under SIGKILL.
            print("stepserve_worker: exiting with a device request still running", flush=True)
            os._exit(0)
        return 0


def _staged_bucket(msg: dict[str, Any], i: int, compute: torch.dtype, maps: list[StagingMap]) -> Bucket:
    """Bucket i of the model msg loads, over its staging, once the
    supervisor's layout of it is shown to be the step graph's boundary."""
    spec = msg["buckets"][i]
    shape = nets.Shape(spec["batch"], spec.get("seq", 0), spec.get("ctx", 0), bool(spec.get("mask", False)))
    bound = nets.boundary(msg, shape, compute)
    problems = []
    for side, dtype, cols in (("in", bound.in_dtype, bound.in_cols), ("out", bound.out_dtype, bound.out_cols)):
        row = nets.padded(cols)
        nbytes = shape.batch * row * torch.empty(0, dtype=dtype).element_size()
        got = tuple(spec.get(f"{side}_{k}") for k in ("dtype", "cols", "row", "bytes"))
        if got != (_dtype_name(dtype), cols, row, nbytes):
            problems.append(f"{side}put {got[0]}[{shape.batch}, {got[2]}] of {got[1]} data columns in {got[3]} bytes, "
                            f"want {_dtype_name(dtype)}[{shape.batch}, {row}] of {cols} in {nbytes}")
    if problems:
        raise StagingError(f"model {msg['model']!r} bucket {i} ({shape.label()}): the staging is laid out for another step graph: "
                           + "; ".join(problems))
    def views(in_offset: int, out_offset: int) -> tuple[Staging, Staging]:
        return (maps[spec["in_fd"]].view(in_offset, (shape.batch, bound.in_row), bound.in_dtype),
                maps[spec["out_fd"]].view(out_offset, (shape.batch, bound.out_row), bound.out_dtype))
    sin, sout = views(spec["in_offset"], spec["out_offset"])
    return Bucket(shape, bound, sin, sout, lanes=[views(ln["in_offset"], ln["out_offset"]) for ln in spec.get("lanes", [])])


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _close_fds(msg: dict[str, Any]) -> None:
    for fd in msg.pop("fds", []):
        os.close(fd)


def _code_name(model: str, bucket: int) -> str:
    """A Python identifier naming one model's bucket, for its step's code
    object (and in Dynamo's logs)."""
    safe = "".join(c if c.isalnum() else "_" for c in model)
    return f"step_{safe}_b{bucket}"


def _test_crash_on_load() -> None:
    path = os.environ.get(TEST_CRASH_ON_LOAD_ENV)
    if path and os.path.exists(path):
        os._exit(3)


def _test_compile_sleep() -> None:
    value = os.environ.get(TEST_COMPILE_SLEEP_ENV)
    if not value:
        return
    seconds, _, how = value.partition(":")
    if how == "gil":
        # A foreign call through PyDLL keeps the interpreter lock.
        ctypes.PyDLL(None).usleep(ctypes.c_uint(int(float(seconds) * 1e6)))
    else:
        time.sleep(float(seconds))


def main(argv: Optional[list[str]] = None) -> int:
    # Until the server takes over: a signal while torch imports ends the
    # process quietly.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    ap = argparse.ArgumentParser(prog="stepserve_worker")
    ap.add_argument("--fd", type=int, required=True, help="the control socket's file descriptor")
    ap.add_argument("--device", choices=DEVICE_KINDS, default="rbln",
                    help="where the engine requires this worker to compute: rbln (an RBLN NPU only) or cpu")
    ap.add_argument("--doorbell", help="the binary step path's control block, ring and done eventfds: block,ring,done")
    args = ap.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    doorbell = bell.Doorbell.from_arg(args.doorbell) if args.doorbell else None
    rt = Runtime.detect(args.device)
    # rt.notes travel in the hello, which the supervisor logs at info with
    # the handshake: printed here they were warnings on every start.
    server = Server(sock, Worker(rt), doorbell)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, server.terminate)
    server.hello()
    return server.serve()
