"""The worker's control loop: control requests never wait for a device
request, cancelled requests are skipped, building is announced, staging
descriptors arrive with their load, and the process stops cleanly."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path
from typing import Any

from stepserve_worker.protocol import Writer, read_message
from stepserve_worker.worker import TEST_COMPILE_SLEEP_ENV, Server

WORKER_DIR = Path(__file__).resolve().parents[1]


class StubWorker:
    """A Worker whose compile waits until the test releases it."""

    def __init__(self) -> None:
        self.rt = None
        self.release = threading.Event()
        self.calls: list[str] = []
        self.fds_seen: list[int] = []

    def load(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("load")
        self.fds_seen = list(msg.get("fds", []))
        return {}

    def compile(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("compile")
        self.release.wait(10)
        return {}

    def step(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(f"step {msg['bucket']}")
        return {}

    def unload(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("unload")
        return {}

    def memory(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"chiplets": [{"npu": "0", "chiplet": "0", "kind": "allocated", "bytes": 1}]}


class ServerTest(unittest.TestCase):
    def setUp(self) -> None:
        ours, theirs = socket.socketpair()
        self.sock, self.out = ours, Writer(ours)
        self.worker = StubWorker()
        self.server = Server(theirs, self.worker)  # type: ignore[arg-type]
        self.status: list[int] = []
        self.thread = threading.Thread(target=lambda: self.status.append(self.server.serve()), daemon=True)
        self.thread.start()
        self.sock.settimeout(5)

    def tearDown(self) -> None:
        self.worker.release.set()
        self.sock.close()
        self.thread.join(5)
        self.server.sock.close()
        os.environ.pop(TEST_COMPILE_SLEEP_ENV, None)

    def send(self, msg: dict[str, Any]) -> None:
        self.out.send(msg)

    def read(self) -> dict[str, Any]:
        return read_message(self.sock)

    def test_control_requests_do_not_wait_for_a_compile(self) -> None:
        self.send({"type": "compile", "id": 1, "model": "m", "bucket": 0})
        self.assertEqual({"type": "building", "id": 1}, self.read(), "a compile is announced before it runs")
        self.send({"type": "ping", "id": 2})
        self.assertEqual({"type": "pong", "id": 2}, self.read())
        self.send({"type": "memory", "id": 3})
        mem = self.read()
        self.assertEqual((3, True), (mem["id"], mem["ok"]))
        self.assertTrue(mem["cached"], "read while the device is busy: the last reading")
        self.assertEqual(-1.0, mem["age_seconds"], "no reading yet: the age says so")
        self.worker.release.set()
        self.assertEqual({"type": "result", "id": 1, "ok": True}, self.read())
        self.send({"type": "memory", "id": 4})
        mem = self.read()
        self.assertFalse(mem["cached"], "read live while the device is idle")
        self.assertEqual(1, mem["chiplets"][0]["bytes"])
        self.assertEqual(0.0, mem["age_seconds"])

    def test_memory_is_read_after_a_build_and_between_steps(self) -> None:
        """A bucket's first step commits lazily allocated memory: read after
        it; later steps re-read once the reading is MEMORY_REFRESH_SECONDS
        old (issue 33, item 6)."""
        import stepserve_worker.worker as wk
        reads: list[str] = []
        self.worker.memory = lambda msg: (reads.append("read"), {"chiplets": []})[1]  # type: ignore[method-assign]
        self.worker.release.set()
        self.send({"type": "step", "id": 1, "model": "m", "bucket": 0})
        self.assertEqual({"type": "building", "id": 1}, self.read(), "the bucket's first step builds")
        self.assertTrue(self.read()["ok"])
        self.assertEqual(1, len(reads), "read after the build")
        self.send({"type": "step", "id": 2, "model": "m", "bucket": 0})
        self.assertTrue(self.read()["ok"])
        self.assertEqual(1, len(reads), "a fresh reading is not read again")
        self.server._memory_at -= wk.MEMORY_REFRESH_SECONDS + 1
        self.send({"type": "step", "id": 3, "model": "m", "bucket": 0})
        self.assertTrue(self.read()["ok"])
        self.assertEqual(2, len(reads), "a stale one is, between steps")

    def test_cancelled_request_is_skipped(self) -> None:
        self.send({"type": "compile", "id": 1, "model": "m", "bucket": 0})
        self.read()  # building
        self.send({"type": "step", "id": 2, "model": "m", "bucket": 0})
        self.send({"type": "cancel", "id": 3, "target": 2})
        self.send({"type": "cancel", "id": 4, "target": 1})  # running: too late to skip
        self.send({"type": "ping", "id": 5})
        self.assertEqual("pong", self.read()["type"])
        self.worker.release.set()
        self.assertEqual({"type": "result", "id": 1, "ok": True}, self.read())
        skipped = self.read()
        self.assertEqual((2, False), (skipped["id"], skipped["ok"]))
        self.assertIn("cancelled", skipped["error"])
        self.assertEqual(["compile"], self.worker.calls, "the cancelled step never ran")

    def test_a_buckets_first_step_builds(self) -> None:
        self.worker.release.set()
        self.send({"type": "compile", "id": 1, "model": "m", "bucket": 0})
        self.assertEqual(["building", "result"], [self.read()["type"] for _ in range(2)])
        self.send({"type": "step", "id": 2, "model": "m", "bucket": 0})
        self.assertEqual(["building", "result"], [self.read()["type"] for _ in range(2)],
                         "torch.compile is lazy: the first run builds the graph")
        self.send({"type": "step", "id": 3, "model": "m", "bucket": 0})
        self.assertEqual({"type": "result", "id": 3, "ok": True}, self.read(), "later steps build nothing")
        self.send({"type": "unload", "id": 4, "model": "m"})
        self.read()
        self.send({"type": "step", "id": 5, "model": "m", "bucket": 0})
        self.assertEqual("building", self.read()["type"], "a reloaded model builds again")

    def test_staging_descriptors_come_with_the_load(self) -> None:
        with tempfile.TemporaryFile() as f:
            body = b'{"type":"load","id":1,"model":"m"}'
            socket.send_fds(self.sock, [len(body).to_bytes(4, "big") + body], [f.fileno()])
            self.assertEqual("building", self.read()["type"])
            self.assertEqual({"type": "result", "id": 1, "ok": True}, self.read())
        self.assertEqual(1, len(self.worker.fds_seen))
        with self.assertRaises(OSError, msg="the server closes the descriptors once the load is done"):
            os.fstat(self.worker.fds_seen[0])

    def test_compile_sleep_holding_the_gil_delays_pongs(self) -> None:
        # The hook the supervisor's fault tests use must really hold the
        # lock: this thread, too, waits for it.
        os.environ[TEST_COMPILE_SLEEP_ENV] = "2:gil"
        self.worker.release.set()
        start = time.monotonic()
        self.send({"type": "compile", "id": 1, "model": "m", "bucket": 0})
        self.read()  # building
        time.sleep(0.3)  # the device thread is in the sleep by now
        self.send({"type": "ping", "id": 2})
        self.assertIn("pong", [self.read()["type"] for _ in range(2)])
        self.assertGreater(time.monotonic() - start, 1.5)

    def test_shutdown_ends_serve(self) -> None:
        self.send({"type": "shutdown", "id": 1})
        self.thread.join(5)
        self.assertEqual([0], self.status)


class ProcessTest(unittest.TestCase):
    """The worker as the supervisor runs it: its own process, the control
    socket as fd 3."""

    def start(self) -> tuple[subprocess.Popen, socket.socket]:
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=str(WORKER_DIR))
        proc = subprocess.Popen([sys.executable, "-m", "stepserve_worker", "--fd", str(theirs.fileno())],
                                pass_fds=[theirs.fileno()], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        theirs.close()
        ours.settimeout(60)
        self.assertEqual("hello", read_message(ours)["type"])
        return proc, ours

    def test_stops_cleanly(self) -> None:
        for how in ("shutdown", "SIGTERM", "SIGINT"):
            with self.subTest(how=how):
                proc, sock = self.start()
                with sock:
                    if how == "shutdown":
                        Writer(sock).send({"type": "shutdown", "id": 1})
                    else:
                        proc.send_signal(getattr(signal, how))
                    out, err = proc.communicate(timeout=10)
                self.assertEqual(0, proc.returncode, err.decode())
                self.assertNotIn(b"Traceback", err)
                self.assertIn(b"stepserve_worker: stopping", out)


if __name__ == "__main__":
    unittest.main()
