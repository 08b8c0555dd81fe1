"""Compiled step graphs: which compiler builds a bucket's step, and what
building and running it showed.

The rbln engine compiles with backend "rbln" (the RBLN Compiler); the
torch engine, on the host CPU, with inductor where the worker's torch has
torch.compile and inductor works on the host (rbln.torch_compile: auto,
inductor or off). Either way the step body is torch.compile(body,
fullgraph=True, dynamic=False) behind a backend of this module's that
counts the graphs Dynamo captures, audits each against the step structure
(audit.py) and hands it on to the real backend.

A Program is one bucket's compiled step. It knows, from Dynamo itself:
- graphs: the graphs its backend was handed;
- graph breaks: a break is a fall back to the host between graphs. With
  fullgraph=True Dynamo refuses the step at its first run, naming the
  break; with rbln.strict_warmup the load is refused naming its line,
  otherwise the step is compiled again with breaks allowed and every run
  counts them as CPU fallbacks;
- recompiles: a graph captured after the first run is a recompile (a
  guard stopped holding), with Dynamo's reason (its guard failures);
- compile seconds (the first run, which builds the graph: torch.compile
  is lazy) and whether inductor's cache served it.
"""

from __future__ import annotations

import linecache
import logging
import re
import time
from typing import Any, Callable, Optional, Sequence

import torch

from . import audit as au

#: rbln.torch_compile's values.
MODES = ("auto", "inductor", "off")

#: What builds a bucket's step: the RBLN Compiler, inductor, or nothing
#: (the body runs eagerly).
RBLN, INDUCTOR, NONE = "rbln", "inductor", "none"


class CompileRefused(RuntimeError):
    """A bucket's step graph is refused (rbln.strict_warmup): a graph
    break, a compiler error, or audit findings on the rbln engine. The
    message names the bucket and what was found where."""


class Unavailable(RuntimeError):
    """rbln.torch_compile asks for a compiler this worker's torch cannot
    run."""


def has_dynamo() -> bool:
    """Whether torch.compile here is torch's own (2.x), whose graphs this
    module can count and audit."""
    dynamo = getattr(torch, "_dynamo", None)
    if dynamo is None:
        try:
            import torch._dynamo as dynamo  # noqa: PLC0415
        except Exception:  # noqa: BLE001 - torch 1.x has none
            return False
    return hasattr(torch, "compile") and hasattr(dynamo, "lookup_backend")


_inductor_problem: Optional[str] = None


def _probe(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sin() + x


def inductor_problem() -> str:
    """Why inductor cannot compile on this host ("" when it can): checked
    once per process by compiling and running a small function (inductor
    needs the ATen headers, setuptools and a C++ compiler)."""
    global _inductor_problem
    if _inductor_problem is not None:
        return _inductor_problem
    if not has_dynamo():
        _inductor_problem = f"torch {torch.__version__} has no torch.compile (torch 2.x has)"
        return _inductor_problem
    try:
        f = torch.compile(_probe, backend="inductor", fullgraph=True, dynamic=False)
        x = torch.arange(8, dtype=torch.float32)
        if not torch.allclose(f(x), _probe(x)):
            raise RuntimeError("the compiled probe computed another result than eager")
        _inductor_problem = ""
    except Exception as e:  # noqa: BLE001 - any failure means eager
        first = (str(e).strip().splitlines() or [""])[0]
        _inductor_problem = f"inductor cannot compile on this host ({type(e).__name__}: {first[:300]})"
    return _inductor_problem


def choose(kind: str, mode: str, compile_available: bool) -> tuple[str, str]:
    """(compiler, note) for a worker of device kind computing with
    rbln.torch_compile mode; the note says why a step runs eagerly."""
    if kind == "rbln":
        if compile_available:
            return RBLN, ""
        return NONE, "torch.compile unavailable: step bodies run eagerly"
    if mode not in MODES:
        raise ValueError(f"rbln.torch_compile {mode!r}; want one of {', '.join(MODES)}")
    if mode == "off":
        return NONE, "rbln.torch_compile is off: step bodies run eagerly"
    problem = inductor_problem()
    if not problem:
        return INDUCTOR, ""
    if mode == INDUCTOR:
        raise Unavailable(f"rbln.torch_compile is inductor, but {problem}")
    return NONE, f"rbln.torch_compile auto: step bodies run eagerly, {problem}"


# -- graph breaks, as Dynamo logs them -----------------------------------

#: Called when a graph is built inside a step that was not announced as
#: building one (a recompile on the doorbell path): the worker's server
#: sets it around such a step to tell the supervisor. None otherwise.
on_build: Optional[Callable[[], None]] = None

_BREAK = re.compile(r"Graph break (?:\(details suppressed\) )?in user code at (.+?):(\d+)\nReason: ([^\n]*)")
_capturing: Optional["Program"] = None


class _BreakLog(logging.Handler):
    """Takes Dynamo's graph-break log records for the program that is
    compiling (one at a time: the device thread compiles)."""

    def emit(self, record: logging.LogRecord) -> None:
        p = _capturing
        if p is None:
            return
        m = _BREAK.search(record.getMessage())
        if m:
            path, line = m.group(1), int(m.group(2))
            p._break(m.group(3), f"{au._short(path)}:{line}", linecache.getline(path, line).strip())


_break_log: Optional[_BreakLog] = None


def _listen_for_breaks() -> None:
    """Take Dynamo's graph-break log (torch 2.1 and later; on 2.0 only the
    break fullgraph refuses is named)."""
    global _break_log
    if _break_log is not None:
        return
    try:
        log = torch._logging.getArtifactLogger("torch._dynamo.symbolic_convert", "graph_breaks")
    except Exception:  # noqa: BLE001 - torch 2.0 has no torch._logging
        return
    _break_log = _BreakLog()
    log.addHandler(_break_log)
    log.setLevel(logging.DEBUG)
    log.propagate = False  # ours to read, not the worker's stderr


def _counter(group: str, name: str) -> int:
    try:
        from torch._dynamo.utils import counters  # noqa: PLC0415
        return int(counters[group][name])
    except Exception:  # noqa: BLE001
        return 0


def _recompile_limit() -> int:
    """Dynamo's limit on graphs per code object (cache_size_limit, renamed
    recompile_limit in later releases); 0 where it has none."""
    cfg = getattr(getattr(torch, "_dynamo", None), "config", None)
    for name in ("recompile_limit", "cache_size_limit"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return 0


def _recorded_guard_failures(code: Any) -> Sequence[Any]:
    """The guard failures Dynamo recorded for code, as it keeps them:
    counted every step (len), formatted only when a recompile is reported
    (_guard_failures)."""
    try:
        from torch._dynamo.utils import guard_failures  # noqa: PLC0415
    except Exception:  # noqa: BLE001
        return ()
    return guard_failures.get(code, ())


def _guard_failures(code: Any) -> list[str]:
    return [str(f).strip() for f in _recorded_guard_failures(code)]


class Program:
    """One bucket's compiled step, and what building and running it
    showed."""

    def __init__(self, bucket: str, kind: str, compiler: str, strict: bool, refuse_findings: bool) -> None:
        self.bucket, self.kind, self.compiler = bucket, kind, compiler
        self.strict = strict
        # The rbln engine with strict warm-up: a graph with findings never
        # reaches the device compiler.
        self.refuse_findings = refuse_findings
        # Whether Dynamo's own torch.compile runs it (not a double's): only
        # then are graphs, breaks and recompiles counted.
        self.counted = compiler != NONE and has_dynamo()
        self.graphs = 0
        self.breaks: list[dict[str, str]] = []
        self.recompiles = 0
        self.recompile_reasons: list[str] = []
        self.compile_seconds: Optional[float] = None
        self.cache_hit: Optional[bool] = None
        self.audit = au.Audit() if self.counted else None
        self.error = ""  # the compiler's error, where the step runs eagerly instead
        self.note = ""
        self.warm = False  # its first run built it
        self.fullgraph = True
        self.body: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
        self._options: dict[str, Any] = {}
        self._graph: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
        self._refused = ""
        # Why the step runs eagerly although compiled (Dynamo's recompile
        # limit), "" while it does not.
        self.eager_reason = ""
        # An RSD group with tensor-parallel failover: a compile error goes
        # to the worker, which compiles the bucket again for one NPU.
        self.raise_compile_errors = False
        # This step's signals (the last run's): graphs compiled again, and
        # falls back to the host at graph breaks.
        self.step_recompiles = 0
        self.step_fallbacks = 0

    # -- building -------------------------------------------------------

    def compile(self, body: Callable[[torch.Tensor], torch.Tensor], options: dict[str, Any]) -> Callable[[torch.Tensor], torch.Tensor]:
        """The callable that runs the bucket's step: body compiled lazily
        (its first run builds it)."""
        self.body, self._options = body, options
        self._graph = self._compiled()
        return self.run

    def _compiled(self) -> Callable[[torch.Tensor], torch.Tensor]:
        assert self.body is not None
        if self.compiler == NONE:
            return self.body
        opts = self._options or None
        if not self.counted:
            # A torch.compile that is not Dynamo's (a double's): as asked.
            return torch.compile(self.body, backend=self.compiler, dynamic=False, fullgraph=self.fullgraph, options=opts)
        return torch.compile(self.body, backend=self._backend(self.compiler), dynamic=False, fullgraph=self.fullgraph,
                             options=opts if self.compiler != INDUCTOR else None)

    def _backend(self, name: str) -> Callable[..., Any]:
        """Dynamo's backend name, behind the audit: looked up when a graph
        comes (torch_rbln registers "rbln" with the device runtime)."""
        def audited(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
            self.graphs += 1
            if on_build is not None:
                on_build()  # a graph built in a doorbell step: compiling may take long
            if self.audit is not None:
                try:
                    findings, why = au.check(gm, example_inputs, whole=self.fullgraph)
                except Exception as e:  # noqa: BLE001 - the audit never fails a compile
                    findings, why = [], f"the audit failed: {type(e).__name__}: {str(e)[:300]}"
                self.audit.graphs += 1
                self.audit.add(findings)
                if why and not self.audit.error:
                    self.audit.error = why
                if au.real(findings) and self.refuse_findings:
                    self._refused = self._findings_text(au.real(findings))
                    raise CompileRefused(self._refused)
            return torch._dynamo.lookup_backend(name)(gm, example_inputs, **kwargs)
        audited.__name__ = f"audited_{self.compiler}"
        return audited

    @staticmethod
    def _findings_text(findings: list[au.Finding]) -> str:
        named = list(dict.fromkeys(f"{f.rule} ({f.op}{' at ' + f.line if f.line else ''})" for f in findings))
        shown = named[:8]
        more = len(named) - len(shown)
        return ", ".join(shown) + (f" and {more} more" if more > 0 else "")

    def _break(self, reason: str, line: str, code: str) -> None:
        reason = reason.removeprefix("Unsupported: ")
        for b in self.breaks:
            if b["line"] == line and b["reason"] == reason:
                return
        if self.audit is not None:
            self.audit.add([au.Finding("host_read", reason, line, code, "", "a graph break: the step falls back to the host here")])
        self.breaks.append({"reason": reason, "line": line, "code": code})

    # -- running --------------------------------------------------------

    def run(self, x: torch.Tensor) -> torch.Tensor:
        global _capturing
        assert self._graph is not None
        if not self.warm:
            return self._first_run(x)
        if not self.counted:
            return self._graph(x)
        before, failures = self.graphs, len(_recorded_guard_failures(self._code()))
        if not self.fullgraph:
            # A step with breaks compiles its later pieces lazily: their
            # breaks are this program's too.
            _capturing = self
        try:
            out = self._graph(x)
        finally:
            _capturing = None
        self.step_recompiles = 0
        if self.graphs != before:
            self._recompiled(self.graphs - before, failures)
        fallbacks = len(self.breaks) if not self.fullgraph else 0
        if self.eager_reason:
            fallbacks += 1  # the whole step ran eagerly on the host
        self.step_fallbacks = fallbacks
        return out

    def _code(self) -> Any:
        return getattr(self.body, "__code__", None)

    def _recompiled(self, n: int, failures_before: int) -> None:
        """n graphs were captured after the first run. With a guard that
        failed in between, they are recompiles; without one, in a step
        with breaks, they are its later pieces compiled on first use."""
        failures = _guard_failures(self._code())
        new = failures[failures_before:]
        if not new and not self.fullgraph:
            return
        self.recompiles += n
        self.step_recompiles = n
        for f in new or ["no guard failure recorded"]:
            if f not in self.recompile_reasons:
                self.recompile_reasons.append(f)
        del self.recompile_reasons[:-16]  # the latest few
        limit = _recompile_limit()
        if limit and len(failures) >= limit and not self.eager_reason:
            # Dynamo stops compiling the code past its limit and runs it
            # eagerly from then on, saying nothing to the caller.
            self.eager_reason = (f"Dynamo's recompile limit ({limit}) is reached: the step runs eagerly on the host "
                                 f"from now on, every step a CPU fallback")
            self.note = self.eager_reason

    def _first_run(self, x: torch.Tensor) -> torch.Tensor:
        """The run that builds the program: a graph break is refused
        (strict) or compiled around; a compiler error is refused (strict)
        or served eagerly. A step that fails eagerly as well is the step's
        own error, raised as it is, never called a compiler's."""
        global _capturing
        if not self.counted:
            out = self._timed(x)
            self.warm = True
            return out
        _listen_for_breaks()
        hits, misses = _counter("inductor", "fxgraph_cache_hit"), _counter("inductor", "fxgraph_cache_miss")
        _capturing = self
        try:
            out = self._compile_run(x)
        except CompileRefused:
            raise
        except Exception as e:  # noqa: BLE001 - the compiler failed, or the step itself did
            if self._refused:
                raise CompileRefused(f"bucket {self.bucket}: the step audit found {self._refused}: the rbln engine "
                                     f"serves no step against the step structure (rbln.strict_warmup: false "
                                     f"compiles it anyway)") from None
            if not _compiler_error(e) or self.raise_compile_errors:
                raise
            out = self._eager_instead(x, e)
        finally:
            _capturing = None
        if self.compiler == INDUCTOR:
            dh = _counter("inductor", "fxgraph_cache_hit") - hits
            dm = _counter("inductor", "fxgraph_cache_miss") - misses
            self.cache_hit = True if dh and not dm else (False if dm else None)
        self.warm = True
        # Breaks fall back to the host on every run of a compiled step; a
        # step served eagerly instead has no graph to break.
        self.step_fallbacks = len(self.breaks) if self.counted and not self.fullgraph else 0
        return out

    def _compile_run(self, x: torch.Tensor) -> torch.Tensor:
        """The first run with fullgraph; where the step does not trace as
        one graph, refused (strict) or compiled again with breaks allowed."""
        try:
            return self._timed(x)
        except torch._dynamo.exc.Unsupported as e:
            reason, line, code = _unsupported(e)
            self._break(reason, line, code)
            if self.strict:
                raise CompileRefused(f"bucket {self.bucket}: the step graph breaks at {line or 'an unknown line'}"
                                     f"{' (' + code + ')' if code else ''}: {reason}; a break falls back to the host "
                                     f"on every step (rbln.strict_warmup: false serves it so)") from None
        self.breaks.clear()  # counted again as Dynamo compiles the pieces
        self.fullgraph = False
        self.graphs = 0
        if self.audit is not None:
            self.audit = au.Audit()
        self._graph = self._compiled()
        out = self._timed(x)
        if not self.breaks:
            self._break(reason, line, code)
        return out

    def _eager_instead(self, x: torch.Tensor, e: BaseException) -> torch.Tensor:
        """The compiler failed on the step (e): run it eagerly. If that
        fails too the step is wrong, not the compiler: its own error is
        raised. Otherwise the compiler's error is refused (strict) or the
        bucket is served eagerly from now on."""
        first = (str(getattr(e, "inner_exception", None) or e).strip().splitlines() or [""])[0]
        error = f"{self.compiler} failed to compile the step: {type(e).__name__}: {first[:400]}"
        if self.strict and self.compiler != INDUCTOR:
            # On a device an eager run proves nothing about the step (its
            # operators may be outside the eager tables): refused as it is.
            raise CompileRefused(f"bucket {self.bucket}: {error}") from None
        start = time.perf_counter()
        out = self.body(x)  # raises the step's own error, if it has one
        seconds = time.perf_counter() - start
        if self.strict:
            raise CompileRefused(f"bucket {self.bucket}: {error} (rbln.strict_warmup: false serves the bucket "
                                 f"eagerly)") from None
        self.error, self.note = error, f"served eagerly: {error}"
        self.compiler, self.counted, self._graph = NONE, False, self.body
        self.compile_seconds = seconds
        return out

    def _timed(self, x: torch.Tensor) -> torch.Tensor:
        assert self._graph is not None
        start = time.perf_counter()
        out = self._graph(x)
        self.compile_seconds = time.perf_counter() - start
        return out

    # -- reporting ------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """The program as /explain's programs[] lists it: counts Dynamo did
        not see are null, never 0."""
        counted = self.counted or bool(self.breaks)
        d: dict[str, Any] = {
            "bucket": self.bucket, "kind": self.kind, "compiler": self.compiler, "built": self.warm,
            "graphs": self.graphs if self.counted else (0 if self.compiler == NONE else None),
            "graph_breaks": len(self.breaks) if self.breaks or (counted and self.warm) else None,
            "recompiles": self.recompiles if self.counted and self.warm else None,
            "compile_seconds": self.compile_seconds if self.compiler != NONE else None,
            "cache_hit": self.cache_hit,
            "audit": self.audit.to_wire() if self.audit is not None and self.audit.graphs else None,
        }
        if self.breaks:
            d["breaks"] = list(self.breaks)
        if self.recompile_reasons:
            d["recompile_reasons"] = list(self.recompile_reasons)
        if self.error:
            d["error"] = self.error
        if self.note:
            d["note"] = self.note
        return d


def _unsupported(e: BaseException) -> tuple[str, str, str]:
    """(reason, "file.py:line", code) of a graph break Dynamo raised under
    fullgraph=True."""
    text = str(e)
    reason = text.split("\n\nfrom user code:")[0].strip().splitlines()[0] if text.strip() else type(e).__name__
    stack = getattr(e, "real_stack", None)
    if stack:
        fr = stack[-1]
        return reason, f"{au._short(fr.filename)}:{fr.lineno}", (fr.line or "").strip()
    line, code = au.source_line(text.split("from user code:")[-1]) if "from user code:" in text else ("", "")
    return reason, line, code


def _compiler_error(e: BaseException) -> bool:
    """Whether e is the compiler failing on a graph (lowering, codegen),
    not the step's own error."""
    exc = getattr(torch._dynamo, "exc", None)
    kinds = tuple(k for k in (getattr(exc, "BackendCompilerFailed", None), getattr(exc, "TorchRuntimeError", None),
                              getattr(exc, "InternalTorchDynamoError", None)) if k is not None)
    return isinstance(e, kinds)
