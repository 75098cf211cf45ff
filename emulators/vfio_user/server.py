"""A vfio-user server for one model device on one unix socket, in threads of this process.

QEMU's `vfio-user-pci` connects, negotiates VERSION, asks for the device,
region and IRQ info (memfd BARs go back with the MMAP flag and their fd) and
then forwards every configuration and register access. One client at a time;
after an unplug the server takes the next connection (re-plug works).

Two faults live here rather than in the device: `die()` ends the server
outright (QEMU sees EOF; config reads then return ffff in the guest), and
`hang()` stops answering (each guest access stalls the vCPU for QEMU's
message timeout). `health()` tells a supervisor which of those happened.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import threading
import time
from pathlib import Path

from ..errors import InfrastructureError
from . import protocol as p
from .device import ModelDevice

ACCEPT_POLL_S = 0.2


class SocketInUse(InfrastructureError):
    """Another server already answers on the socket path; it is reported, not taken over."""


class ModelServer:
    def __init__(self, device: ModelDevice, socket_path: Path):
        self.device = device
        self.socket_path = Path(socket_path)
        self.state = "new"  # new, listening, connected, dead, stopped
        self.connections = 0
        self.busy_since: float | None = None
        self.last_error: str | None = None
        self._listener: socket.socket | None = None
        self._conn: socket.socket | None = None
        self._running = threading.Event()
        self._answering = threading.Event()
        self._answering.set()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> ModelServer:
        claim_socket_path(self.socket_path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.socket_path))
        except OSError as exc:
            listener.close()
            raise InfrastructureError(f"vfio-user server for {self.device.instance}: cannot listen on "
                                      f"{self.socket_path}: {exc}") from None
        listener.listen(1)
        listener.settimeout(ACCEPT_POLL_S)
        self._listener = listener
        self._running.set()
        self.state = "listening"
        self._thread = threading.Thread(target=self._serve, name=f"vfio-user-{self.device.instance}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Orderly end: close the sockets, join the thread, remove the socket file."""
        if self.state == "stopped":
            return
        self._running.clear()
        self._answering.set()
        self._close_sockets()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        try:
            self.socket_path.unlink()
        except FileNotFoundError:
            pass
        self.state = "stopped"
        self.device.close()

    def thread_id(self) -> int | None:
        """The native ID of the thread that answers QEMU; None before it starts or after it ends."""
        thread = self._thread
        return thread.native_id if thread is not None and thread.is_alive() else None

    # -- faults -------------------------------------------------------------------------------------
    def die(self) -> None:
        """The server is gone at once (as if its process was killed); the socket file stays."""
        self._running.clear()
        self._answering.set()
        self._close_sockets()
        self.state = "dead"

    def hang(self) -> None:
        """Stop answering: the next request is read and never answered until resume()."""
        self._answering.clear()

    def resume(self) -> None:
        self._answering.set()

    def health(self, hung_after_s: float) -> str:
        """'ok', 'dead' (server gone), 'hung' (a request unanswered for hung_after_s) or 'stopped'."""
        if self.state in ("dead", "stopped"):
            return self.state
        if self._thread is not None and not self._thread.is_alive():
            return "dead"
        since = self.busy_since
        if since is not None and time.monotonic() - since > hung_after_s:
            return "hung"
        return "ok"

    # -- serving ------------------------------------------------------------------------------------
    def _close_sockets(self) -> None:
        with self._lock:
            for sock in (self._conn, self._listener):
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    sock.close()
            self._conn = None
            self._listener = None

    def _serve(self) -> None:
        while self._running.is_set():
            listener = self._listener
            if listener is None:
                return
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            with self._lock:
                if not self._running.is_set():
                    conn.close()
                    return
                self._conn = conn
            self.connections += 1
            self.state = "connected"
            try:
                self._serve_connection(conn)
            except (p.PeerClosed, OSError):
                pass
            except p.MalformedMessage as exc:
                self.last_error = str(exc)
            finally:
                self.busy_since = None
                with self._lock:
                    if self._conn is conn:
                        self._conn = None
                conn.close()
                if self._running.is_set():
                    self.state = "listening"

    def _serve_connection(self, conn: socket.socket) -> None:
        while self._running.is_set():
            msg = p.receive(conn)
            self.busy_since = time.monotonic()
            self._answering.wait()
            if not self._running.is_set():
                for fd in msg.fds:
                    os.close(fd)
                return
            self._handle(conn, msg)
            self.busy_since = None

    def _handle(self, conn: socket.socket, msg: p.Message) -> None:
        handler = self.HANDLERS.get(msg.command)
        if handler is None:
            for fd in msg.fds:
                os.close(fd)
            if msg.wants_reply:
                p.reply_error(conn, msg, errno.ENOSYS)
            return
        try:
            handler(self, conn, msg)
        except (ValueError, KeyError) as exc:
            self.last_error = f"{msg.name}: {exc}"
            if msg.wants_reply:
                p.reply_error(conn, msg, errno.EINVAL)

    def _version(self, conn, msg) -> None:
        major, _minor, _caps = p.parse_version(msg.payload)
        if major != p.PROTOCOL_MAJOR:
            raise p.MalformedMessage(f"client speaks vfio-user {major}.x; this server speaks 0.x")
        caps = {"max_msg_fds": p.MAX_MESSAGE_FDS, "max_data_xfer_size": p.MAX_DATA_XFER}
        p.reply(conn, msg, p.version_payload(caps))

    def _dma(self, conn, msg) -> None:
        # The models do no DMA: acknowledge, and close guest-RAM fds so they are not pinned.
        for fd in msg.fds:
            os.close(fd)
        if msg.wants_reply:
            p.reply(conn, msg)

    def _device_info(self, conn, msg) -> None:
        flags = p.DEVICE_FLAGS_RESET | p.DEVICE_FLAGS_PCI
        p.reply(conn, msg, p.DEVICE_INFO.pack(p.DEVICE_INFO.size, flags, p.NUM_REGIONS, p.NUM_IRQS))

    def _region_info(self, conn, msg) -> None:
        _argsz, _flags, index, _cap, _size, _offset = p.REGION_INFO.unpack_from(msg.payload)
        flags, size, fd = self.device.region_info(index)
        payload = p.REGION_INFO.pack(p.REGION_INFO.size, flags, index, 0, size, 0)
        p.reply(conn, msg, payload, [fd] if fd is not None else None)

    def _irq_info(self, conn, msg) -> None:
        _argsz, _flags, index, _count = p.IRQ_INFO.unpack_from(msg.payload)
        # No interrupts yet: every index reports zero vectors (interrupt pin 0 in config space).
        p.reply(conn, msg, p.IRQ_INFO.pack(p.IRQ_INFO.size, p.IRQ_INFO_EVENTFD, index, 0))

    def _set_irqs(self, conn, msg) -> None:
        for fd in msg.fds:
            os.close(fd)
        if msg.wants_reply:
            p.reply(conn, msg)

    def _region_read(self, conn, msg) -> None:
        offset, region, count = p.REGION_ACCESS.unpack_from(msg.payload)
        if count > p.MAX_DATA_XFER:
            raise ValueError(f"read of {count} bytes exceeds max_data_xfer_size")
        data = self.device.region_read(region, offset, count)
        p.reply(conn, msg, p.REGION_ACCESS.pack(offset, region, count) + data)

    def _region_write(self, conn, msg) -> None:
        offset, region, count = p.REGION_ACCESS.unpack_from(msg.payload)
        data = msg.payload[p.REGION_ACCESS.size:p.REGION_ACCESS.size + count]
        if len(data) != count:
            raise ValueError(f"write says {count} bytes, carries {len(data)}")
        self.device.region_write(region, offset, data)
        if msg.wants_reply:  # posted writes (NO_REPLY) must never be answered
            p.reply(conn, msg, p.REGION_ACCESS.pack(offset, region, count))

    def _reset(self, conn, msg) -> None:
        self.device.device_reset()
        if msg.wants_reply:
            p.reply(conn, msg)

    HANDLERS = {
        p.VERSION: _version,
        p.DMA_MAP: _dma,
        p.DMA_UNMAP: _dma,
        p.DEVICE_GET_INFO: _device_info,
        p.DEVICE_GET_REGION_INFO: _region_info,
        p.DEVICE_GET_IRQ_INFO: _irq_info,
        p.DEVICE_SET_IRQS: _set_irqs,
        p.REGION_READ: _region_read,
        p.REGION_WRITE: _region_write,
        p.DEVICE_RESET: _reset,
    }


def claim_socket_path(path: Path) -> None:
    """Make `path` free to bind: a stale socket (nobody listening) goes; anything else is reported."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketInUse(f"{path} exists and is not a socket; remove it or choose another path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        path.unlink(missing_ok=True)  # stale: left by a server that died
        return
    except OSError as exc:
        raise SocketInUse(f"{path}: cannot tell whether a server listens there: {exc}") from None
    else:
        raise SocketInUse(f"{path}: another vfio-user server is already listening there; "
                          "stop it or use another path (not taken over)")
    finally:
        probe.close()
