"""Transports: a unix socket server (several clients) and a virtio-serial port (one host).

Why one I/O thread with selectors and non-blocking fds: a peer that stops
reading must never block the runtime. Each client has a bounded outgoing
buffer; events past the bound are dropped and counted (the service reports
them), replies are never dropped, and a client over its bound is not read
from until it drains (backpressure instead of unbounded memory).

Why bounds on clients and on requests in flight: one client must not take
what the others need. A connection past ``max_clients`` gets one
TOO_MANY_CLIENTS line and is closed (the runtime keeps file descriptors for
its devices); a session with ``max_in_flight`` requests unanswered is not
read from until one completes; complete lines are served round-robin, one
per session per round. When accept itself fails for want of resources
(EMFILE, ...), the runtime stops listening for a short, growing interval
and logs once per episode instead of spinning.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import resource
import select
import selectors
import socket
import threading
import time
from collections import deque
from typing import Protocol

from . import protocol
from .own_resources import is_own_resource_error

READ_CHUNK = 65536
WRITE_CHUNK = 65536  # queued lines are written together, up to this many bytes per write
ROUNDS_PER_TURN = 4  # round-robin rounds (one line per session each) before the next select
ACCEPTS_PER_TURN = 64
ACCEPT_BACKOFF_FIRST_S = 0.05
ACCEPT_BACKOFF_MAX_S = 1.0
POLL_S = 0.1  # the loop's turn while something is polled (a virtio-serial port with no host)
IDLE_SELECT_S = 1.0  # the longest wait in select: wakes and fds end it sooner


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
        self.in_flight = 0  # requests handed to the handler and not answered yet
        self.dirty = True  # output queued or a request answered since the I/O thread last looked
        self._wake = wake
        self._lock = threading.Lock()
        self._out: deque[tuple[bytes, bool]] = deque()  # (line, is an event)
        self._head = 0  # bytes of _out[0] already written
        self._bytes = 0

    def send(self, message: dict, droppable: bool = False) -> bool:
        """Queue a message; a droppable one (an event) is dropped when the buffer is full."""
        return self.send_raw(protocol.encode(message), droppable)

    def begin_request(self) -> None:
        with self._lock:
            self.in_flight += 1

    def send_reply(self, message: dict) -> bool:
        """Queue the one reply (result or error) to a request the transport handed over."""
        with self._lock:
            self.in_flight = max(0, self.in_flight - 1)
        return self.send(message)

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
        self.dirty = True
        self._wake()
        return True

    def output_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def has_room(self) -> bool:
        return self.output_bytes() < self.max_bytes

    def send_events(self, lines: list[bytes]) -> int:
        """Queue event lines (as send_raw(droppable=True) each, under one lock); returns how many fit."""
        queued = 0
        with self._lock:
            if self.closed:
                return 0
            for data in lines:
                if self._bytes + len(data) > self.max_bytes:
                    self.dropped_pending += 1
                    self.dropped_total += 1
                    continue
                self._out.append((data, True))
                self._bytes += len(data)
                queued += 1
        if queued:
            self.dirty = True
            self._wake()
        return queued

    def peek(self) -> bytes:
        """The rest of the first queued line."""
        with self._lock:
            return self._out[0][0][self._head :] if self._out else b""

    def peek_many(self, limit: int = WRITE_CHUNK) -> bytes:
        """The queued lines from the first on, joined, up to ``limit`` bytes (at least one line)."""
        with self._lock:
            if not self._out:
                return b""
            parts = [self._out[0][0][self._head :]]
            size = len(parts[0])
            for data, _ in itertools.islice(self._out, 1, None):
                if size + len(data) > limit:
                    break
                parts.append(data)
                size += len(data)
            return parts[0] if len(parts) == 1 else b"".join(parts)

    def consume(self, count: int) -> None:
        """``count`` bytes were written: drop them from the front (they may span lines)."""
        with self._lock:
            self._bytes -= count
            while count and self._out:
                left = len(self._out[0][0]) - self._head
                if count < left:
                    self._head += count
                    return
                count -= left
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
        self.touched = True  # read from, written to or served this turn: settle it

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
        max_clients: int = 64,
        max_in_flight: int = 16,
        fd_reserve: int = 32,
    ):
        self.handler = handler
        self.kind, _, self.where = endpoint.partition(":")
        self.max_out = max_outgoing_bytes
        self.max_line = max_line_bytes
        self.max_clients = max_clients
        self.max_in_flight = max_in_flight
        # a client whose fd would be at or above this is refused: the rest stay for device checks
        soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.fd_ceiling = soft_limit - fd_reserve if soft_limit != resource.RLIM_INFINITY else 1 << 30
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
        self._woken = False  # a wake byte is in the pipe, not yet drained
        self._work_pending = False  # complete lines wait that may be served now: do not sleep in select
        self.clients_refused = 0
        self._refusing = False  # an episode of refusals past max_clients (logged once)
        self._accept_paused_until: float | None = None  # backing off after accept failed
        self._accept_backoff_s = 0.0
        self._accept_failures = 0  # in the current episode
        self._accept_failing_since = 0.0

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
        """Make the I/O thread look at the sessions; one pipe write per loop turn is enough."""
        if self._woken:
            return
        self._woken = True
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
        sock.listen(max(socket.SOMAXCONN, self.max_clients))  # simultaneous connects queue, not fail
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
                self._resume_accepting()
                for key, mask in self._sel.select(timeout=self._select_timeout()):
                    if key.data == "wake":
                        self._drain_wake()
                    elif key.data == "listen":
                        self._accept()
                    else:
                        conn = key.data
                        conn.touched = True
                        if mask & selectors.EVENT_WRITE:
                            self._flush(conn)
                        if mask & selectors.EVENT_READ and conn.fd in self._conns:
                            self._read(conn)
                self._serve_round_robin()
            self._final_flush()
        except Exception as exc:  # the I/O thread must never die silently
            log(f"I/O thread failed: {exc!r}")
            raise
        finally:
            self._close_all()

    def _drain_wake(self) -> None:
        """Empty the wake pipe, then let the next wake write again. In that order: cleared first, a
        wake between the clear and the read had its byte read here and left `_woken` set with the
        pipe empty, so every later wake was lost and the loop turned only on its select timeout
        (found when that timeout went from 0.1 s to 1 s). A wake during the read is not lost: its
        session was marked dirty before it, and dirty sessions settle after this."""
        try:
            while os.read(self._rpipe, 4096):
                pass
        except BlockingIOError:
            pass
        self._woken = False

    def _select_timeout(self) -> float:
        """No wait with work pending; a short one while something must be polled (accepting
        resumes, a virtio-serial port with no host reports POLLHUP so it is polled, not
        selected); else a long one: a wake (the pipe) or any fd ends it sooner. A 0.1 s turn
        while idle cost a TCG guest ~1-2% of its CPU (issue 17)."""
        if self._work_pending:
            return 0.0
        if self._accept_paused_until is not None:
            return max(0.0, min(POLL_S, self._accept_paused_until - _now()))
        if self.kind == "virtio-serial" and self._port_fd not in self._conns:
            return POLL_S
        return IDLE_SELECT_S

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_TURN):  # bounded: the clients already here are served too
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                self._accepting_again()
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                self._back_off_accepting(exc)
                return
            self._accepting_again()
            if len(self._conns) >= self.max_clients or sock.fileno() >= self.fd_ceiling:
                self._refuse(sock)
                continue
            if self._refusing:
                self._refusing = False
                log(f"accepting clients again ({self.clients_refused} refused so far)")
            sock.setblocking(False)
            self._add_conn(_Conn(sock.fileno(), self._new_session(f"unix#{self._next_sid}"), sock))

    def _refuse(self, sock: socket.socket) -> None:
        """One TOO_MANY_CLIENTS line (a fresh socket's buffer holds it), then close."""
        self.clients_refused += 1
        if not self._refusing:
            self._refusing = True
            log(
                f"refusing clients: {len(self._conns)} connected (max_clients {self.max_clients}, "
                f"file descriptors below {self.fd_ceiling} for clients)"
            )
        line = protocol.encode(
            protocol.error(
                None,
                protocol.TOO_MANY_CLIENTS,
                f"the runtime serves at most {self.max_clients} clients at a time; try again later",
                {"max_clients": self.max_clients},
            )
        )
        try:
            sock.setblocking(False)
            sock.send(line)
        except OSError:
            pass
        sock.close()

    def _back_off_accepting(self, exc: OSError) -> None:
        """Stop listening for a growing interval; log at the start of the episode only."""
        now = _now()
        if self._accept_failures == 0:
            self._accept_failing_since = now
            kind = "the runtime's own resources" if is_own_resource_error(exc) else "an error"
            log(
                f"accept failed ({kind}): {exc}; not accepting for up to {ACCEPT_BACKOFF_MAX_S:g} s "
                "at a time until it succeeds (logged once)"
            )
        self._accept_failures += 1
        self._accept_backoff_s = min(
            ACCEPT_BACKOFF_MAX_S, max(ACCEPT_BACKOFF_FIRST_S, self._accept_backoff_s * 2)
        )
        self._accept_paused_until = now + self._accept_backoff_s
        self._sel.unregister(self._listener)

    def _resume_accepting(self) -> None:
        if self._accept_paused_until is not None and _now() >= self._accept_paused_until:
            self._accept_paused_until = None
            self._sel.register(self._listener, selectors.EVENT_READ, "listen")

    def _accepting_again(self) -> None:
        if self._accept_failures:
            log(
                f"accept works again after {self._accept_failures} failed attempt(s) "
                f"over {_now() - self._accept_failing_since:.1f} s"
            )
            self._accept_failures = 0
            self._accept_backoff_s = 0.0

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
            if _first_line_fits(conn.inbuf, self.max_line):
                return
            conn.session.send(
                protocol.error(
                    None, protocol.LINE_TOO_LONG, f"line longer than {self.max_line} bytes; dropped"
                )
            )
            conn.discarding = True

    def _can_take(self, session: Session) -> bool:
        """Room to answer and a request slot free: else the session waits (backpressure)."""
        return session.has_room() and session.in_flight < self.max_in_flight

    def _serve_round_robin(self) -> None:
        """One complete line of each session per round, so a pipelining client cannot
        starve the others; then flush and set every session's interest."""
        conns = list(self._conns.values())
        for _ in range(ROUNDS_PER_TURN):
            conns = [c for c in conns if self._serve_one_line(c)]
            if not conns:
                break
        self._work_pending = False
        for conn in list(self._conns.values()):
            if conn.touched or conn.session.dirty:  # the others' interest is still right
                self._settle(conn)

    def _serve_one_line(self, conn: _Conn) -> bool:
        """Hand the next complete line to the handler; False when there is none to serve now."""
        cut = conn.inbuf.find(b"\n")
        if cut < 0 or conn.fd not in self._conns or not self._can_take(conn.session):
            return False
        line = bytes(conn.inbuf[:cut]).rstrip(b"\r")
        del conn.inbuf[: cut + 1]
        conn.touched = True
        if line.strip():
            conn.session.begin_request()
            self.handler.handle_line(conn.session, line)
        return True

    def _settle(self, conn: _Conn) -> None:
        """Flush, then read only from a session that may take more; write while output waits."""
        session = conn.session
        conn.touched = session.dirty = False  # before flushing: a send from now on marks it again
        self._flush(conn)
        if conn.fd not in self._conns:
            return
        want = 0
        if self._can_take(session):
            if b"\n" in conn.inbuf:
                self._work_pending = True
            else:
                want |= selectors.EVENT_READ
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
            chunk = session.peek_many()
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


def _first_line_fits(buf: bytearray, limit: int) -> bool:
    """Does the first line of ``buf``, without its LF or CR LF, fit ``limit`` bytes (or may it
    still, having no LF yet)?"""
    cut = buf.find(b"\n", 0, limit + 2)
    if cut >= 0:
        return cut <= limit or buf[limit] == 0x0D  # limit+1 bytes before the \n: the last is \r
    return len(buf) <= limit or (len(buf) == limit + 1 and buf[limit] == 0x0D)
