"""The step audit: a captured step graph checked against the documented
step structure (the torch-rbln documentation's "Recommended step
structure", reference 000) before it reaches the backend that compiles
it, so that what a device compiler would meet is known by rule, operator
and source line without a device.

The graph the backend is handed (Dynamo's, torch-level) is traced again
to its aten operators with fake tensors (make_fx under a FakeTensorMode of
its own): no data is read and no device time is spent, so the audit runs
wherever torch is 2.x, whatever the engine.

The rules, each a finding's "rule", and the item of the step structure
it comes from:

- created_in_step (item 1, "Do not create tensors inside the step"): a
  factory operator (arange, zeros, full, a tensor constant, ...) whose
  value depends on no input.
- float64 (item 3, "use one dtype"): any float64 tensor.
- int64 (item 3): a 64-bit integer tensor, named with the op that makes
  it; except the indices an operator returns as int64 whatever its inputs
  (argmax, sort, topk, ...): those are listed apart, as "widened", so that
  the audit says where a step holds 64-bit integers it could not avoid.
- mixed_float (item 3): more than one floating dtype in the graph.
- input_layout (item 3, "make the last dimension a multiple of 64, and
  pass offset-zero contiguous inputs"): a step input that is not.
- host_read (item 4, "No host reads inside the step"): a graph break on a
  host read, or an operator whose output shape depends on data.
- outputs (item 5, "pack them into one tensor inside the graph and
  download once"): more than one output.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import torch

#: The step structure's item each rule comes from.
RULES = {
    "created_in_step": 1,
    "float64": 3,
    "int64": 3,
    "mixed_float": 3,
    "input_layout": 3,
    "host_read": 4,
    "outputs": 5,
}

#: The device's alignment of a boundary tensor's last dimension.
ALIGN = 64

#: At most this many findings are listed per program (the counts by rule
#: stay whole).
MAX_FINDINGS = 64

# Factory operators: a tensor made from nothing but its arguments' shapes
# and scalars. The *_like and new_* forms read only an input's metadata,
# never its data, so they create a tensor in the step as much as zeros()
# does.
_FACTORIES = frozenset({
    "arange", "zeros", "ones", "full", "empty", "empty_strided", "scalar_tensor", "tensor", "linspace",
    "logspace", "eye", "rand", "randn", "randint", "randperm", "normal", "bernoulli", "lift_fresh_copy",
    "zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like", "randint_like",
    "new_zeros", "new_ones", "new_full", "new_empty", "new_empty_strided", "tril_indices", "triu_indices",
})

# Operators whose output shape depends on the data (a host read to size
# the result), or that read a value to the host.
_DATA_DEPENDENT = frozenset({
    "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim",
    "_local_scalar_dense", "item", "argwhere", "bincount", "histc",
})

# Operators whose index results are int64 by their definition: a step
# that narrows them at once holds no 64-bit arithmetic of its own. argmax
# and argmin return only indices; the others return (values, indices),
# and only the indices, their second result, are exempt.
_INT64_INDEX_OPS = frozenset({"argmax", "argmin"})
_INT64_INDEX_PAIRS = frozenset({"sort", "topk", "max", "min", "kthvalue", "mode", "median", "nanmedian", "cummax", "cummin"})

#: The rule name of an allowed 64-bit index (not a finding).
WIDENED = "widened"

_FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass
class Finding:
    rule: str
    op: str
    line: str  # "file.py:123", or "" where the graph does not say
    code: str = ""  # the source line's text
    dtype: str = ""
    detail: str = ""
    count: int = 1

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {"rule": self.rule, "item": RULES.get(self.rule, 3), "op": self.op, "line": self.line,
                             "count": self.count}
        for k in ("code", "dtype", "detail"):
            if v := getattr(self, k):
                d[k] = v
        return d


class Audit:
    """The findings of every graph one program captured, merged by rule,
    operator and line."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str, str, str], Finding] = {}
        # The int64 indices operators return (rule WIDENED), by operator and line.
        self._widened: dict[tuple[str, str, str, str], Finding] = {}
        self.graphs = 0
        # Why a graph could not be audited (the trace failed); "" if every
        # one was.
        self.error = ""

    def add(self, findings: Iterable[Finding]) -> None:
        for f in findings:
            key = (f.rule, f.op, f.line, f.dtype)
            into = self._widened if f.rule == WIDENED else self._by_key
            if (have := into.get(key)) is not None:
                have.count += f.count
            else:
                into[key] = f

    # The device thread adds findings while /explain's reader (the main
    # thread) reads them: every read takes a snapshot, list() of the
    # values, which the interpreter makes whole.

    def by_rule(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in list(self._by_key.values()):
            out[f.rule] = out.get(f.rule, 0) + 1
        return out

    def findings(self) -> list[Finding]:
        return sorted(list(self._by_key.values()), key=lambda f: (RULES[f.rule], f.rule, f.line, f.op))

    def to_wire(self) -> dict[str, Any]:
        found = self.findings()
        d: dict[str, Any] = {"graphs": self.graphs, "total": len(found), "by_rule": self.by_rule(),
                             "findings": [f.to_wire() for f in found[:MAX_FINDINGS]]}
        if len(found) > MAX_FINDINGS:
            d["truncated"] = len(found) - MAX_FINDINGS
        widened = sorted(list(self._widened.values()), key=lambda f: (f.line, f.op))
        if widened:
            d["widened"] = [f.to_wire() for f in widened[:MAX_FINDINGS]]
        if self.error:
            d["error"] = self.error
        return d


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]*\n([^\n]*)')


def source_line(stack_trace: Optional[str]) -> tuple[str, str]:
    """("file.py:line", the line's text) of the innermost user frame of a
    node's stack trace; ("", "") where there is none."""
    if not stack_trace:
        return "", ""
    frames = _FRAME.findall(stack_trace)
    if not frames:
        return "", ""
    path, line, code = frames[-1]
    return f"{_short(path)}:{line}", code.strip()


def _short(path: str) -> str:
    """A source path as findings name it: from the worker's package (or
    the model's folder) down, not the machine's layout."""
    parts = path.replace(os.sep, "/").split("/")
    if "stepserve_worker" in parts:
        return "/".join(parts[parts.index("stepserve_worker"):])
    return "/".join(parts[-2:]) if len(parts) > 1 else path


def _op_name(target: Any) -> str:
    """aten.arange.start -> "arange" (the overload dropped)."""
    name = getattr(target, "__name__", None) or str(target)
    packet = getattr(target, "_overloadpacket", None)
    if packet is not None:
        name = getattr(packet, "__name__", name)
    return name.split(".")[0]


def _dtype(v: Any) -> Optional[torch.dtype]:
    return v.dtype if isinstance(v, torch.Tensor) else None


def _name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def _step_inputs(gm: torch.fx.GraphModule) -> list[int]:
    """The positions of the graph's placeholders that are the step's own
    arguments (the bound input buffer), not weights or buffers Dynamo
    lifted into inputs."""
    out = []
    for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        grapharg = n.meta.get("grapharg")
        source = getattr(grapharg, "source", None)
        if source is None or type(source).__name__ == "LocalSource":
            out.append(i)
    return out


def check(gm: torch.fx.GraphModule, example_inputs: list[Any], whole: bool = True) -> tuple[list[Finding], str]:
    """The findings of one captured graph (with its allowed int64 indices,
    rule WIDENED: real() drops them), and why its aten trace failed
    ("" if it did not: its findings are then complete). A graph that is
    not the whole step (one piece of a step with graph breaks) hands its
    values on to the host code after it, so its outputs are not judged:
    the break is the finding."""
    findings: list[Finding] = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i in _step_inputs(gm):
        t = example_inputs[i] if i < len(example_inputs) else None
        if not isinstance(t, torch.Tensor):
            continue
        line, code = source_line(placeholders[i].meta.get("stack_trace"))
        what = f"input {placeholders[i].name} {_name(t.dtype)}{list(t.shape)}"
        if t.dim() and t.shape[-1] % ALIGN:
            findings.append(Finding("input_layout", "input", line, code, _name(t.dtype),
                                    f"{what}: last dimension {t.shape[-1]} is not a multiple of {ALIGN}"))
        if not t.is_contiguous() or t.storage_offset():
            findings.append(Finding("input_layout", "input", line, code, _name(t.dtype),
                                    f"{what}: not offset-zero contiguous (offset {t.storage_offset()}, strides {list(t.stride())})"))
    outputs = _outputs(gm) if whole else 0
    if outputs > 1:
        findings.append(Finding("outputs", "output", "", "", "", f"{outputs} outputs, want one packed tensor"))

    try:
        aten = _aten(gm, example_inputs)
    except Exception as e:  # noqa: BLE001 - a graph fake tensors cannot trace is reported, not fatal
        op = _data_dependent_op(e)
        if op:
            findings.append(Finding("host_read", op, "", "", "", f"output shape depends on data: {type(e).__name__}"))
            return findings, ""
        return findings, f"tracing to aten operators failed: {type(e).__name__}: {str(e)[:300]}"

    floats: dict[torch.dtype, tuple[str, str, str]] = {}
    for n in aten.graph.nodes:
        v = n.meta.get("val")
        vals = v if isinstance(v, (list, tuple)) else [v]
        line, code = source_line(n.meta.get("stack_trace"))
        if n.op == "placeholder":
            for t in vals:
                if (dt := _dtype(t)) in _FLOATING:
                    floats.setdefault(dt, ("input", "", ""))
            continue
        if n.op == "get_attr":
            if str(n.target).startswith("_tensor_constant"):
                findings.append(Finding("created_in_step", "tensor", line, code, _name(_dtype(vals[0]) or torch.float32),
                                        "a tensor constant made in the step"))
            continue
        if n.op != "call_function" or not n.users:
            # Only what the step uses: a result nothing reads is dead code
            # every compiler drops (max_pool2d's unused indices).
            continue
        op = _op_name(n.target)
        producer, indices = op, op in _INT64_INDEX_OPS
        if op == "getitem" and n.args and isinstance(n.args[0], torch.fx.Node):
            producer = _op_name(n.args[0].target)  # one result of a node of several
            indices = producer in _INT64_INDEX_PAIRS and len(n.args) > 1 and n.args[1] == 1
        if isinstance(v, (list, tuple)):
            # A node of several results: each is judged where it is read
            # (its getitem), the unused ones not at all.
            vals = []
        if op in _FACTORIES:
            findings.append(Finding("created_in_step", op, line, code, _name((_dtype(vals[0]) if vals else None) or torch.float32),
                                    "a tensor created inside the step"))
        if op in _DATA_DEPENDENT:
            findings.append(Finding("host_read", op, line, code, "", "reads a value or sizes its output from data"))
        for t in vals:
            dt = _dtype(t)
            if dt is None:
                continue
            if dt == torch.float64:
                findings.append(Finding("float64", op, line, code, "float64", "a float64 tensor"))
            elif dt == torch.int64 and indices:
                findings.append(Finding(WIDENED, producer, line, code, "int64",
                                        f"{producer}'s indices are int64 by the operator's definition"))
            elif dt == torch.int64:
                findings.append(Finding("int64", producer, line, code, "int64", "a 64-bit integer tensor"))
            if dt in _FLOATING:
                floats.setdefault(dt, (op, line, code))
    if len(floats) > 1:
        names = ", ".join(_name(d) for d in floats)
        for dt, (op, line, code) in list(floats.items())[1:]:
            findings.append(Finding("mixed_float", op, line, code, _name(dt),
                                    f"floating dtypes {names} in one step; {_name(dt)} first made here"))
    return findings, ""


def real(findings: Iterable[Finding]) -> list[Finding]:
    """findings less the allowed int64 indices."""
    return [f for f in findings if f.rule != WIDENED]


def _outputs(gm: torch.fx.GraphModule) -> int:
    out = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if out is None:
        return 0
    count = 0

    def walk(a: Any) -> None:
        nonlocal count
        if isinstance(a, (list, tuple)):
            for x in a:
                walk(x)
        elif isinstance(a, dict):
            for x in a.values():
                walk(x)
        elif isinstance(a, torch.fx.Node):
            count += 1
    walk(out.args)
    return count


def _aten(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> torch.fx.GraphModule:
    """gm traced to aten operators on fake tensors, with each node's
    source stack kept."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx import traceback as fx_traceback
    from torch.fx.experimental.proxy_tensor import make_fx

    mode = FakeTensorMode()
    fakes = [mode.from_tensor(t, static_shapes=True) if isinstance(t, torch.Tensor) else t for t in example_inputs]
    with mode, fx_traceback.preserve_node_meta():
        return make_fx(lambda *a: torch.fx.Interpreter(gm).run(*a), tracing_mode="real", pre_dispatch=False)(*fakes)


def _data_dependent_op(e: BaseException) -> str:
    """The operator a fake trace could not size (its output shape depends
    on data), or ""."""
    kind = type(e).__name__
    if kind not in ("DynamicOutputShapeException", "DataDependentOutputException", "GuardOnDataDependentSymNode"):
        return ""
    func = getattr(e, "func", None)
    return _op_name(func) if func is not None else kind
