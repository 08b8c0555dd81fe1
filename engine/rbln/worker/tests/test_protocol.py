import socket
import struct
import threading
import unittest

from stepserve_worker.protocol import MAX_FRAME, ProtocolError, Writer, decode, encode, read_message


class ProtocolTest(unittest.TestCase):
    def test_round_trip_over_a_socket(self) -> None:
        a, b = socket.socketpair()
        with a, b:
            w = Writer(a)
            threads = [threading.Thread(target=w.send, args=({"type": "pong", "id": i},)) for i in range(20)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            ids = sorted(read_message(b)["id"] for _ in range(20))
            self.assertEqual(list(range(20)), ids, "concurrent writers never interleave frames")

    def test_frame_layout(self) -> None:
        frame = encode({"type": "ping", "id": 7})
        (n,) = struct.unpack(">I", frame[:4])
        self.assertEqual(len(frame) - 4, n)

    def test_bad_messages(self) -> None:
        for body, want in [(b"{", "not JSON"), (b"[1]", "not a JSON object"), (b'{"id":1}', "no string 'type'"),
                           (b'{"type":"x","id":"7"}', "'id' is not an integer"), (b"\xff", "not JSON")]:
            with self.subTest(body=body), self.assertRaisesRegex(ProtocolError, want):
                decode(body)

    def test_oversize_length_prefix(self) -> None:
        a, b = socket.socketpair()
        with a, b:
            a.sendall(struct.pack(">I", MAX_FRAME + 1))
            with self.assertRaisesRegex(ProtocolError, "exceeds"):
                read_message(b)

    def test_eof(self) -> None:
        a, b = socket.socketpair()
        a.close()
        with b, self.assertRaises(EOFError):
            read_message(b)

    def test_nan_is_refused(self) -> None:
        with self.assertRaises(ValueError):
            encode({"type": "x", "v": float("nan")})


if __name__ == "__main__":
    unittest.main()
