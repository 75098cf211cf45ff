"""Transports: a unix socket server (several clients) and a virtio-serial port (one host).

Why one I/O thread with selectors and non-blocking fds: a peer that stops
reading must never block the runtime. Each client has a bounded outgoing
buffer; events past the bound are dropped and counted (the service reports
them), replies are never dropped, and a client over its bound is not read
from until it drains (backpressure instead of unbounded memory).
"""

from __future__ import annotations

import errno
import logging
import os
import select
import selectors
import socket
import threading
import time
from collections import deque
from typing import Protocol

from . import protocol

READ_CHUNK = 65536


_log = logging.getLogger("hilconform.runtime")


def log(msg: str) -> None:
    _log.info(msg)


class Session:
    """One client stream: its subscription and its bounded outgoing buffer (thread-safe)."""

    def __init__(self, sid: int, peer: str, max_bytes: int, wake):
        self.id = sid
        self.peer = peer
        self.max_bytes = max_bytes
        self.subscribed = False
        self.event_filter: frozenset[str] | None = None
        self.dropped_pending = 0
        self.dropped_total = 0
        self.closed = False
        # virtio-serial: a quick host reconnect can be invisible to the guest, so a
        # hello there also starts a fresh session (see docs/protocol.md)
        self.fresh_on_hello = False
        self._wake = wake
        self._lock = threading.Lock()
        self._out: deque[tuple[bytes, bool]] = deque()  # (line, is an event)
        self._head = 0  # bytes of _out[0] already written
        self._bytes = 0

    def send(self, message: dict, droppable: bool = False) -> bool:
        """Queue a message; a droppable one (an event) is dropped when the buffer is full."""
        return self.send_raw(protocol.encode(message), droppable)

    def send_raw(self, data: bytes, droppable: bool = False) -> bool:
        with self._lock:
            if self.closed:
                return False
            if droppable and self._bytes + len(data) > self.max_bytes:
                self.dropped_pending += 1
                self.dropped_total += 1
                return False
            self._out.append((data, droppable))
            self._bytes += len(data)
        self._wake()
        return True

    def output_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def has_room(self) -> bool:
        return self.output_bytes() < self.max_bytes

    def peek(self) -> bytes:
        with self._lock:
            return self._out[0][0][self._head :] if self._out else b""

    def consume(self, count: int) -> None:
        with self._lock:
            self._head += count
            self._bytes -= count
            if self._out and self._head >= len(self._out[0][0]):
                self._out.popleft()
                self._head = 0

    def discard_events(self) -> int:
        """Drop queued events (replies stay, and so does a partly written line)."""
        with self._lock:
            keep = [m for i, m in enumerate(self._out) if (i == 0 and self._head) or not m[1]]
            dropped = len(self._out) - len(keep)
            self._out = deque(keep)
            self._bytes = sum(len(m[0]) for m in keep) - (self._head if keep and self._head else 0)
            self.dropped_pending = 0
            return dropped

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._out.clear()
            self._bytes = 0


class LineHandler(Protocol):
    def open_session(self, session: Session) -> None: ...
    def close_session(self, session: Session) -> None: ...
    def handle_line(self, session: Session, line: bytes) -> None: ...
    def on_drained(self, session: Session) -> None: ...


class _Conn:
    """A readable/writable fd with its session and partial input."""

    def __init__(self, fd: int, session: Session, sock: socket.socket | None = None):
        self.fd = fd
        self.sock = sock
        self.session = session
        self.inbuf = bytearray()
        self.discarding = False  # inside an oversized line: drop until its newline
        self.mask = 0

    def write(self, data: bytes) -> int:
        return self.sock.send(data) if self.sock else os.write(self.fd, data)

    def read(self) -> bytes:
        return self.sock.recv(READ_CHUNK) if self.sock else os.read(self.fd, READ_CHUNK)


class Server:
    """Serves ``handler`` on "unix:/path" or "virtio-serial:/dev/..." from one I/O thread."""

    def __init__(
        self,
        handler: LineHandler,
        endpoint: str,
        max_outgoing_bytes: int = 1 << 20,
        max_line_bytes: int = protocol.MAX_LINE_BYTES,
    ):
        self.handler = handler
        self.kind, _, self.where = endpoint.partition(":")
        self.max_out = max_outgoing_bytes
        self.max_line = max_line_bytes
        self._sel = selectors.DefaultSelector()
        self._rpipe, self._wpipe = os.pipe()
        os.set_blocking(self._rpipe, False)
        os.set_blocking(self._wpipe, False)
        self._sel.register(self._rpipe, selectors.EVENT_READ, "wake")
        self._conns: dict[int, _Conn] = {}
        self._listener: socket.socket | None = None
        self._port_fd: int | None = None  # virtio-serial: kept open across host reconnects
        self._next_sid = 1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sessions_opened = 0
        self._flush_deadline = 1.0
        self._next_open = 0.0
        self._open_logged: int | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self.kind == "unix":
            self._listen_unix()
        elif self.kind != "virtio-serial":
            raise ValueError(f"unknown transport {self.kind!r}")
        self._thread = threading.Thread(target=self._run, name="io", daemon=True)
        self._thread.start()

    def stop(self, flush_s: float = 1.0) -> None:
        """Stop after trying (up to ``flush_s``) to write what is queued."""
        self._flush_deadline = flush_s
        self._stop.set()
        self.wake()
        if self._thread and self._thread is not threading.current_thread():
            self._thread.join(timeout=flush_s + 2)

    def wake(self) -> None:
        try:
            os.write(self._wpipe, b"x")
        except (BlockingIOError, OSError):
            pass

    def _listen_unix(self) -> None:
        os.makedirs(os.path.dirname(self.where) or ".", exist_ok=True)
        try:
            os.unlink(self.where)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.where)
        sock.listen(16)
        sock.setblocking(False)
        self._listener = sock
        self._sel.register(sock, selectors.EVENT_READ, "listen")
        log(f"listening on unix:{self.where}")

    # -- sessions --------------------------------------------------------------------------
    def _new_session(self, peer: str) -> Session:
        session = Session(self._next_sid, peer, self.max_out, self.wake)
        self._next_sid += 1
        self.sessions_opened += 1
        self.handler.open_session(session)
        return session

    def _add_conn(self, conn: _Conn) -> None:
        self._conns[conn.fd] = conn
        self._set_interest(conn, selectors.EVENT_READ)

    def _drop_conn(self, conn: _Conn, why: str) -> None:
        if self._conns.pop(conn.fd, None) is None:
            return
        self._set_interest(conn, 0)
        conn.session.close()
        self.handler.close_session(conn.session)
        log(f"session {conn.session.id} ({conn.session.peer}) ended: {why}")
        if conn.sock:
            conn.sock.close()
        # the virtio-serial fd stays open: the next host connection reuses it

    # -- the loop --------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.kind == "virtio-serial":
                    self._virtio_poll()
                for key, mask in self._sel.select(timeout=0.1):
                    if key.data == "wake":
                        self._drain_wake()
                    elif key.data == "listen":
                        self._accept()
                    else:
                        conn = key.data
                        if mask & selectors.EVENT_WRITE:
                            self._flush(conn)
                        if mask & selectors.EVENT_READ and conn.fd in self._conns:
                            self._read(conn)
                for conn in list(self._conns.values()):
                    self._service(conn)
            self._final_flush()
        except Exception as exc:  # the I/O thread must never die silently
            log(f"I/O thread failed: {exc!r}")
            raise
        finally:
            self._close_all()

    def _drain_wake(self) -> None:
        try:
            while os.read(self._rpipe, 4096):
                pass
        except BlockingIOError:
            pass

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log(f"accept failed: {exc}")
                return
            sock.setblocking(False)
            self._add_conn(_Conn(sock.fileno(), self._new_session(f"unix#{self._next_sid}"), sock))

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.read()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop_conn(conn, f"read failed: {exc.strerror or exc}")
            return
        if not data:
            self._drop_conn(conn, "peer closed" if conn.sock else "host disconnected")
            return
        self._take_input(conn, data)

    def _take_input(self, conn: _Conn, data: bytes) -> None:
        """Append input; an oversized line gets one error and is dropped up to its newline."""
        conn.inbuf += data
        while True:
            if conn.discarding:
                cut = conn.inbuf.find(b"\n")
                if cut < 0:
                    conn.inbuf.clear()
                    return
                del conn.inbuf[: cut + 1]
                conn.discarding = False
            if conn.inbuf.find(b"\n", 0, self.max_line + 1) >= 0 or len(conn.inbuf) <= self.max_line:
                return
            conn.session.send(
                protocol.error(
                    None, protocol.LINE_TOO_LONG, f"line longer than {self.max_line} bytes; dropped"
                )
            )
            conn.discarding = True

    def _service(self, conn: _Conn) -> None:
        """Handle complete lines while there is room to answer, flush, and set interest."""
        session = conn.session
        while conn.fd in self._conns and session.has_room():
            cut = conn.inbuf.find(b"\n")
            if cut < 0:
                break
            line = bytes(conn.inbuf[:cut]).rstrip(b"\r")
            del conn.inbuf[: cut + 1]
            if line.strip():
                self.handler.handle_line(session, line)
        if conn.fd not in self._conns:
            return
        self._flush(conn)
        if conn.fd not in self._conns:
            return
        want = 0
        if session.has_room() and b"\n" not in conn.inbuf:
            want |= selectors.EVENT_READ  # backpressure: a client over its bound is not read
        if session.output_bytes():
            want |= selectors.EVENT_WRITE
        self._set_interest(conn, want)

    def _set_interest(self, conn: _Conn, want: int) -> None:
        if want == conn.mask:
            return
        if conn.mask == 0:
            self._sel.register(conn.fd, want, conn)
        elif want == 0:
            self._sel.unregister(conn.fd)
        else:
            self._sel.modify(conn.fd, want, conn)
        conn.mask = want

    def _flush(self, conn: _Conn) -> None:
        session = conn.session
        had_drops = session.dropped_pending
        while True:
            chunk = session.peek()
            if not chunk:
                break
            try:
                sent = conn.write(chunk)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    break
                self._drop_conn(conn, f"write failed: {exc.strerror or exc}")
                return
            if sent <= 0:
                break
            session.consume(sent)
        if had_drops and session.output_bytes() <= session.max_bytes // 2:
            self.handler.on_drained(session)

    def _final_flush(self) -> None:
        deadline = self._flush_deadline
        end = _now() + deadline
        while _now() < end and any(c.session.output_bytes() for c in self._conns.values()):
            for conn in list(self._conns.values()):
                self._flush(conn)
            select.select([], [], [], 0.01)

    def _close_all(self) -> None:
        for conn in list(self._conns.values()):
            self._drop_conn(conn, "runtime stopping")
        if self._listener:
            self._listener.close()
            try:
                os.unlink(self.where)
            except OSError:
                pass
        if self._port_fd is not None:
            os.close(self._port_fd)
            self._port_fd = None

    # -- virtio-serial -----------------------------------------------------------------------
    def _virtio_poll(self) -> None:
        """Open the port if needed; start a fresh session when a host is connected.

        While no host is connected the port reports POLLHUP, so it is not in the
        selector (it would spin); it is polled here every loop turn instead.
        """
        if self._port_fd is None:
            now = _now()
            if now < self._next_open:
                return
            try:
                self._port_fd = os.open(self.where, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY)
                log(f"opened virtio-serial:{self.where}")
            except OSError as exc:
                if self._open_logged != exc.errno:
                    log(f"cannot open {self.where} ({exc.strerror}); retrying")
                    self._open_logged = exc.errno
                self._next_open = now + 0.5
                return
        if self._port_fd in self._conns:
            return
        poller = select.poll()
        poller.register(self._port_fd, select.POLLIN | select.POLLOUT)
        revents = dict(poller.poll(0)).get(self._port_fd, 0)
        if revents & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
            if revents & select.POLLNVAL:
                self._port_fd = None
            return
        session = self._new_session("virtio-serial host")
        session.fresh_on_hello = True
        self._add_conn(_Conn(self._port_fd, session))
        log("virtio-serial host connected: fresh session")


def _now() -> float:
    return time.monotonic()
