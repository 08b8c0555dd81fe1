"""The binary step path. A step is not a message: the supervisor writes the
step's model slot and bucket into a control block it shares with this
process (a memfd, mapped by both), bumps the block's request number and
rings an eventfd; the device thread, which waits on that eventfd, runs the
step and writes a fixed binary report into the same block (counters as
integers, -1 for unknown; text only for a step that is not clean), bumps the
done number and rings the supervisor's eventfd. No JSON, no thread hop, no
allocation on the way for a clean step.

The layout (little-endian) is the one engine/rbln/doorbell.go defines; the
two must change together, with the protocol version:

    0    u64  request number (the supervisor's; written last)
    8    u32  model slot (the load request's "slot")
    12   u32  bucket
    16   u32  lane
    24   u64  building: the number of the step the worker builds a graph
              in (a recompile), written as it starts building; the
              supervisor then bounds that step by its compile deadline
    64   u64  done number (the worker's; written last)
    72   i32  status: 0 done, 1 failed (text is the error)
    76   u32  flags: 1 measured, 2 clean, 4 text holds the report's extras (JSON)
    80   16 x i64 counters, in COUNTERS then DISPATCH order, -1 unknown
    208  i64  ns the worker spent inside the step body
    216  u32  text length
    256  text
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import time
from typing import Any, Optional, Sequence

BLOCK_SIZE = 64 << 10
TEXT_OFFSET = 256
MAX_TEXT = BLOCK_SIZE - TEXT_OFFSET

STATUS_DONE = 0
STATUS_FAILED = 1

FLAG_MEASURED = 1
FLAG_CLEAN = 2
FLAG_EXTRAS = 4

#: The report's counters, in their order in the block (engine.Explain's).
COUNTERS = ("cpu_fallbacks", "recompiles", "host_bounces", "host_bounce_bytes", "h2d", "d2h",
            "wall_ns", "h2d_ns", "d2h_ns", "v2v", "v2v_slow")

# Native-order words are written with one store each (struct's standard
# "<" sizes are written byte by byte): the supervisor may poll the done
# number while it is written. Every host this runs on is little-endian.
_REQUEST = struct.Struct("=QIII")
_SEQ = struct.Struct("=Q")
_REPORT = struct.Struct("=iI16qqI")
_REPORT_OFFSET = 72
_DONE_OFFSET = 64
_BUILDING_OFFSET = 24

#: The dispatch detail's counters (Report.dispatch's keys), after COUNTERS.
DISPATCH = ("total", "warm_hits", "cpu_fallback_ns", "runtime_ns", "v2v_ns")

UNKNOWN = (-1,) * (len(COUNTERS) + len(DISPATCH))

#: How long the device thread polls the block for the next step before it
#: sleeps on the ring.
SPIN_NS = 100_000


class Doorbell:
    """This process's end of the step path: the control block and the two
    eventfds (ring: the supervisor's, or this process's own main thread's,
    wake-up call; done: ours to the supervisor). Without a block (tests of
    the control loop) it is only the ring, which wakes the device thread
    for queued device requests."""

    def __init__(self, block_fd: Optional[int] = None, ring_fd: Optional[int] = None,
                 done_fd: Optional[int] = None) -> None:
        self.block: Optional[mmap.mmap] = None
        if block_fd is not None:
            self.block = mmap.mmap(block_fd, BLOCK_SIZE)
            os.close(block_fd)
        self.ring = ring_fd if ring_fd is not None else os.eventfd(0, os.EFD_CLOEXEC)
        self.done = done_fd
        self.last = 0  # the number of the last request seen; a new block starts at 0
        # When the last request was seen, in ns, and whether requests have
        # been coming within SPIN_NS of the last report (else the poll
        # only takes a core from the supervisor).
        self._reported = 0
        self._busy = True

    @classmethod
    def from_arg(cls, arg: str) -> "Doorbell":
        """The --doorbell argument: the block's, the ring's and the done
        eventfd's descriptors, comma-separated."""
        try:
            block, ring, done = (int(x) for x in arg.split(","))
        except ValueError:
            raise ValueError(f"--doorbell {arg!r}; want three descriptors, block,ring,done") from None
        return cls(block, ring, done)

    def wait(self) -> None:
        """Return once rung. Right after a step the supervisor often rings
        again within µs (a busy batcher): the block is polled for SPIN_NS
        first, as waking a sleeping thread costs tens of µs on a virtual
        machine. Then sleep, the interpreter lock released, on the ring."""
        if self.block is not None and self._busy:
            block, last, now = self.block, self.last, time.perf_counter_ns
            deadline = now() + SPIN_NS
            while now() < deadline:
                if _SEQ.unpack_from(block, 0)[0] != last:
                    return  # the ring's count stays: the next wait wakes at once, finds nothing, and sleeps
        os.eventfd_read(self.ring)

    def wake(self) -> None:
        """Ring our own bell: a device request was queued."""
        os.eventfd_write(self.ring, 1)

    def request(self) -> Optional[tuple[int, int, int, int]]:
        """The step the supervisor asked for since the last one: (number,
        slot, bucket, lane); None when there is none."""
        if self.block is None:
            return None
        req = _REQUEST.unpack_from(self.block, 0)
        if req[0] == self.last:
            return None
        self.last = req[0]
        if self._reported:
            self._busy = time.perf_counter_ns() - self._reported < SPIN_NS
        return req

    def report(self, seq: int, status: int, flags: int, counters: Sequence[int], body_ns: int,
               text: bytes = b"") -> None:
        """Write step seq's report, then its number, then ring."""
        assert self.block is not None and self.done is not None
        if len(text) > MAX_TEXT:
            # Extras are cut to fit as JSON (extras()); only an error's
            # text, read as text, can reach here.
            text = text[:MAX_TEXT]
        if text:
            self.block[TEXT_OFFSET:TEXT_OFFSET + len(text)] = text
        _REPORT.pack_into(self.block, _REPORT_OFFSET, status, flags, *counters, body_ns, len(text))
        _SEQ.pack_into(self.block, _DONE_OFFSET, seq)
        os.eventfd_write(self.done, 1)
        self._reported = time.perf_counter_ns()

    def building(self, seq: int) -> None:
        """Say that step seq builds a graph (a recompile): the supervisor
        bounds it by its compile deadline, not its stall one."""
        if self.block is not None:
            _SEQ.pack_into(self.block, _BUILDING_OFFSET, seq)

    def fail(self, seq: int, error: str) -> None:
        self.report(seq, STATUS_FAILED, 0, UNKNOWN, 0, error.encode(errors="replace"))

    def close(self) -> None:
        if self.block is not None:
            try:
                self.block.close()
            except BufferError:
                pass
        for fd in (self.ring, self.done):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass


def extras(report: Any, limit: int = MAX_TEXT) -> bytes:
    """A report's non-counter fields as the JSON the block's text carries
    for a step that is not clean: valid JSON of at most limit bytes
    whatever the report holds. What does not fit goes first the least
    needed first: the explain text, then the per-site and per-op detail
    (the largest entries kept), then notes, then reasons past the first
    few; "truncated" then names what was cut. The counters travel in the
    block's binary fields and are never cut."""
    d: dict[str, Any] = {"reasons": list(report.reasons)}
    for key in ("cpu_fallback_by_op", "recompile_by_op", "host_bounce_by_site", "cpu_fallback_reasons"):
        v = getattr(report, key)
        if v:
            d[key] = v
    if report.notes:
        d["notes"] = list(report.notes)
    if report.report:
        d["report"] = report.report
    text = _dump(d)
    if len(text) <= limit:
        return text
    cut: list[str] = []
    d["truncated"] = cut

    def fits() -> bool:
        return len(_dump(d)) <= limit

    def mark(key: str) -> None:
        if key not in cut:
            cut.append(key)

    if "report" in d:
        del d["report"]
        mark("report")
        if fits():
            return _dump(d)
    # The per-site and per-op detail: the largest map is halved first (its
    # largest entries kept), until it fits or no detail is left.
    detail = ("host_bounce_by_site", "cpu_fallback_reasons", "recompile_by_op", "cpu_fallback_by_op")
    while not fits():
        present = [k for k in detail if d.get(k)]
        if not present:
            break
        key = max(present, key=lambda k: len(_dump({k: d[k]})))
        mark(key)
        items = sorted(d[key].items(), key=lambda kv: -kv[1] if isinstance(kv[1], (int, float)) else 0)
        if len(items) // 2 == 0:
            del d[key]
        else:
            d[key] = dict(items[:len(items) // 2])
    if fits():
        return _dump(d)
    # Then notes and reasons: the first few of each, each shortened, the
    # longer list giving way first.
    for key in ("notes", "reasons"):
        v = d.get(key) or []
        short = [str(x)[:200] for x in v[:8]]
        if short != v:
            d[key] = short
            mark(key)
    while not fits():
        present = [k for k in ("notes", "reasons") if d.get(k)]
        if not present:
            break
        key = max(present, key=lambda k: len(_dump({k: d[k]})))
        mark(key)
        d[key].pop()
    if fits():
        return _dump(d)
    return _dump({"reasons": ["the step's report did not fit the doorbell's text area"], "truncated": ["everything"]})


def _dump(d: dict[str, Any]) -> bytes:
    return json.dumps(d, separators=(",", ":")).encode()
