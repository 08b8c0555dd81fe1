"""Reads torch.rbln.explain() results into the normalized Explain report the
Go side expects. torch-rbln's keys differ between releases, so every field is
read defensively: one that cannot be read is None (unknown), never 0."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Optional


@dataclass
class Report:
    """The normalized report of one step (the fields of engine.Explain)."""

    measured: bool = False
    clean: bool = False
    reasons: list[str] = field(default_factory=list)
    cpu_fallbacks: Optional[int] = None
    recompiles: Optional[int] = None
    host_bounces: Optional[int] = None
    host_bounce_bytes: Optional[int] = None
    h2d: Optional[int] = None
    d2h: Optional[int] = None
    wall_ns: Optional[int] = None
    h2d_ns: Optional[int] = None
    d2h_ns: Optional[int] = None
    v2v: Optional[int] = None
    v2v_slow: Optional[int] = None
    cpu_fallback_by_op: Optional[dict[str, int]] = None
    recompile_by_op: Optional[dict[str, int]] = None
    host_bounce_by_site: Optional[dict[str, int]] = None
    cpu_fallback_reasons: Optional[dict[str, int]] = None
    notes: list[str] = field(default_factory=list)
    report: str = ""
    # The dispatcher's and runtime's detail (doorbell.DISPATCH keys); None
    # when the dump has none of it.
    dispatch: Optional[dict[str, Optional[int]]] = None

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "Report":
        return cls(**d)


def unmeasured(reason: str) -> Report:
    """A step nobody observed."""
    return Report(measured=False, reasons=[reason])


def _int(v: Any) -> Optional[int]:
    t = type(v)
    if t is int:
        return v
    if t is bool or not isinstance(v, (int, float)):
        return None
    return int(v)


def _get(d: Any, *path: str) -> Any:
    for key in path:
        if type(d) is not dict:
            if not isinstance(d, dict):
                return None
        d = d.get(key)
        if d is None:
            return None
    return d


def _counts(d: Any) -> Optional[dict[str, int]]:
    """A per-op or per-site map: values may be counts or {count: n} dicts."""
    if not isinstance(d, dict):
        return None
    out: dict[str, int] = {}
    for k, v in d.items():
        n = _int(v)
        if n is None:
            n = _int(_get(v, "count")) if isinstance(v, dict) else None
        if n is None:
            n = _int(_get(v, "total_count")) if isinstance(v, dict) else None
        if n is not None:
            out[str(k)] = n
    return out


def _primitive(by_primitive: Any, name: str, what: str) -> Optional[int]:
    """A runtime primitive's `what` (calls or ns), its _multi form added.
    Unknown when the table names neither: a release may leave a primitive
    out of its table, and then nobody counted it."""
    if not isinstance(by_primitive, dict):
        return None
    entry = by_primitive.get(name)
    multi = by_primitive.get(name + "_multi")
    if multi is None:
        if entry is None:
            return None
        if type(entry) is dict:  # the usual shape, read directly
            return _int(entry.get(what))
    entries = [e for e in (entry, multi) if e is not None]
    total = 0
    for entry in entries:
        n = _int(_get(entry, what)) if isinstance(entry, dict) else (_int(entry) if what == "calls" else None)
        if n is None:
            return None
        total += n
    return total


def _v2v_slow(verdict: Any, dump: Any) -> Optional[int]:
    """Device-to-device copies that fell to a host path: the runtime's
    residency count where the runtime exposes it, else the verdict's."""
    residency = _get(dump, "runtime_residency")
    if isinstance(residency, dict):
        if residency.get("available") is not True:
            return None
        return _int(residency.get("total_count"))
    return _int(_get(verdict, "runtime_hidden_d2h"))


def _notes(v: Any) -> list[str]:
    """Notes as text: a string, or a {signal, fix} remedy."""
    if not isinstance(v, list):
        return []
    out: list[str] = []
    for n in v:
        if isinstance(n, dict) and "fix" in n:
            out.append(f"{n.get('signal', '?')}: {n['fix']}")
        elif isinstance(n, str):
            out.append(n)
    return out


def counters(verdict: Any, dump: Any) -> tuple[Optional[int], ...]:
    """The report's counters, in doorbell.COUNTERS order (cpu_fallbacks,
    recompiles, host_bounces, host_bounce_bytes, h2d, d2h, wall_ns, h2d_ns,
    d2h_ns, v2v, v2v_slow), then the dispatch detail in doorbell.DISPATCH
    order (total, warm_hits, cpu_fallback_ns, runtime_ns, v2v_ns): what
    normalize reads, and all the binary step path sends for a clean step."""
    dispatch = _get(dump, "dispatch")
    bounce = _get(dump, "hidden_host_bounce")
    cpu_fallbacks = _int(_get(dispatch, "cpu_fallback"))
    if cpu_fallbacks is None:
        cpu_fallbacks = _int(_get(verdict, "cpu_fallbacks"))
    recompiles = _int(_get(dispatch, "recompile_miss"))
    if recompiles is None:
        recompiles = _int(_get(verdict, "recompiles"))
    host_bounces = _int(_get(bounce, "total_count"))
    if host_bounces is None:
        host_bounces = _int(_get(verdict, "hidden_host_bounces"))
    host_bounce_bytes = _int(_get(bounce, "total_bytes"))
    if host_bounce_bytes is None:
        host_bounce_bytes = _int(_get(verdict, "hidden_host_bounce_bytes"))
    runtime = _get(dump, "runtime")
    if runtime is None:
        runtime = _get(dump, "rebel_runtime")  # older releases
    by_primitive = _get(runtime, "by_primitive")
    return (cpu_fallbacks, recompiles, host_bounces, host_bounce_bytes,
            _primitive(by_primitive, "h2v", "calls"), _primitive(by_primitive, "v2h", "calls"),
            _int(_get(dump, "wall_ns")),
            _primitive(by_primitive, "h2v", "ns"), _primitive(by_primitive, "v2h", "ns"),
            _primitive(by_primitive, "v2v", "calls"), _v2v_slow(verdict, dump),
            # The dispatch detail (doorbell.DISPATCH order).
            _int(_get(dispatch, "total")), _int(_get(dispatch, "warm_hit")), _int(_get(dispatch, "cpu_fallback_ns")),
            _int(_get(runtime, "total_ns")), _primitive(by_primitive, "v2v", "ns"))


DISPATCH_KEYS = ("total", "warm_hits", "cpu_fallback_ns", "runtime_ns", "v2v_ns")


def dispatch_detail(values: tuple[Optional[int], ...]) -> Optional[dict[str, Optional[int]]]:
    """The dispatch detail as Report.dispatch: None when nothing of it is
    known."""
    if all(v is None for v in values):
        return None
    return dict(zip(DISPATCH_KEYS, values))


def normalize(verdict: Any, dump: Any, report_text: Optional[str]) -> Report:
    """Map verdict() and dump() (any release's keys) into a Report."""
    r = Report(measured=True)
    clean = _get(verdict, "clean")
    r.clean = clean if isinstance(clean, bool) else False
    reasons = _get(verdict, "reasons")
    if isinstance(reasons, list):
        r.reasons = [str(x) for x in reasons]
    if not isinstance(clean, bool):
        r.reasons.append("verdict has no boolean 'clean'")
    c = counters(verdict, dump)
    (r.cpu_fallbacks, r.recompiles, r.host_bounces, r.host_bounce_bytes, r.h2d, r.d2h, r.wall_ns,
     r.h2d_ns, r.d2h_ns, r.v2v, r.v2v_slow) = c[:11]
    r.dispatch = dispatch_detail(c[11:])
    r.cpu_fallback_by_op = _counts(_get(dump, "cpu_fallback_by_op"))
    r.recompile_by_op = _counts(_get(dump, "recompile_by_op"))
    r.host_bounce_by_site = _counts(_get(dump, "hidden_host_bounce", "by_site"))
    r.cpu_fallback_reasons = _counts(_get(dump, "cpu_fallback_reasons"))
    r.notes = _notes(_get(verdict, "notes")) or _notes(_get(dump, "notes"))
    if not r.clean and report_text:
        r.report = report_text
    return r


def host_step(r: Report) -> Report:
    """A step the torch engine ran on the host CPU, as explain saw it: with
    the real torch_rbln importable its region opens there too, sees no
    device copy, and calls the step not clean for missing transfers. A host
    step has no transfers to count: where it made none, they are unknown
    (the supervisor then reports the step unmeasured for transfers, not
    failed), the reasons about them go, and the step is clean unless
    something else fired. A step that did copy (a scripted double) is left
    as it is."""
    if not r.measured or r.h2d != 0 or r.d2h != 0:
        return r
    r.h2d = r.d2h = r.h2d_ns = r.d2h_ns = r.v2v = r.v2v_slow = None
    r.reasons = [x for x in r.reasons if not _TRANSFER_REASON.search(x)]
    others = any((n or 0) > 0 for n in (r.cpu_fallbacks, r.recompiles, r.host_bounces))
    if not others and not r.reasons:
        r.clean = True
        r.report = ""
    r.notes = r.notes + ["host step (engine torch, the host CPU): no device transfers to count"]
    return r


_TRANSFER_REASON = re.compile(r"h2d|d2h|host[- _]to[- _]device|device[- _]to[- _]host|transfer|missing_", re.IGNORECASE)


_CHIPLET_KEY = re.compile(r"^npu\.(\d+)\.chiplet\.(\d+)\.(?:(allocated|reserved|active|cached)\.(current|peak)|(num_ooms|num_alloc_retries))$")


def chiplet_memory(stats: Any) -> list[dict[str, Any]]:
    """memory_stats_per_chiplet() as rows of npu, chiplet, kind, bytes, for
    the kinds allocated, reserved, active and cached (current, and _peak),
    and the allocator's event counts num_ooms and num_alloc_retries (in
    "bytes", as counts)."""
    rows: list[dict[str, Any]] = []
    if not isinstance(stats, dict):
        return rows
    for key, value in stats.items():
        m = _CHIPLET_KEY.match(str(key))
        n = _int(value)
        if m is None or n is None:
            continue
        if m.group(5):
            kind = m.group(5)
        else:
            kind = m.group(3) if m.group(4) == "current" else m.group(3) + "_peak"
        rows.append({"npu": m.group(1), "chiplet": m.group(2), "kind": kind, "bytes": n})
    return sorted(rows, key=lambda r: (r["npu"], r["chiplet"], r["kind"]))
