"""The control protocol served over a stream: stdin/stdout, or a unix socket's connections.

Why streams: the host reaches the node over an SSH session or a virtio-serial port, both
byte streams; a line in, a line out. Requests are served by a few worker threads, so a
plugin that is slow to answer Allocate does not hold up ``records`` (replies carry their
request's id); at most ``MAX_IN_FLIGHT`` requests of a stream are served at once, and
further lines wait unread (backpressure, not memory).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

from hilconform.runtime.deviceplugin.messages import (
    AllocateRequest,
    ContainerAllocateRequest,
    ContainerPreferredAllocationRequest,
    PreferredAllocationRequest,
    PreStartContainerRequest,
)

from . import control
from .control import ControlError, Request
from .device_manager import KubeletStandIn

_log = logging.getLogger("hilconform.kubelet_stand_in")

MAX_IN_FLIGHT = 8
WORKERS = 4
MAX_CLIENTS = 4
POLL_S = 0.5  # how often a waiting loop looks whether the stand-in stops


class Dispatcher:
    """Turns a checked request into the stand-in's answer (or a ControlError)."""

    def __init__(self, stand_in: KubeletStandIn):
        self.stand_in = stand_in

    def handle(self, req: Request):
        return getattr(self, f"_{req.method}")(req.params)

    def _records(self, params: dict) -> dict:
        store = self.stand_in.records
        records, more = store.since(
            params.get("since_seq", 0), params.get("max", control.DEFAULT_RECORDS_PER_REPLY)
        )
        return {
            "records": records,
            "more": more,
            "last_seq": store.stats()["last_seq"],
            "dropped": store.dropped(),
        }

    def _state(self, params: dict) -> dict:
        return self.stand_in.state()

    def _allocate(self, params: dict) -> dict:
        request = AllocateRequest([ContainerAllocateRequest(ids) for ids in params["containers"]])
        return self._call("allocate", params, request)

    def _preferred_allocation(self, params: dict) -> dict:
        request = PreferredAllocationRequest(
            [
                ContainerPreferredAllocationRequest(c["available"], c.get("must_include", []), c["size"])
                for c in params["containers"]
            ]
        )
        return self._call("preferred_allocation", params, request)

    def _prestart(self, params: dict) -> dict:
        return self._call("prestart", params, PreStartContainerRequest(params["devices"]))

    def _call(self, name: str, params: dict, request) -> dict:
        response = self.stand_in.call_plugin(
            name, params["resource"], request, params.get("timeout_s"), params.get("force", False)
        )
        return {"response": response.to_json()}

    def _restart_kubelet(self, params: dict) -> dict:
        return self.stand_in.restart()

    def _stop(self, params: dict) -> dict:
        return {"stopping": True}


class LineServer:
    """One stream: read request lines, answer each on the same stream."""

    def __init__(
        self,
        reader: BinaryIO,
        writer: BinaryIO,
        dispatcher: Dispatcher,
        on_stop: Callable[[], None],
        stopping: threading.Event,
    ):
        self.reader = reader
        self.writer = writer
        self.dispatcher = dispatcher
        self.on_stop = on_stop
        self.stopping = stopping
        self._write_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_IN_FLIGHT)

    def send(self, message: dict) -> None:
        line = control.encode(message)
        with self._write_lock:
            try:
                self.writer.write(line)
                self.writer.flush()
            except (OSError, ValueError) as exc:  # the host went away; its requests die with it
                _log.info("cannot write a control reply: %r", exc)

    def serve(self) -> None:
        """Until end of input or the stand-in stops."""
        with ThreadPoolExecutor(WORKERS, thread_name_prefix="control") as pool:
            while not self.stopping.is_set():
                line = self._read_line()
                if line is None:
                    break
                if not line.strip():
                    continue
                while not self._slots.acquire(timeout=POLL_S):
                    if self.stopping.is_set():
                        return
                pool.submit(self._serve_line, line)

    def _read_line(self) -> bytes | None:
        """The next line (None at end of input); an overlong one is answered and skipped."""
        limit = control.MAX_LINE_BYTES
        line = self.reader.readline(limit + 2)
        if not line:
            return None
        if line.endswith(b"\n") or len(line) <= limit:
            return line.rstrip(b"\r\n")
        self.send(control.error(None, control.LINE_TOO_LONG, f"line longer than {limit} bytes; dropped"))
        while line and not line.endswith(b"\n"):
            line = self.reader.readline(limit)
        return b"" if line else None

    def _serve_line(self, line: bytes) -> None:
        try:
            req = None
            try:
                req = control.decode_request(line)
                message = control.reply(req.id, self.dispatcher.handle(req))
            except ControlError as exc:
                req_id = req.id if req else control.request_id(line)
                message = control.error(req_id, exc.code, exc.message, exc.data)
            except Exception as exc:  # a bug must still answer the request
                _log.exception("control request failed")
                message = control.error(req.id if req else None, control.INTERNAL, f"{exc!r}"[:300])
            self.send(message)
            if req is not None and req.method == "stop" and "result" in message:
                self.on_stop()
        finally:
            self._slots.release()


class UnixControlServer:
    """Listen on a unix socket; each connection is a LineServer (at most MAX_CLIENTS at once)."""

    def __init__(
        self, path: str, dispatcher: Dispatcher, on_stop: Callable[[], None], stopping: threading.Event
    ):
        self.path = path
        self.dispatcher = dispatcher
        self.on_stop = on_stop
        self.stopping = stopping
        self._sock: socket.socket | None = None
        self._clients = threading.BoundedSemaphore(MAX_CLIENTS)

    def start(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path)
        sock.listen(MAX_CLIENTS)
        sock.settimeout(POLL_S)
        self._sock = sock
        threading.Thread(target=self._accept_loop, name="control-accept", daemon=True).start()

    def _accept_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            if not self._clients.acquire(blocking=False):
                conn.sendall(
                    control.encode(
                        control.error(
                            None, control.INVALID_REQUEST, f"at most {MAX_CLIENTS} control clients at once"
                        )
                    )
                )
                conn.close()
                continue
            threading.Thread(
                target=self._serve_client, args=(conn,), name="control-client", daemon=True
            ).start()

    def _serve_client(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(None)
            with conn, conn.makefile("rb") as reader, conn.makefile("wb") as writer:
                LineServer(reader, writer, self.dispatcher, self.on_stop, self.stopping).serve()
        except OSError as exc:
            _log.info("control client ended: %r", exc)
        finally:
            self._clients.release()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            try:
                os.unlink(self.path)
            except OSError:
                pass
