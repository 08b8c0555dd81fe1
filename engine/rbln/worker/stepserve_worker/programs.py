"""Host operators inside compiled programs.

An operator the RBLN Compiler cannot lower is split out of the graph as a
host operator and runs inside the compiled artifact, on the host CPU, and
torch.rbln.explain() cannot see it: the step still reads [clean]. The RBLN
Compiler's Python API reports such operators under host_op_reason when a
compiled model is inspected (rebel.RBLNCompiledModel(path).inspect(); the
constructor loads a saved .rbln artifact). The worker compiles each bucket
with its own torch.compile cache_dir, the option that "chooses where
artifacts are written", so the artifacts found there after the bucket's
graph is built are that bucket's program, and inspecting them names its
host operators.

The shape of inspect()'s result is read defensively, as explain()'s is: a
mapping or an object with host_op_reason, at its top or one level down (per
graph), whose value is a mapping of operator to reason, a list of names or
of {op, reason} records, or one name. What cannot be read is unknown (None),
never zero.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

#: The key of inspect()'s result that names the host operators.
HOST_OP_REASON = "host_op_reason"

#: At most this many operators are named (the count is always whole).
MAX_NAMED = 32


def identity(msg: dict[str, Any]) -> str:
    """A directory name for the model a load message describes, the same
    across loads and restarts while the model is: its name, and a hash of
    what its programs are built from (version, architecture and its
    section, dtypes, each weights file's size and modification time, a
    torch module's source). A model changed in any of these compiles into
    a directory of its own, so that the artifacts inspected there are this
    model's."""
    h = hashlib.sha256()
    spec = {k: msg.get(k) for k in ("name", "version", "architecture", "device_dtype", "compute_dtype",
                                      "mlp", "encoder", "torch", "decoder", "skip_tensors")}
    h.update(json.dumps(spec, sort_keys=True, default=str).encode())
    # A new compiler builds into a directory of its own: the last one's
    # artifacts (and their host operators) are not this program's.
    h.update(toolchain().encode())
    for f in msg.get("weight_files") or [msg.get("weights") or ""]:
        try:
            st = os.stat(f)
            h.update(f"{f}:{st.st_size}:{st.st_mtime_ns}".encode())
        except OSError:
            h.update(f.encode())
    module = ((msg.get("torch") or {}).get("module")) or ""
    if module:
        try:
            h.update(Path(module).read_bytes())
        except OSError:
            h.update(module.encode())
    name = msg.get("name") or msg.get("model") or "model"
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:64]
    return f"{safe}-{h.hexdigest()[:12]}"


def toolchain() -> str:
    """The versions of what builds the programs: the RBLN Compiler
    (rebel), torch-rbln and torch, as this worker has them; "-" for one it
    has not imported. Nothing is imported here but the compiler's Python
    API, and only where torch-rbln already is (a host-CPU worker must not
    start a device runtime to name a directory it never compiles into)."""
    out = []
    for name in ("rebel", "torch_rbln", "torch"):
        mod = sys.modules.get(name)
        if mod is None and name == "rebel" and "torch_rbln" in sys.modules:
            try:
                mod = importlib.import_module(name)
            except Exception:  # noqa: BLE001 - absent or broken alike
                mod = None
        out.append(f"{name}={getattr(mod, '__version__', '?') if mod is not None else '-'}")
    return " ".join(out)


def bucket_dir(base: str, model: str, batch: int, seq: int, ctx: int = 0, mask: bool = False) -> str:
    """The cache_dir of one bucket (batch x seq, in a decoder's context
    partition ctx, masked or not) of the model whose identity() is model,
    under base."""
    return os.path.join(base, model, f"b{batch}x{seq}" + (f"xc{ctx}" if ctx else "") + ("m" if mask else ""))


def _field(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


#: How deep in inspect()'s result host_op_reason is looked for.
MAX_DEPTH = 4


def _find(info: Any, depth: int = 0) -> tuple[bool, Any]:
    """(found, value) of host_op_reason at the top of info, or merged from
    every table below it (per graph, per partition), down to MAX_DEPTH."""
    if isinstance(info, dict) and HOST_OP_REASON in info:
        return True, info[HOST_OP_REASON]
    if not isinstance(info, (dict, list, tuple, str, bytes)) and hasattr(info, HOST_OP_REASON):
        return True, getattr(info, HOST_OP_REASON)
    if depth >= MAX_DEPTH:
        return False, []
    values = info.values() if isinstance(info, dict) else (info if isinstance(info, (list, tuple)) else ())
    found, merged = False, []
    for v in values:
        f, value = _find(v, depth + 1)
        if f:
            found = True
            if value is not None and value != []:
                merged.append(value)
    return found, merged


def _table(info: Any) -> bool:
    """Whether info is something inspect() could have put host_op_reason
    in: a mapping, a list of per-graph tables, or an object with the
    attribute. Anything else (text, a number) was not read."""
    return isinstance(info, (dict, list, tuple)) or hasattr(info, HOST_OP_REASON)


def _ops(value: Any) -> Optional[dict[str, str]]:
    """host_op_reason's value as {operator: reason}; None when unreadable."""
    if value is None:
        return {}
    if isinstance(value, str):
        return {value: ""} if value else {}
    if isinstance(value, dict):
        return {str(k): v if isinstance(v, str) else str(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out: dict[str, str] = {}
        for item in value:
            if isinstance(item, (list, tuple, dict)) and not (isinstance(item, dict) and ("op" in item or "name" in item)):
                sub = _ops(item)
                if sub is None:
                    return None
                for k, v in sub.items():
                    out.setdefault(k, v)
            elif isinstance(item, dict):
                op = str(item.get("op") or item.get("name"))
                out.setdefault(op, str(item.get("reason", "")))
            elif isinstance(item, str):
                out.setdefault(item, "")
            else:
                return None
        return out
    return None


def inspect(directory: str, since_ns: Optional[int] = None) -> dict[str, Any]:
    """The host operators of the programs under directory:
    {"count": n or None, "ops": {operator: reason}, "reason": why unknown,
    "artifacts": how many were inspected}. With since_ns (when the graph
    was built), only artifacts written since are read where there are
    any: the directory outlives loads, and an earlier build's programs
    are not this one's. None written since is a cache hit: the program
    was built before, by the same model and compiler (identity), and
    every artifact there is read."""
    if not directory:
        return {"count": None, "reason": "no compile cache directory (rbln.compile_cache_dir), "
                "so the compiled programs cannot be found to inspect"}
    try:
        import rebel  # the RBLN Compiler's Python API
    except Exception as e:  # noqa: BLE001 - absent or broken alike
        return {"count": None, "reason": f"the RBLN Compiler's Python API (rebel) is not importable: {e}"}
    compiled = getattr(rebel, "RBLNCompiledModel", None)
    if compiled is None:
        return {"count": None, "reason": "rebel has no RBLNCompiledModel to inspect programs with"}
    paths = sorted(Path(directory).rglob("*.rbln")) if os.path.isdir(directory) else []
    if since_ns is not None:
        # A file's time is the kernel's coarse clock, a few ms behind
        # time.time_ns(): a second's slack.
        fresh = [p for p in paths if _mtime_ns(p) >= since_ns - 1_000_000_000]
        if fresh:
            paths = fresh
    if not paths:
        return {"count": None, "reason": f"no compiled artifact (*.rbln) under {directory} after the graph was built"}
    ops: dict[str, str] = {}
    for path in paths:
        try:
            info = compiled(str(path)).inspect()
        except Exception as e:  # noqa: BLE001 - a program that cannot be read is unknown
            return {"count": None, "reason": f"inspecting {path.name}: {type(e).__name__}: {e}"}
        if not _table(info):
            return {"count": None, "reason": f"{path.name}: inspect() returned {type(info).__name__}, not a table to read host_op_reason from"}
        found, value = _find(info)
        # inspect() read the program: no host_op_reason is no host operator.
        got = _ops(value) if found else {}
        if got is None:
            return {"count": None, "reason": f"{path.name}: unreadable host_op_reason: {value!r:.200}"}
        for op, why in got.items():
            ops.setdefault(op, why)
    named = dict(sorted(ops.items())[:MAX_NAMED])
    return {"count": len(ops), "ops": named, "artifacts": len(paths)}


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0
