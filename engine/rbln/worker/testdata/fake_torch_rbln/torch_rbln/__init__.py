"""TEST DOUBLE of torch_rbln. Never imported by production code: tests put
this directory on PYTHONPATH so that the worker's ordinary `import
torch_rbln` finds it, and script what torch.rbln.explain() reports.

The scenario is a JSON file named by $STEPSERVE_FAKE_RBLN_SCENARIO, re-read
at every explain region so that a test can change it between requests:

    {"verdict": {...}, "dump": {...}, "report": "...",
     "raise_on_enter": false, "memory": {"npu.0.chiplet.0.allocated.current": 1024},
     "available": false, "device_count": 0, "physical_device_count": 0,
     "device_summary": "..."}

Without the variable, every region is clean with one transfer each way.

Where $STEPSERVE_FAKE_RBLN_REGIONS names a file, every region entered
appends a line to it, so that a test can count the steps the worker ran.

is_available() is False unless the scenario says "available": true; this
torch has no rbln device type, so a worker told it is available still cannot
place tensors on rbln:0 (which is how tests reach that refusal).
device_count() and physical_device_count() default, when available, to
what the runtime's grouping variables make of RBLN_VISIBLE_DEVICES (one
logical device of two NPUs for RBLN_VISIBLE_DEVICES=0,1 and
RBLN_NPUS_PER_DEVICE=2), else 0; device_summary() prints the groups, as
torch-rbln's does.

Compiled programs (emulated_rbln.py installs PROGRAMS.compile as
torch.compile) write an artifact, program<n>.rbln, into their cache_dir
when first run; the rebel double beside this package loads one and its
inspect() reports the scenario's "host_op_reason" (for example
{"aten::sort": "unsupported dtype"}), read when the program was built.
With "refuse_bitcast": true a program fails where its graph calls
Tensor.view(dtype), as a frontend that does not lower a bitcast would;
with "fail_tp": true one compiled with num_devices above 1 fails with a
RuntimeError, as a model without tensor-parallel support does.

With "track_memory": true, memory_stats_per_chiplet() reports an emulated
caching allocator instead of the scenario's "memory": tensors handed to
place() (engine/rbln/testdata/emulated_rbln.py hands it what the worker put
on its emulated device) are allocated while they live; what they free stays
reserved, as the real allocator keeps it cached, until empty_cache(). The
scenario's "memory_baseline" is what the runtime itself holds, in both.
"""

from __future__ import annotations

import json
import os
import types
import weakref
from typing import Any, Iterable

import torch
from torch.overrides import TorchFunctionMode

SCENARIO_ENV = "STEPSERVE_FAKE_RBLN_SCENARIO"
#: Where "1" at import, install_privateuse1() runs (for workers a test starts).
PRIVATEUSE1_ENV = "STEPSERVE_FAKE_RBLN_PRIVATEUSE1"


def install_privateuse1() -> bool:
    """Stand in for a torch whose profiler has a PrivateUse1 activity (the
    device, as torch_rbln's Kineto bridge records it): torch 1.13 has none,
    so ProfilerActivity.PrivateUse1 is made an alias of CPU. The worker's
    probe (stepserve_worker/profile.py: device_activity) then finds it and
    asks for it, which is the path under test; no device events come of it,
    since this double has no device. Returns whether it was installed (False
    on a torch that has the activity already)."""
    acts = torch.profiler.ProfilerActivity
    if hasattr(acts, "PrivateUse1"):
        return False
    acts.PrivateUse1 = acts.CPU
    return True


def uninstall_privateuse1() -> None:
    """Undo install_privateuse1."""
    acts = torch.profiler.ProfilerActivity
    if getattr(acts, "PrivateUse1", None) is acts.CPU:
        del acts.PrivateUse1

REGIONS_ENV = "STEPSERVE_FAKE_RBLN_REGIONS"

CLEAN: dict[str, Any] = {
    "verdict": {"clean": True, "reasons": [], "hidden_host_bounces": 0, "hidden_host_bounce_bytes": 0,
                "cpu_fallbacks": 0, "recompiles": 0, "runtime_hidden_d2h": 0, "notes": []},
    "dump": {"hidden_host_bounce": {"by_site": {}, "total_count": 0, "total_bytes": 0},
             "dispatch": {"total": 3, "cpu_fallback": 0, "cpu_fallback_ns": 0, "warm_hit": 3, "recompile_miss": 0},
             "wall_ns": 50000, "cpu_fallback_by_op": {}, "recompile_by_op": {}, "cpu_fallback_reasons": {},
             "runtime_residency": {"available": True, "total_count": 0, "by_reason": {}},
             "runtime": {"total_ns": 40000, "by_primitive": {"h2v": {"ns": 1000, "calls": 1},
                                                             "v2h": {"ns": 2000, "calls": 1}}}},
    "report": "[clean]  RBLN EXPLAIN (fake)",
}


def scenario() -> dict[str, Any]:
    path = os.environ.get(SCENARIO_ENV)
    if not path:
        return CLEAN
    with open(path) as f:
        return json.load(f)


class FakeExplain:
    """Scripted stand-in for torch.rbln.RBLNExplain."""

    def __init__(self, with_stack: bool = False) -> None:
        self._s = scenario()
        self._with_stack = with_stack

    def __enter__(self) -> "FakeExplain":
        if path := os.environ.get(REGIONS_ENV):
            with open(path, "a") as f:
                f.write("region with_stack\n" if self._with_stack else "region\n")
        if self._s.get("raise_on_enter"):
            raise RuntimeError("explain regions must not overlap (fake)")
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False

    def verdict(self) -> Any:
        return self._s.get("verdict")

    def dump(self) -> Any:
        return self._s.get("dump")

    def report(self) -> str:
        text = self._s.get("report", "")
        return text + "\n  at model.py:12 (fake stack)" if self._with_stack else text


class Allocator:
    """An emulated device allocator, for tests that check what loading and
    unloading a model does to device memory."""

    def __init__(self) -> None:
        self.allocated = 0
        self.reserved = 0

    def place(self, tensors: Iterable[Any]) -> None:
        """Count tensors as allocated on the device until they are freed."""
        for t in tensors:
            n = t.element_size() * t.nelement()
            self.allocated += n
            weakref.finalize(t, self._free, n)
        self.reserved = max(self.reserved, self.allocated)

    def _free(self, n: int) -> None:
        self.allocated -= n  # the memory stays reserved

    def empty_cache(self) -> None:
        self.reserved = self.allocated

    def stats(self, baseline: int) -> dict[str, int]:
        return {"npu.0.chiplet.0.allocated.current": baseline + self.allocated,
                "npu.0.chiplet.0.reserved.current": baseline + self.reserved}


ALLOCATOR = Allocator()


class RefuseBitcast(TorchFunctionMode):
    """Tensor.view(dtype), a bitcast, refused as a frontend that does not
    lower it would."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.view and (any(isinstance(a, torch.dtype) for a in args[1:]) or "dtype" in kwargs):
            raise RuntimeError("rbln (test double): aten::view.dtype, a bitcast, is not lowered by this frontend")
        return func(*args, **kwargs)


class Programs:
    """Emulated compiled programs, for the unload test: compile() (which
    engine/rbln/testdata/emulated_rbln.py installs as torch.compile) returns
    the body it is given, and keeps a program of the scenario's
    "program_bytes" (default 4096) allocated on the emulated device in a
    cache, as dynamo's cache holds RBLN programs whatever references the
    caller drops; only reset() (installed as torch._dynamo.reset) frees them,
    into the allocator's cache, as the real one drains and releases."""

    def __init__(self) -> None:
        self.cache: list[int] = []

    def compile(self, fn: Any, options: Any = None, **_: Any) -> Any:
        n = int(scenario().get("program_bytes", 4096))
        self.cache.append(n)
        ALLOCATOR.allocated += n
        ALLOCATOR.reserved = max(ALLOCATOR.reserved, ALLOCATOR.allocated)
        cache_dir = (options or {}).get("cache_dir")
        devices = int((options or {}).get("num_devices", 1))
        built: list[bool] = []
        number = len(self.cache)

        def program(*args: Any, **kwargs: Any) -> Any:
            # torch.compile is lazy: the artifact is written where
            # cache_dir says when the graph is first built, and holds what
            # the double's rebel.RBLNCompiledModel.inspect() reports: the
            # scenario's "host_op_reason" (absent: none).
            if cache_dir and not built:
                built.append(True)
                os.makedirs(cache_dir, exist_ok=True)
                report = {k: v for k, v in {"host_op_reason": scenario().get("host_op_reason")}.items() if v is not None}
                with open(os.path.join(cache_dir, f"program{number}.rbln"), "w") as f:
                    json.dump(report, f)
            # "fail_tp": a model that does not support tensor parallelism
            # fails when its program spans more than one NPU.
            if devices > 1 and scenario().get("fail_tp"):
                raise RuntimeError(f"rbln (test double): this model does not support tensor parallelism (tp={devices})")
            # "refuse_bitcast": a frontend that does not lower
            # Tensor.view(dtype) fails the program where its graph
            # reinterprets bytes.
            if not scenario().get("refuse_bitcast"):
                return fn(*args, **kwargs)
            with RefuseBitcast():
                return fn(*args, **kwargs)

        return program

    def reset(self) -> None:
        ALLOCATOR.allocated -= sum(self.cache)
        self.cache.clear()


PROGRAMS = Programs()


def _memory_stats_per_chiplet() -> dict[str, int]:
    s = scenario()
    if s.get("track_memory"):
        return ALLOCATOR.stats(int(s.get("memory_baseline", 0)))
    return s.get("memory", {})


def _is_available() -> bool:
    return bool(scenario().get("available", False))


def _groups() -> list[list[int]] | None:
    """The logical devices the runtime's variables make of the visible
    NPUs, as the device does (Environment Variables › Device mapping):
    RBLN_VISIBLE_DEVICES (or the older RBLN_DEVICES) is the pool, indexed
    from 0; RBLN_DEVICE_MAP ("[0,1],[2,3]") names groups and wins over
    RBLN_NPUS_PER_DEVICE (groups of n in order, the rest unused). None
    when no visible list is set: the scenario's counts then hold."""
    visible = os.environ.get("RBLN_VISIBLE_DEVICES") or os.environ.get("RBLN_DEVICES")
    if not visible:
        return None
    pool = [p for p in visible.split(",") if p.strip()]
    dmap = os.environ.get("RBLN_DEVICE_MAP", "").strip()
    if dmap:
        return [[int(x) for x in g.strip(" ,[]").split(",")] for g in dmap.split("]") if g.strip(" ,[")]
    n = int(os.environ.get("RBLN_NPUS_PER_DEVICE", "1") or 1)
    return [list(range(i, i + n)) for i in range(0, len(pool) - n + 1, n)]


def _device_count() -> int:
    s = scenario()
    if "device_count" in s or not _is_available():
        return int(s.get("device_count", 1 if _is_available() else 0))
    g = _groups()
    return 1 if g is None else len(g)


def _physical_device_count() -> int:
    s = scenario()
    if "physical_device_count" in s or "device_count" in s or not _is_available():
        return int(s.get("physical_device_count", _device_count()))
    visible = os.environ.get("RBLN_VISIBLE_DEVICES") or os.environ.get("RBLN_DEVICES")
    return len([p for p in visible.split(",") if p.strip()]) if visible else 1


def _device_summary() -> None:
    g = _groups()
    default = f"[RBLN] Device Topology Initialized (fake): {_device_count()} logical device(s)"
    if g is not None and _is_available():
        default += "".join(f"\n| rbln:{i} | {npus} |" for i, npus in enumerate(g))
    print(scenario().get("device_summary", default))


rbln = types.SimpleNamespace(
    explain=FakeExplain,
    is_available=_is_available,
    device_count=_device_count,
    physical_device_count=_physical_device_count,
    device_summary=_device_summary,
    bind_device_memory=lambda t: t,
    memory_stats_per_chiplet=_memory_stats_per_chiplet,
    empty_cache=ALLOCATOR.empty_cache,
    place=ALLOCATOR.place,  # the test double's own, not torch-rbln's
)
torch.rbln = rbln  # type: ignore[attr-defined]


if os.environ.get(PRIVATEUSE1_ENV) == "1":
    install_privateuse1()
