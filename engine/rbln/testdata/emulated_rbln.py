"""TEST ONLY: the real worker (stepserve_worker) on an RBLN device emulated
on the host, for tests of what loading and unloading a model does to device
memory. Never used in production.

This torch has no rbln device type, so a worker of engine rbln refuses every
model. Here the worker's own code runs with three changes, all about where
it computes: its runtime takes the host CPU for the RBLN device; the tensors
the worker checks are on the device after it moves them there (a model's
weights) are handed to the torch_rbln test double's emulated allocator,
which counts them allocated while they live; and a load reply names the
emulated device rbln:0, as the supervisor requires of engine rbln.
Compiling is emulated too: torch.compile is the double's, whose programs
hold device memory until torch._dynamo.reset(). Everything else is the
worker's: the load, the unload that drops the module and its graphs,
resets dynamo's cache and empties the allocator's, and the memory
reading. Run as the supervisor runs the interpreter:
emulated_rbln.py -m stepserve_worker --fd 3 --device rbln.
"""

import sys
from typing import Any, Iterable

from stepserve_worker import worker


class EmulatedRuntime(worker.Runtime):
    @classmethod
    def detect(cls, kind: str = "cpu") -> "worker.Runtime":
        rt = super().detect(kind)
        if kind == "rbln" and rt.unusable.startswith("torch has no rbln device type"):
            rt.unusable = ""
            rt.notes.append("the RBLN device is EMULATED on the host CPU (tests only)")
            # Compiled programs hold device memory until
            # torch._dynamo.reset(), as on the device (the double's
            # Programs); this torch has no torch.compile of its own.
            rt.compile_available = True
        return rt

    def require_device(self, what: str, tensors: Iterable[Any]) -> None:
        super().require_device(what, [])  # refuses an unusable runtime
        self.rbln.place(tensors)


class EmulatedWorker(worker.Worker):
    def load(self, msg: dict[str, Any]) -> dict[str, Any]:
        return dict(super().load(msg), device="rbln:0")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:2] == ["-m", "stepserve_worker"]:
        args = args[2:]
    import types

    import torch
    import torch_rbln

    torch.compile = lambda fn, **kw: torch_rbln.PROGRAMS.compile(fn, **kw)  # type: ignore[attr-defined]
    torch._dynamo = types.SimpleNamespace(reset=torch_rbln.PROGRAMS.reset)  # type: ignore[attr-defined]
    worker.Runtime, worker.Worker = EmulatedRuntime, EmulatedWorker
    sys.exit(worker.main(args))
