"""The binary step path's worker end: a request written into the block and
rung is run once, on the device thread, and answered with a binary report;
a failing step answers with its error; device requests still run in order."""

import os
import socket
import struct
import threading
import time
import unittest
from typing import Any

from stepserve_worker import doorbell as bell
from stepserve_worker.protocol import Writer, read_message
from stepserve_worker.worker import Server


class Supervisor:
    """The supervisor's end of a doorbell, as engine/rbln/doorbell.go has it."""

    def __init__(self) -> None:
        fd = os.memfd_create("test-doorbell")
        os.ftruncate(fd, bell.BLOCK_SIZE)
        import mmap
        self.block = mmap.mmap(fd, bell.BLOCK_SIZE)
        self.ring = os.eventfd(0)
        self.done = os.eventfd(0)
        self.worker_end = bell.Doorbell(os.dup(fd), os.dup(self.ring), os.dup(self.done))
        os.close(fd)
        self.seq = 0

    def step(self, slot: int, bucket: int, lane: int = 0) -> tuple[int, int, tuple[int, ...], int, bytes]:
        self.seq += 1
        struct.pack_into("<III", self.block, 8, slot, bucket, lane)
        struct.pack_into("<Q", self.block, 0, self.seq)
        os.eventfd_write(self.ring, 1)
        deadline = time.monotonic() + 5
        while struct.unpack_from("<Q", self.block, 64)[0] != self.seq:
            if time.monotonic() > deadline:
                raise TimeoutError("no report")
            time.sleep(0.001)
        status, flags, *rest = struct.unpack_from("<iI16qqI", self.block, 72)
        counters, body, n = tuple(rest[:16]), rest[16], rest[17]
        return status, flags, counters, body, bytes(self.block[256:256 + n])


class StubWorker:
    def __init__(self) -> None:
        self.rt = None
        self.calls: list[str] = []

    def step_binary(self, slot: int, bucket: int, lane: int) -> tuple[int, tuple[int, ...], int, bytes]:
        self.calls.append(f"bell {slot}/{bucket}" + (f" lane {lane}" if lane else ""))
        if slot == 9:
            raise KeyError("model slot 9 is not loaded on this worker")
        return bell.FLAG_MEASURED | bell.FLAG_CLEAN, (0, 0, 0, 0, 1, 1, 500, 10, 20, -1, 0, 3, 3, 0, 400, -1), 4321, b""

    def load(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("load")
        return {}

    compile = step = unload = load

    def memory(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"chiplets": []}


class DoorbellTest(unittest.TestCase):
    def setUp(self) -> None:
        self.sup = Supervisor()
        ours, theirs = socket.socketpair()
        self.sock, self.out = ours, Writer(ours)
        self.worker = StubWorker()
        self.server = Server(theirs, self.worker, self.sup.worker_end)  # type: ignore[arg-type]
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()
        self.sock.settimeout(5)

    def tearDown(self) -> None:
        self.sock.close()
        self.thread.join(5)
        self.server.sock.close()

    def test_a_rung_step_is_answered_in_binary(self) -> None:
        status, flags, counters, body, text = self.sup.step(3, 1)
        self.assertEqual(bell.STATUS_DONE, status)
        self.assertEqual(bell.FLAG_MEASURED | bell.FLAG_CLEAN, flags)
        self.assertEqual((0, 0, 0, 0, 1, 1, 500, 10, 20, -1, 0, 3, 3, 0, 400, -1), counters)
        self.assertEqual(4321, body)
        self.assertEqual(b"", text, "a clean step's report has no text")
        self.sup.step(3, 2, lane=1)
        self.assertEqual(["bell 3/1", "bell 3/2 lane 1"], self.worker.calls, "each request runs once, on its lane")

    def test_a_failing_step_reports_its_error(self) -> None:
        status, _, counters, _, text = self.sup.step(9, 0)
        self.assertEqual(bell.STATUS_FAILED, status)
        self.assertEqual(bell.UNKNOWN, counters)
        self.assertIn(b"model slot 9 is not loaded", text)
        status, *_ = self.sup.step(3, 0)
        self.assertEqual(bell.STATUS_DONE, status, "the device thread goes on after a failed step")

    def test_device_requests_still_run_between_steps(self) -> None:
        self.sup.step(3, 0)
        self.out.send({"type": "load", "id": 1, "model": "m"})
        self.assertEqual({"type": "building", "id": 1}, read_message(self.sock))
        self.assertEqual({"type": "result", "id": 1, "ok": True}, read_message(self.sock))
        self.sup.step(3, 0)
        self.assertEqual(["bell 3/0", "load", "bell 3/0"], self.worker.calls)


if __name__ == "__main__":
    unittest.main()


class ExtrasTest(unittest.TestCase):
    """A report longer than the text area is cut to valid JSON, detail
    first, reasons kept (issue 33, item 5)."""

    def report(self, **kw: Any) -> Any:
        from stepserve_worker.explain import Report
        return Report(measured=True, **kw)

    def test_a_report_that_fits_is_whole(self) -> None:
        import json
        r = self.report(reasons=["cpu_fallback: aten::nonzero"], cpu_fallback_by_op={"aten::nonzero": 2}, report="[overhead]")
        d = json.loads(bell.extras(r))
        self.assertEqual({"reasons": ["cpu_fallback: aten::nonzero"], "cpu_fallback_by_op": {"aten::nonzero": 2}, "report": "[overhead]"}, d)

    def test_a_long_report_is_cut_to_valid_json(self) -> None:
        import json
        ops = {f"aten::op_{i:05d}": i for i in range(20000)}
        r = self.report(reasons=["cpu_fallback: 20000 ops"], cpu_fallback_by_op=ops,
                        host_bounce_by_site={f"site {i}": 1 for i in range(5000)}, report="x" * 100000)
        text = bell.extras(r)
        self.assertLessEqual(len(text), bell.MAX_TEXT)
        d = json.loads(text)
        self.assertEqual(["cpu_fallback: 20000 ops"], d["reasons"], "reasons are kept")
        self.assertNotIn("report", d)
        self.assertIn("report", d["truncated"])
        self.assertIn("cpu_fallback_by_op", d["truncated"])
        kept = d.get("cpu_fallback_by_op", {})
        self.assertTrue(kept, "the largest entries are kept while they fit")
        self.assertIn("aten::op_19999", kept, "the largest first")
        self.assertTrue(all(ops[k] == v for k, v in kept.items()))

    def test_the_largest_detail_goes_first(self) -> None:
        import json
        r = self.report(reasons=["cpu_fallback"], cpu_fallback_by_op={f"aten::op_{i:05d}": i for i in range(20000)},
                        host_bounce_by_site={"a.py:1": 3, "b.py:2": 1}, notes=["keep me"])
        d = json.loads(bell.extras(r))
        self.assertEqual({"a.py:1": 3, "b.py:2": 1}, d["host_bounce_by_site"], "a small map is not cut for a large one")
        self.assertEqual(["keep me"], d["notes"])
        self.assertEqual(["cpu_fallback_by_op"], d["truncated"])

    def test_a_tiny_area_still_gets_json(self) -> None:
        import json
        r = self.report(reasons=["r" * 500] * 50, notes=["n" * 500] * 50)
        for limit in (120, 400, 2000):
            text = bell.extras(r, limit)
            self.assertLessEqual(len(text), limit)
            json.loads(text)

    def test_a_cut_report_reaches_the_supervisor_as_json(self) -> None:
        import json
        sup = Supervisor()
        r = self.report(reasons=["host_bounce"], host_bounce_by_site={f"site {i}": i for i in range(30000)})
        seq = 1
        sup.worker_end.report(seq, bell.STATUS_DONE, bell.FLAG_MEASURED | bell.FLAG_EXTRAS, bell.UNKNOWN, 0, bell.extras(r))
        n = struct.unpack_from("<I", sup.block, 216)[0]
        json.loads(bytes(sup.block[256:256 + n]))
