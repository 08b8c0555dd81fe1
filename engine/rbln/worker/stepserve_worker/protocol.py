"""The control channel: length-prefixed JSON messages over the socket the
supervisor passes as a file descriptor. Tensor data never crosses it; it
lives in shared-memory staging buffers, whose descriptors travel beside a
load message (SCM_RIGHTS)."""

from __future__ import annotations

import array
import json
import os
import socket
import struct
import threading
from typing import Any

#: The largest frame either side accepts; a longer length prefix means the
#: stream is corrupt.
MAX_FRAME = 16 << 20

#: The most descriptors one message may carry; the supervisor sends one per
#: load (the program's staging memory).
MAX_FDS = 16

_HEADER = struct.Struct(">I")
_ANCILLARY = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame or message."""


def encode(msg: dict[str, Any]) -> bytes:
    """One frame: a 4-byte big-endian length, then the JSON body."""
    body = json.dumps(msg, separators=(",", ":"), allow_nan=False).encode()
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"message of {len(body)} bytes exceeds the {MAX_FRAME}-byte frame limit")
    return _HEADER.pack(len(body)) + body


def decode(body: bytes) -> dict[str, Any]:
    """Parse one frame body into a message with a string type and an int id."""
    try:
        msg = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"frame is not JSON: {e}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("message is not a JSON object")
    if not isinstance(msg.get("type"), str):
        raise ProtocolError("message has no string 'type'")
    if not isinstance(msg.get("id", 0), int):
        raise ProtocolError("message 'id' is not an integer")
    return msg


def _read_exact(sock: socket.socket, n: int, fds: list[int]) -> bytes:
    """n bytes, and into fds any descriptors that came with them."""
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk, ancillary, flags, _ = sock.recvmsg(n - len(buf), _ANCILLARY)
        except ConnectionResetError as e:  # the supervisor died mid-message
            raise EOFError("supervisor reset the control socket") from e
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", data[: len(data) - len(data) % array.array("i").itemsize]))
        if flags & socket.MSG_CTRUNC:
            raise ProtocolError(f"a message carried more than {MAX_FDS} file descriptors")
        if not chunk:
            raise EOFError("supervisor closed the control socket")
        buf += chunk
    return bytes(buf)


def read_message(sock: socket.socket) -> dict[str, Any]:
    """Block for the next message; EOFError when the supervisor is gone.
    Descriptors sent with it are under "fds" (the receiver closes them)."""
    fds: list[int] = []
    try:
        (n,) = _HEADER.unpack(_read_exact(sock, _HEADER.size, fds))
        if n > MAX_FRAME:
            raise ProtocolError(f"frame length {n} exceeds the {MAX_FRAME}-byte limit")
        msg = decode(_read_exact(sock, n, fds))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    msg.pop("fds", None)  # only the socket puts descriptors in a message
    if fds:
        msg["fds"] = fds
    return msg


class Writer:
    """Writes whole frames; safe from several threads (the control thread
    and the device thread answer independently)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()

    def send(self, msg: dict[str, Any]) -> None:
        frame = encode(msg)
        with self._lock:
            self._sock.sendall(frame)
