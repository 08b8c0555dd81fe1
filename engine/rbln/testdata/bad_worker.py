"""A misbehaving worker for the supervisor's fault tests (never used in
production): it greets correctly, then misbehaves as $BAD_WORKER_MODE says:

  garbage   answers the first request with a frame that is not JSON
  exit      prints an error to stderr and exits 1 on the first request
"""
import os
import socket
import struct
import sys
import time

sock = socket.socket(fileno=3)


def send(body: bytes) -> None:
    sock.sendall(struct.pack(">I", len(body)) + body)


send(b'{"type":"hello","protocol":3,"pid":%d,"torch":"none","device":"cpu","device_kind":"cpu","doorbell":true}' % os.getpid())
n = struct.unpack(">I", sock.recv(4))[0]
sock.recv(n)  # the first request, whatever it is
mode = os.environ.get("BAD_WORKER_MODE", "garbage")
if mode == "exit":
    print("Traceback (most recent call last):\nRuntimeError: rbln device 0 failed to initialise (fake)", file=sys.stderr, flush=True)
    sys.exit(1)
send(b"this is not json")
# Stay alive: the supervisor must notice the bad frame itself, not a death.
time.sleep(30)
