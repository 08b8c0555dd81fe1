"""torch.profiler around a profiled step (stepserve's trace level PROFILE).

The supervisor asks for a profile in a step message ("profile": true); the
worker then runs that step inside torch.profiler.profile and a
record_function range named "stepserve.step <model> bucket <i>", and returns
the profiler's Chrome trace events with the step's reply, bounded in size.
The Go side shifts them so that the range starts where its own infer span
of the step starts.

Activities: CPU always; PrivateUse1 (the device, as torch_rbln's Kineto
bridge records it) where this torch has ProfilerActivity.PrivateUse1 and the
bridge can be active: torch_rbln imported and RBLN_PROFILER=1 set when the
process started (the runtime reads it then). On NPUs whose bridge stays
inactive (ATOM) the trace then shows host activity only, as torch_rbln's
documentation says.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Optional

import torch

#: The name prefix of the range around the step body.
ANCHOR = "stepserve.step"

#: The most bytes of events one step's profile returns (JSON); the
#: supervisor's frame limit is 16 MiB.
MAX_EVENT_BYTES = 4 << 20

#: Set by the supervisor under rbln.profiler: the runtime records device
#: activity for the bridge.
BRIDGE_ENV = "RBLN_PROFILER"


def device_activity(rbln: Any) -> Optional[Any]:
    """ProfilerActivity.PrivateUse1 where torch has it and torch_rbln's
    bridge can be active (torch.rbln present, RBLN_PROFILER=1); else None."""
    act = getattr(torch.profiler.ProfilerActivity, "PrivateUse1", None)
    if act is None or rbln is None or os.environ.get(BRIDGE_ENV) != "1":
        return None
    return act


class StepProfile:
    """A context that profiles what runs inside it, under a record_function
    range named name; result() is the reply's "profile"."""

    def __init__(self, rbln: Any, name: str) -> None:
        from torch.profiler import ProfilerActivity, profile, record_function

        self.activities = [ProfilerActivity.CPU]
        self.names = ["CPU"]
        dev = device_activity(rbln)
        if dev is not None:
            self.activities.append(dev)
            self.names.append("PrivateUse1")
        self._profile = profile(activities=self.activities)
        self._range = record_function(name)
        self.name = name

    def __enter__(self) -> "StepProfile":
        self._profile.__enter__()
        self._range.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._range.__exit__(*exc)
        finally:
            self._profile.__exit__(*exc)

    def device_events(self) -> int:
        """How many of the profile's events the device recorded."""
        kind = getattr(getattr(torch.autograd, "DeviceType", None), "PrivateUse1", None)
        if kind is None:
            kind = getattr(getattr(torch.profiler, "DeviceType", None), "PrivateUse1", None)
        if kind is None:
            return 0
        return sum(1 for e in self._profile.events() if getattr(e, "device_type", None) == kind)

    def result(self, limit: int = MAX_EVENT_BYTES) -> dict[str, Any]:
        events = chrome_events(self._profile)
        kept, dropped = bound(events, limit, self.name)
        return {"events": kept, "dropped": dropped, "activities": self.names, "anchor": ANCHOR,
                "device_events": self.device_events()}


def chrome_events(prof: Any) -> list[dict[str, Any]]:
    """The profile's Chrome trace events, as export_chrome_trace writes them
    (a list, or an object with traceEvents, whichever this torch writes)."""
    fd, path = tempfile.mkstemp(prefix="stepserve-profile-", suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            data = json.load(f)
    finally:
        os.unlink(path)
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    return [e for e in data if isinstance(e, dict)]


def bound(events: list[dict[str, Any]], limit: int, anchor: str) -> tuple[list[dict[str, Any]], int]:
    """The events that fit in limit bytes of JSON, the anchor range first
    (the supervisor aligns on it), then in order; and how many were left
    out."""
    first = [e for e in events if e.get("name") == anchor][:1]
    rest = [e for e in events if not (first and e is first[0])]
    kept: list[dict[str, Any]] = []
    size = 2
    dropped = 0
    for e in first + rest:
        n = len(json.dumps(e)) + 1
        if size + n > limit:
            dropped += 1
            continue
        kept.append(e)
        size += n
    return kept, dropped
