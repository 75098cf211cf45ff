"""A blocking line client for a runtime's unix socket (replies by id, events kept aside).

Why its own module: the latency probe process imports it without the test harness.
"""

from __future__ import annotations

import itertools
import socket
import time

from hilconform.runtime import protocol


def next_line(sock: socket.socket, buf: bytearray, deadline: float | None = None) -> bytes:
    """The next line (without its newline) from `sock`, buffering in `buf`; TimeoutError past the
    monotonic `deadline` (None: the socket's own timeout), ConnectionError when the peer closed."""
    while b"\n" not in buf:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no complete line from the runtime")
            sock.settimeout(left)
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("runtime closed the connection")
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


class LineClient:
    """One blocking connection: send requests, read replies by id (events are kept aside)."""

    def __init__(self, path: str, timeout: float = 10.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
        except OSError:
            self.sock.close()
            raise
        self.timeout = timeout
        self.buf = bytearray()
        self.events: list[dict] = []
        self.replies: dict = {}
        self._ids = itertools.count(1)

    def __enter__(self) -> LineClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, method: str, params: dict | None = None) -> int:
        req_id = next(self._ids)
        self.sock.sendall(protocol.encode(protocol.request(req_id, method, params)))
        return req_id

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_message(self, timeout: float | None = None) -> dict:
        """The next message; raises TimeoutError, or ConnectionError when the runtime closed."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        return protocol.decode_message(next_line(self.sock, self.buf, deadline))

    def wait_reply(self, req_id, timeout: float | None = None) -> dict:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while req_id not in self.replies:
            msg = self.read_message(max(0.0, deadline - time.monotonic()))
            if msg["kind"] == "event":
                self.events.append(msg)
            else:
                self.replies[msg["id"]] = msg
        return self.replies.pop(req_id)

    def call(self, method: str, params: dict | None = None, timeout: float | None = None) -> dict:
        return self.wait_reply(self.send(method, params), timeout)

    def call_raw(self, line: bytes, req_id, timeout: float | None = None) -> dict:
        self.send_raw(line)
        return self.wait_reply(req_id, timeout)

    def ok(self, method: str, params: dict | None = None, timeout: float | None = None):
        reply = self.call(method, params, timeout)
        assert "result" in reply, reply
        return reply["result"]
